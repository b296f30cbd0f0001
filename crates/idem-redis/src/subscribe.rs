//! How a waiting duplicate hears of another instance's completion (SPEC S15) on one
//! Redis server: the complete and release scripts `PUBLISH` the scope's digest on the
//! store's channel (`PREFIX` + `changes`), and one subscriber connection per store
//! feeds its [`ChangeHub`].
//!
//! On a Redis Cluster nothing is published: waiters poll (see the crate docs).
//! While the subscriber is disconnected the hub is not live: its watches fire once
//! (their waiters reserve again) and new ones poll, until it has subscribed again.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idem_core::ChangeHub;
use redis::Client;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The longest pause between attempts to subscribe again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The channel a store with key prefix `prefix` publishes on.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}changes")
}

/// The subscriber task of one store (and its clones); stops when the last clone drops
/// or the store closes.
pub(crate) struct Subscriber {
    pub(crate) hub: ChangeHub,
    pub(crate) channel: String,
    task: JoinHandle<()>,
    listening: Arc<Notify>,
}

impl Subscriber {
    /// Subscribes to `channel` through `client`, in the background. Call inside a
    /// tokio runtime.
    pub(crate) fn spawn(client: Client, channel: String) -> Subscriber {
        let hub = ChangeHub::new();
        hub.set_live(false);
        let listening = Arc::new(Notify::new());
        let task = tokio::spawn(subscribe(
            client,
            channel.clone(),
            hub.clone(),
            listening.clone(),
        ));
        Subscriber {
            hub,
            channel,
            task,
            listening,
        }
    }

    /// Waits up to `within` for the subscription; whether it is up.
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

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn subscribe(client: Client, channel: String, hub: ChangeHub, listening: Arc<Notify>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    backoff = Duration::from_millis(50);
                    hub.set_live(true);
                    listening.notify_waiters();
                    let mut messages = pubsub.into_on_message();
                    while let Some(message) = messages.next().await {
                        if let Ok(digest) = std::str::from_utf8(message.get_payload_bytes()) {
                            hub.notify_digest(digest);
                        }
                    }
                    tracing::warn!(
                        "the Redis store's subscriber connection closed; waiting duplicates \
                         poll until it is back"
                    );
                }
                Err(e) => tracing::debug!(error = %e, "the Redis store cannot subscribe yet"),
            },
            Err(e) => tracing::debug!(error = %e, "the Redis store cannot subscribe yet"),
        }
        hub.set_live(false);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
