//! The `Store` trait every backend implements (SPEC S10).

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest, Scope, StoredResponse, Watch,
};

/// What can go wrong in a store. Middleware maps every variant but `Fenced` and
/// `Sealed` to a fail-closed 503 with `Retry-After` (SPEC S10).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's fencing token is not the record's: its lease was taken over, or the
    /// record was released, expired or purged. The caller must not write.
    #[error("the lease is no longer held: the record was taken over, released or expired")]
    Fenced,
    /// The store cannot be reached or refused the operation.
    #[error("the idempotency store is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A bounded store is full of records it may not evict (in-progress ones).
    #[error("the idempotency store is full")]
    Full,
    /// A stored record could not be decoded.
    #[error("a stored record is corrupt: {0}")]
    Corrupt(String),
    /// A sealed answer could not be opened (SPEC S17): it names a key the ring lacks,
    /// or its bytes, status or scope are not the ones it was sealed with. The operation
    /// ran; middleware answers 500 `replay-unavailable` and never executes it again.
    #[error("a sealed record cannot be opened: {0}")]
    Sealed(String),
    /// A [`ListCursor`](crate::ListCursor) given to [`Store::list`] is not one this store
    /// handed out. Nothing was read.
    #[error("the listing cursor {0:?} is not one this store handed out")]
    InvalidCursor(String),
}

impl StoreError {
    /// Wraps any error as [`StoreError::Unavailable`].
    pub fn unavailable(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError::Unavailable(e.into())
    }

    /// A short, stable name of the variant (`fenced`, `unavailable`, `full`, `corrupt`,
    /// `sealed`, `invalid_cursor`), for metric labels and logs.
    pub fn label(&self) -> &'static str {
        match self {
            StoreError::Fenced => "fenced",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Full => "full",
            StoreError::Corrupt(_) => "corrupt",
            StoreError::Sealed(_) => "sealed",
            StoreError::InvalidCursor(_) => "invalid_cursor",
        }
    }
}

/// `Result` with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Whether a [`StoreMetric`] only grows or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Counts since the store opened; never decreases.
    Counter,
    /// A level now: a queue's depth, connections open.
    Gauge,
}

/// A figure a store keeps about itself (its write queue, its transactions, its
/// connections), for a metrics endpoint such as the gateway's `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreMetric {
    /// A Prometheus metric name, `idem_<store>_…`; counters end in `_total`.
    pub name: &'static str,
    /// One line on what it measures.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: MetricKind,
    /// Its value now.
    pub value: u64,
}

impl StoreMetric {
    /// A counter.
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> StoreMetric {
        StoreMetric {
            name,
            help,
            kind: MetricKind::Counter,
            value,
        }
    }

    /// A gauge.
    pub fn gauge(name: &'static str, help: &'static str, value: u64) -> StoreMetric {
        StoreMetric {
            name,
            help,
            kind: MetricKind::Gauge,
            value,
        }
    }
}

