//! The `Outbox` trait both SQL backends implement.

use std::future::Future;
use std::time::Duration;

use crate::{Message, ParkedMessage, Result, StagedMessage};

/// What the relay decided for one claimed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// The broker confirmed it: mark it published.
    Published,
    /// Publishing failed for now: count the attempt, note the error, try again no
    /// sooner than `after`.
    Retry {
        /// The broker's or the client's error.
        error: String,
        /// The backoff before the next attempt.
        after: Duration,
    },
    /// The broker refused it for good (or its attempts ran out): park it.
    Park {
        /// Why, for the person who looks at parked messages.
        error: String,
    },
    /// Not tried in this batch (an earlier message of its ordering key failed): leave
    /// it as it is.
    Untouched,
}

/// The outbox table's state, as [`Outbox::stats`] reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Messages staged (and committed) but not yet published, parked excluded.
    pub unpublished: u64,
    /// Parked messages.
    pub parked: u64,
    /// Published messages not yet purged.
    pub published: u64,
    /// The age of the oldest unpublished message; zero when there is none.
    pub oldest_unpublished_age: Duration,
}

/// A transactional outbox: [`stage`](Outbox::stage) writes a message into the outbox
/// table inside the caller's own transaction, so that the business rows and the
/// message commit or roll back together; a [`Relay`](crate::Relay) publishes what
/// committed, and marks it published only after the broker confirmed it.
///
/// The methods below `stage` are what the relay and an operator use.
pub trait Outbox: Clone + Send + Sync + 'static {
    /// The caller's transaction (`sqlx::Transaction<'static, Sqlite>` or `Postgres`).
    type Tx: Send;
    /// A claimed batch: for PostgreSQL, the transaction that holds the claimed rows'
    /// locks until [`settle`](Outbox::settle).
    type Batch: Send;
    /// What a relay waits on for new messages: a `LISTEN`ing connection for
    /// PostgreSQL, nothing for SQLite.
    type Listener: Send;

    /// Writes `message` into the outbox table inside `tx`. Returns `false` when a
    /// message with this id is in the table already (it is not staged twice).
    fn stage(
        &self,
        tx: &mut Self::Tx,
        message: &Message,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Claims up to `limit` messages that are due, in staging order, at most the ones
    /// whose earlier messages of the same ordering key are all published, parked, or in
    /// this batch. `relay` names the claiming relay (SQLite lets one relay per file
    /// claim: another gets an empty batch while the first one's lease lives).
    fn claim(
        &self,
        relay: &str,
        limit: usize,
    ) -> impl Future<Output = Result<(Self::Batch, Vec<StagedMessage>)>> + Send;

    /// Records what happened to each claimed message (by `seq`) and releases the
    /// batch.
    fn settle(
        &self,
        batch: Self::Batch,
        outcomes: Vec<(i64, Settlement)>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Opens what [`wait_for_work`](Outbox::wait_for_work) waits on.
    fn listen(&self) -> impl Future<Output = Result<Self::Listener>> + Send;

    /// Waits until a message may have been committed (PostgreSQL: a notification sent
    /// by the staging transaction's commit), or `timeout`, the poll fallback.
    fn wait_for_work(
        &self,
        listener: &mut Self::Listener,
        timeout: Duration,
    ) -> impl Future<Output = ()> + Send;

    /// Reads the table's counts and the oldest unpublished message's age.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats>> + Send;

    /// Deletes at most `limit` messages published longer than `retention` ago; returns
    /// how many.
    fn purge_published(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<usize>> + Send;

    /// Up to `limit` parked messages, oldest first.
    fn parked(&self, limit: usize) -> impl Future<Output = Result<Vec<ParkedMessage>>> + Send;

    /// Puts a parked message back in line (attempts reset). Returns whether it was
    /// parked.
    fn requeue(&self, id: &str) -> impl Future<Output = Result<bool>> + Send;
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
