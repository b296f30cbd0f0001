//! The signals `idem serve` answers: SIGHUP reloads, SIGINT and SIGTERM stop.

use std::sync::Arc;

use super::Reloader;
use crate::listener::Tls;

/// On every SIGHUP, reads each listener's certificate and key again (new connections
/// get the new pair, open ones keep theirs, and a pair that cannot be used is logged
/// and leaves the one in force), then the configuration, when the gateway is
/// [reloadable](Gateway::reloadable) (see [`Reloader`]). SIGHUP never ends the process,
/// as it would by default.
pub(super) async fn reload_on_sighup(tls: Vec<(&'static str, Tls)>, reloader: Arc<Reloader>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; nothing will be reloaded on it");
                return;
            }
        };
        while hup.recv().await.is_some() {
            for (listener, tls) in &tls {
                let files = tls.files();
                match tls.reload() {
                    Ok(()) => tracing::info!(
                        listener,
                        cert = %files.cert.display(),
                        "SIGHUP: TLS certificate reloaded; new connections use it"
                    ),
                    Err(e) => tracing::error!(
                        listener,
                        error = %e,
                        "SIGHUP: the new TLS certificate cannot be used; keeping the one in force"
                    ),
                }
            }
            // Logged by the reloader, whatever came of it.
            let _ = reloader.reload().await;
        }
    }
    #[cfg(not(unix))]
    drop((tls, reloader));
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}
