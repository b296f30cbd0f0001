//! The signals `idem serve` answers: SIGHUP reloads, SIGINT and SIGTERM stop.

use std::sync::Arc;

use super::Reloader;
use crate::listener::Tls;

/// On every SIGHUP, reloads (see [`Reloader::reload`]): each listener's certificate
/// and key read again, then the configuration, when the gateway is
/// [reloadable](super::Gateway::reloadable). SIGHUP never ends the process, as it would
/// by default.
pub(super) async fn reload_on_sighup(hangup: Hangup, reloader: Arc<Reloader>) {
    #[cfg(unix)]
    {
        let Some(mut hup) = hangup.0 else {
            return;
        };
        while hup.recv().await.is_some() {
            // Logged by the reloader, whatever came of it.
            let _ = reloader.reload().await;
        }
    }
    #[cfg(not(unix))]
    drop((hangup, reloader));
}

/// Reads each listener's certificate and key again: new connections get the new pair,
/// open ones keep theirs, and a pair that cannot be used is logged and leaves the one
/// in force.
pub(super) fn reload_tls(tls: &[(&'static str, Tls)]) {
    for (listener, tls) in tls {
        let files = tls.files();
        match tls.reload() {
            Ok(()) => tracing::info!(
                listener,
                cert = %files.cert.display(),
                "TLS certificate reloaded; new connections use it"
            ),
            Err(e) => tracing::error!(
                listener,
                error = %e,
                "the new TLS certificate cannot be used; keeping the one in force"
            ),
        }
    }
}

/// SIGHUP, listened for from the moment the gateway is bound: a SIGHUP that comes
/// before [`Gateway::run`](super::Gateway::run) starts reloading is not the default
/// action's end of the process.
pub(super) struct Hangup(#[cfg(unix)] Option<tokio::signal::unix::Signal>);

impl Hangup {
    /// Listens for SIGHUP from now on.
    pub(super) fn listen() -> Hangup {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::hangup()) {
                Ok(s) => Hangup(Some(s)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGHUP; nothing will be reloaded on it");
                    Hangup(None)
                }
            }
        }
        #[cfg(not(unix))]
        Hangup()
    }
}

/// Resolves on SIGINT or SIGTERM. Both are listened for from the call on, before the
/// future is first polled, so that a signal sent as soon as the gateway says it is
/// listening stops it as it should, rather than as the default action does.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (mut int, mut term) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let int = async {
                match &mut int {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending::<()>().await,
                }
            };
            let term = async {
                match &mut term {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = int => tracing::info!("SIGINT received"),
                () = term => tracing::info!("SIGTERM received"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("SIGINT received");
        }
    }
}