/// A place records live. Every implementation passes the contract suite in
/// `idem_core::testing` (feature `testing`).
///
/// Stores read the current time from their own [`Clock`](crate::Clock), injected at
/// construction, so tests control leases and expiry without sleeping.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Atomically reserves the scope (SPEC S5 stage 1).
    ///
    /// When no live record exists (none, or expired) the store inserts an in-progress
    /// record with a new fencing token and returns [`Reservation::Acquired`]; when the
    /// record is in progress with a lapsed lease and the same fingerprint, it takes it
    /// over atomically as attempt n+1. Otherwise it returns what
    /// [`decide`](crate::decide) says of the existing record. Of any number of
    /// concurrent callers, at most one acquires.
    async fn reserve(&self, request: &ReserveRequest) -> Result<Reservation>;

    /// Records the response and marks the record completed in one write (stages 3–4).
    ///
    /// Fails with [`StoreError::Fenced`] unless `lease` is the current attempt's.
    /// Completing again with the same lease succeeds and keeps the first response, so a
    /// handler that completed inside its own transaction (SPEC S9) and the middleware
    /// after it do not conflict.
    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()>;

    /// Extends the lease to `now + lease_for` while the attempt still runs (SPEC S7).
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()>;

    /// Deletes the in-progress record so the key may execute again (SPEC S6).
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Records `reason` against the in-progress record `lease` holds, which its attempt
    /// leaves in progress without an answer it could record (an upstream that sent no
    /// answer by the deadline, or broke the connection, after the request was sent): a
    /// listing of ambiguous records then names the reason
    /// ([`Record::in_progress_ambiguity`]) instead of finding the record only once its
    /// lease lapses, as [`Ambiguity::Orphaned`](crate::Ambiguity::Orphaned). The lease is
    /// left as it is; a takeover clears the reason.
    ///
    /// Fenced as [`complete`](Self::complete) is: fails with [`StoreError::Fenced`]
    /// unless `lease` is the current attempt's and the record is in progress. (No
    /// default: a wrapper that forgot to pass it on would lose the reason unseen.)
    async fn mark_ambiguous(&self, lease: &Lease, reason: crate::Ambiguity) -> Result<()>;

    /// The record for a scope, expired or not.
    async fn get(&self, scope: &Scope) -> Result<Option<Record>>;

    /// Deletes a record whatever its state (an operator's purge). Returns whether one
    /// existed.
    async fn remove(&self, scope: &Scope) -> Result<bool>;

    /// Deletes at most `limit` expired records; returns how many (SPEC S8).
    async fn purge_expired(&self, limit: usize) -> Result<usize>;

    /// Checks that the store answers (readiness).
    async fn ping(&self) -> Result<()>;

    /// Stores `candidate` as the secret `name` unless one is stored already, and
    /// returns the stored one, in one atomic step: of any number of callers at once,
    /// on any number of instances sharing the store, all get the same value (SPEC S3:
    /// the tenant secret, see [`TenantKey::from_store`](crate::TenantKey::from_store)).
    ///
    /// A secret is kept apart from the records, never expires, and is never deleted
    /// by [`purge_expired`](Self::purge_expired), [`remove`](Self::remove) or a
    /// sweeper: losing it would make every stored tenant unreachable. A store that
    /// persists its records keeps its secrets as durably.
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>>;

    /// Takes one token from the rate bucket `bucket` (a tenant's name) for `rate`, in
    /// one atomic step shared by every instance that uses this store: `Some(true)` when
    /// there was one, `Some(false)` when the bucket is empty. A store that keeps no
    /// buckets for every instance answers `None` (the default), and the caller keeps a
    /// [`LocalBucket`](crate::LocalBucket) per process instead. A bucket nobody took
    /// from for [`KeyRate::refill`](crate::KeyRate::refill) is full and may be
    /// forgotten; it is never a record, and no listing shows it.
    async fn take_rate_token(&self, bucket: &str, rate: &crate::KeyRate) -> Result<Option<bool>> {
        let _ = (bucket, rate);
        Ok(None)
    }

    /// Finishes the store's background work and closes its connections, for a clean
    /// stop once nothing else will call it. A store may refuse every operation after it
    /// (answering [`StoreError::Unavailable`]); one with nothing to finish does nothing,
    /// which is the default.
    async fn close(&self) {}

    /// Figures the store keeps about itself, read without a round trip (see
    /// [`StoreMetric`]). None, by default.
    fn metrics(&self) -> Vec<StoreMetric> {
        Vec::new()
    }

    /// Whether the store deletes expired records by itself (Redis's native TTLs), so
    /// that nobody needs to run [`purge_expired`](Self::purge_expired) on a schedule:
    /// a sweeper over such a store would only cost it work. `false`, by default.
    fn expires_natively(&self) -> bool {
        false
    }

    /// A [`Watch`] that fires once this store sees the scope's record completed,
    /// released or removed, by this process or (for a shared store) by another
    /// instance: what a duplicate waiting for an in-progress attempt awaits (SPEC S15)
    /// before it reserves again. Make it before that reserve, so that a change in
    /// between is not missed.
    ///
    /// A wake is only a hint; the reserve after it decides. The default,
    /// [`Watch::poll`], never fires, and the waiter polls at a backoff: right for a
    /// store that cannot tell, or cannot now (its notification channel is down).
    fn watch(&self, scope: &Scope) -> Watch {
        let _ = scope;
        Watch::poll()
    }

    /// One page of the records that have not expired and that `query` keeps (its
    /// [`matches`](ListQuery::matches)), for operators: in-progress records older than
    /// an age, records whose outcome is ambiguous. A page holds at most
    /// [`query.limit()`](ListQuery::limit) records and may hold fewer; the listing is
    /// complete when [`ListPage::next`] is `None`. Paging through from no cursor to the
    /// end returns every record that matched throughout, never skipping one; records
    /// written meanwhile may or may not appear. Each is returned once, with one
    /// exception a store must document: a store that lists by walking a hash table
    /// (Redis's `SCAN`) may return a record again if the table shrinks mid-listing, so
    /// a caller that must never see a record twice drops repeats by
    /// [`Scope::digest`](crate::Scope::digest), as `idem keys list` does. One call's
    /// work is bounded.
    async fn list(&self, query: &ListQuery) -> Result<ListPage>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_own_label() {
        let labels = [
            StoreError::Fenced,
            StoreError::unavailable("refused"),
            StoreError::Full,
            StoreError::Corrupt("bad".into()),
            StoreError::Sealed("unknown key".into()),
            StoreError::InvalidCursor("zz".into()),
        ]
        .map(|e| e.label());
        assert_eq!(
            labels,
            [
                "fenced",
                "unavailable",
                "full",
                "corrupt",
                "sealed",
                "invalid_cursor"
            ]
        );
    }
}
