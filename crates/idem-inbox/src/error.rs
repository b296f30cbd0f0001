//! What can go wrong while de-duplicating a message.

use std::time::Duration;

/// An inbox error. The consumer adapters settle every variant the same way: the message
/// is not acked (it is nak'ed with a delay) so that the broker redelivers it, and the
/// redelivery is de-duplicated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The SQL database failed or refused a statement; the transaction was rolled back,
    /// so neither the effects nor the processed-message row were written.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    #[error("inbox database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Redis failed or refused a command.
    #[cfg(feature = "redis")]
    #[error("inbox redis error: {0}")]
    Redis(#[from] redis::RedisError),
    /// The message broker failed (fetching, acking, reading stream or consumer state).
    #[error("message broker error: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Another consumer holds this message's in-flight marker (Redis inbox only, whose
    /// marker is not a database transaction that a duplicate could wait on). Retry
    /// after `retry_after`.
    #[error("message is being processed by another consumer; retry in {retry_after:?}")]
    InFlight {
        /// How long the other consumer's marker still lives.
        retry_after: Duration,
    },
    /// A message id or consumer name that the inbox will not store.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid (`message id`, `consumer name`, `table name`).
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The caller's effects failed; the transaction was rolled back.
    #[error("message handler failed: {0}")]
    Handler(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// Wraps an error of the caller's effects.
    pub fn handler(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::Handler(e.into())
    }

    /// Wraps a broker error.
    pub fn broker(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::Broker(e.into())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
