//! What can go wrong while staging or relaying a message.

/// An outbox error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The SQL database failed or refused a statement. Inside
    /// [`Outbox::stage`](crate::Outbox::stage) the caller's transaction should be rolled back; in the
    /// relay, nothing was marked and the messages are tried again.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    #[error("outbox database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The broker could not be reached or failed.
    #[error("message broker error: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A message, table or setting the outbox will not take.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid (`message id`, `table name`, `destination`, ...).
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl Error {
    /// Wraps a broker error.
    pub fn broker(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
        Error::Broker(e.into())
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Error {
        Error::Invalid {
            what,
            reason: reason.into(),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
