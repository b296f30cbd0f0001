//! How a waiting duplicate hears of another instance's completion (SPEC S15) on one
//! Redis server: the complete and release scripts `PUBLISH` the scope's digest on the
//! store's channel (`PREFIX` + `changes`), and one subscriber connection per store
//! feeds its [`ChangeHub`](idem_core::ChangeHub) through a [`ChangeFeed`], which
//! reconnects it.
//!
//! On a Redis Cluster nothing is published: waiters poll (see the crate docs).
//! While the subscriber is disconnected the hub is not live: its watches fire once
//! (their waiters reserve again) and new ones poll, until it has subscribed again.

use futures_util::StreamExt;
use idem_core::{ChangeFeed, FeedSession};
use redis::{Client, RedisError};

/// The channel a store with key prefix `prefix` publishes on.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}changes")
}

/// The subscriber of one store (and its clones); stops when the last clone drops or
/// the store closes.
pub(crate) struct Subscriber {
    pub(crate) feed: ChangeFeed,
    pub(crate) channel: String,
}

impl Subscriber {
    /// Subscribes to `channel` through `client`, in the background. Call inside a
    /// tokio runtime.
    pub(crate) fn spawn(client: Client, channel: String) -> Subscriber {
        let on = channel.clone();
        let feed = ChangeFeed::spawn("the Redis store's subscriber connection", move |session| {
            serve(client.clone(), on.clone(), session)
        });
        Subscriber { feed, channel }
    }
}

/// One session: connect, subscribe, and pass the digests published on `channel` on
/// until the connection closes.
async fn serve(client: Client, channel: String, session: FeedSession) -> Result<(), RedisError> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(&channel).await?;
    session.listening();
    let mut messages = pubsub.into_on_message();
    while let Some(message) = messages.next().await {
        if let Ok(digest) = std::str::from_utf8(message.get_payload_bytes()) {
            session.changed(digest);
        }
    }
    Ok(())
}
