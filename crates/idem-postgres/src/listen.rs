//! How a waiting duplicate hears of another instance's completion (SPEC S15): one
//! dedicated `LISTEN` connection per store, outside the store's pool, feeding its
//! [`ChangeHub`]. The table's triggers (migration 3) `NOTIFY` on every completion or
//! release of an in-progress record.
//!
//! While the connection is down the hub is not live: its watches fire once (their
//! waiters reserve again) and new ones poll, until the connection is back and listening.

use std::sync::Arc;
use std::time::Duration;

use idem_core::ChangeHub;
use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::schema::NOTIFY_CHANNEL;

/// The longest pause between attempts to reconnect the listener.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The listener task of one store (and its clones); stops when the last clone drops
/// or the store closes.
pub(crate) struct Listener {
    pub(crate) hub: ChangeHub,
    task: JoinHandle<()>,
    /// Signalled each time the listener starts listening.
    listening: Arc<Notify>,
}

impl Listener {
    /// Starts listening for `table`'s notifications on a connection of its own, made
    /// with `pool`'s settings. Call inside a tokio runtime.
    pub(crate) fn spawn(pool: &PgPool, table: &str) -> Listener {
        let hub = ChangeHub::new();
        hub.set_live(false);
        let listening = Arc::new(Notify::new());
        // A pool of one, for the listener's reconnections: the store's pool keeps all
        // of its connections for operations.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with((*pool.connect_options()).clone());
        let prefix = format!("{table} ");
        let task = tokio::spawn(listen(own, prefix, hub.clone(), listening.clone()));
        Listener {
            hub,
            task,
            listening,
        }
    }

    /// Waits up to `within` for the listener to listen; whether it does.
    pub(crate) async fn ready(&self, within: Duration) -> bool {
        let notified = self.listening.notified();
        if self.hub.is_live() {
            return true;
        }
        tokio::time::timeout(within, notified).await.is_ok() || self.hub.is_live()
    }

    /// Stops listening; waiters poll from now on.
    pub(crate) fn stop(&self) {
        self.task.abort();
        self.hub.set_live(false);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn listen(pool: PgPool, prefix: String, hub: ChangeHub, listening: Arc<Notify>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match connect(&pool).await {
            Ok(mut listener) => {
                backoff = Duration::from_millis(50);
                hub.set_live(true);
                listening.notify_waiters();
                loop {
                    match listener.try_recv().await {
                        Ok(Some(notification)) => {
                            if let Some(digest) = notification.payload().strip_prefix(&prefix) {
                                hub.notify_digest(digest);
                            }
                        }
                        // The connection broke and was made again: what was sent
                        // meanwhile is lost, so every waiter looks again.
                        Ok(None) => {
                            hub.set_live(false);
                            hub.set_live(true);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "the PostgreSQL store's LISTEN connection failed; waiting duplicates poll until it is back");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "the PostgreSQL store cannot LISTEN yet");
            }
        }
        hub.set_live(false);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}
