//! The `Inbox` trait every backend implements (SPEC S12).

use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::retention::{PurgeConfig, RetentionWarning, check_retention};
use crate::{Error, Result};

/// The longest message id or consumer name an inbox stores, in bytes. Broker ids are
/// UUIDs or short strings; the bound keeps the unique index small.
pub const MAX_ID_LEN: usize = 512;

/// What [`Inbox::process`] did with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a duplicate must still be acked"]
pub enum Outcome<T> {
    /// First delivery: the effects ran and were committed together with the
    /// processed-message row. Ack the message.
    Processed(T),
    /// The message was processed before: the effects were not run. Ack the message so
    /// the broker stops redelivering it.
    Duplicate,
}

impl<T> Outcome<T> {
    /// Whether this was a duplicate.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }

    /// The effects' value, or `None` for a duplicate.
    pub fn processed(self) -> Option<T> {
        match self {
            Outcome::Processed(t) => Some(t),
            Outcome::Duplicate => None,
        }
    }
}

/// A processed-message store for one consumer: it runs a message's effects at most once
/// per message id, however often the broker delivers it.
///
/// The SQL inboxes ([`SqliteInbox`](crate::SqliteInbox), [`PgInbox`](crate::PgInbox))
/// insert `(consumer, message_id)` and run the effects in one transaction, so a message
/// is either processed and recorded, or neither; a duplicate insert means the effects
/// are skipped. The Redis inbox ([`RedisInbox`](crate::RedisInbox)) has no transaction
/// shared with the effects, and its guarantee is weaker (see its docs).
pub trait Inbox: Send + Sync + 'static {
    /// What the effects receive: the open transaction for the SQL inboxes, `()` for
    /// Redis.
    type Tx: Send;

    /// The consumer name: message ids are unique per consumer.
    fn consumer(&self) -> &str;

    /// How long processed-message rows are kept before [`Inbox::purge_expired`] may
    /// delete them.
    fn retention(&self) -> Duration;

    /// Runs `effects` unless `message_id` was processed before.
    ///
    /// Returns [`Outcome::Processed`] with the effects' value when they ran and
    /// committed, [`Outcome::Duplicate`] when the message was already processed (the
    /// effects were not called). An error from the effects (or the inbox) rolls
    /// everything back and is returned, so the message should be redelivered.
    ///
    /// Concurrent deliveries of one message id never both run their effects to commit:
    /// in SQL the second insert waits on the first transaction and sees its outcome.
    fn process<T, E, F>(
        &self,
        message_id: &str,
        effects: F,
    ) -> impl Future<Output = Result<Outcome<T>, E>> + Send
    where
        T: Send,
        E: From<Error> + Send,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<T, E>> + Send;

    /// Whether `message_id` is recorded as processed (whatever its age).
    fn contains(&self, message_id: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Deletes at most `limit` rows older than the retention; returns how many.
    fn purge_expired(&self, limit: usize) -> impl Future<Output = Result<usize>> + Send;

    /// Purges in batches of `config.batch` until a batch comes back short or
    /// `config.max_batches` ran, so one purge never holds the table for long. Returns
    /// how many rows were deleted.
    fn purge(&self, config: PurgeConfig) -> impl Future<Output = Result<usize>> + Send {
        async move {
            let mut total = 0;
            for _ in 0..config.max_batches.max(1) {
                let n = self.purge_expired(config.batch).await?;
                total += n;
                if n < config.batch {
                    break;
                }
            }
            Ok(total)
        }
    }

    /// Warns (and logs) when this inbox forgets messages sooner than the broker may
    /// deliver them again: see [`check_retention`].
    fn check_retention(&self, broker_window: Duration) -> Option<RetentionWarning> {
        check_retention(self.consumer(), self.retention(), broker_window)
    }
}

/// Checks a message id or consumer name: 1 to [`MAX_ID_LEN`] bytes, no NUL (which
/// PostgreSQL text cannot hold).
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "nats"
    )),
    allow(dead_code)
)]
pub(crate) fn validate_id(what: &'static str, id: &str) -> Result<()> {
    let reason = if id.is_empty() {
        "empty".to_owned()
    } else if id.len() > MAX_ID_LEN {
        format!("{} bytes, more than {MAX_ID_LEN}", id.len())
    } else if id.contains('\0') {
        "contains NUL".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::Invalid { what, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_bounded_and_nul_free() {
        assert!(validate_id("message id", "8e03978e-40d5").is_ok());
        assert!(validate_id("message id", &"a".repeat(MAX_ID_LEN)).is_ok());
        for bad in ["", "a\0b", &"a".repeat(MAX_ID_LEN + 1)] {
            assert!(matches!(
                validate_id("message id", bad),
                Err(Error::Invalid {
                    what: "message id",
                    ..
                })
            ));
        }
    }

    #[test]
    fn outcome_accessors() {
        assert_eq!(Outcome::Processed(3).processed(), Some(3));
        assert!(Outcome::<()>::Duplicate.is_duplicate());
        assert_eq!(Outcome::<u8>::Duplicate.processed(), None);
    }
}
