//! The broker side of the relay: a publisher that reports, per message, whether the
//! broker confirmed it.

use std::future::Future;

/// Why a publish was not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The broker may take it later (down, timed out, connection lost, a nack): the
    /// relay tries again after a backoff.
    #[error("publish failed for now: {0}")]
    Transient(String),
    /// The broker refuses it for good (too large, no such stream or exchange, nothing
    /// routes it): the relay parks it with this reason instead of blocking the rest.
    #[error("the broker refuses this message: {0}")]
    Refused(String),
}

/// A broker client the [`Relay`](crate::Relay) publishes through.
///
/// [`publish_all`](Publish::publish_all) sends every message it is given (they have
/// distinct ordering keys, so they may be in flight together) and waits for each one's
/// confirmation; it returns one result per message, in order. `Ok` must mean the
/// broker has the message durably: the relay marks it published and never sends it
/// again.
pub trait Publish: Send + Sync + 'static {
    /// Publishes `messages` and waits for the broker's confirmations.
    fn publish_all<'a>(
        &'a self,
        messages: &'a [&'a crate::Message],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send + 'a;
}
