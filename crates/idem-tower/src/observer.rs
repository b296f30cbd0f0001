//! What the layer reports as it works: each request's [`Outcome`], and the hooks of an
//! [`Observer`] (metrics, logs).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use idem_core::{Ambiguity, StoreError};

use crate::disposition::UpstreamFailure;

/// What the layer did with one request, as reported to an [`Observer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and its response was recorded.
    Executed,
    /// A completed record was replayed; the handler did not run.
    Replayed,
    /// Another attempt holds the key: 409.
    Conflict,
    /// The key was reused with a different payload: 422.
    Mismatch,
    /// The key's record expired and its tombstone refused the retry (SPEC S16): 410,
    /// handler not called.
    Expired,
    /// The handler ran and its response released the key.
    Released,
    /// The handler ran and asked to keep the record in progress
    /// ([`Disposition::KeepInProgress`](crate::Disposition::KeepInProgress)).
    KeptInProgress,
    /// The request was refused before reserving: bad or missing key (400), body too large
    /// (413) or unreadable (400).
    Rejected,
    /// The store failed: 503, handler not called.
    StoreUnavailable,
    /// The store granted the key, but its reply came too late to trust the lease
    /// (SPEC S7): 503 `reservation-late`, handler not called, the reservation given back
    /// if it was still this attempt's.
    ReservationLate,
    /// The record's answer is a [`ResourceReference`](crate::ResourceReference), and rendering it again failed:
    /// 503 `replay-unavailable`, handler not called.
    ReplayUnavailable,
    /// The request was not keyed (method, route, or no key on an optional route) and
    /// went to the handler untouched.
    PassedThrough,
}

impl Outcome {
    /// Every outcome, for a metrics endpoint that lists each at zero before it first
    /// happens (so dashboards see zeros rather than gaps). Kept beside [`as_str`](Outcome::as_str): a
    /// variant added there belongs here too.
    pub const ALL: [Outcome; 12] = [
        Outcome::Executed,
        Outcome::Replayed,
        Outcome::Conflict,
        Outcome::Mismatch,
        Outcome::Expired,
        Outcome::Released,
        Outcome::KeptInProgress,
        Outcome::Rejected,
        Outcome::StoreUnavailable,
        Outcome::ReservationLate,
        Outcome::ReplayUnavailable,
        Outcome::PassedThrough,
    ];

    /// A short, stable name (`executed`, `replayed`, …) for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::Expired => "expired",
            Outcome::Released => "released",
            Outcome::KeptInProgress => "kept_in_progress",
            Outcome::Rejected => "rejected",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::ReservationLate => "reservation_late",
            Outcome::ReplayUnavailable => "replay_unavailable",
            Outcome::PassedThrough => "passed_through",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Hooks the layer calls as it works (metrics, logs). Every method has a no-op default.
///
/// Methods are called inline on the request path: keep them cheap and never block.
pub trait Observer: Send + Sync + 'static {
    /// One request's outcome.
    fn outcome(&self, outcome: Outcome) {
        let _ = outcome;
    }

    /// One store call (`reserve`, `complete`, `renew`, `release`), how long it took and
    /// whether it succeeded.
    fn store_call(&self, op: &'static str, elapsed: Duration, ok: bool) {
        let _ = (op, elapsed, ok);
    }

    /// One store call that failed, and how, right after its
    /// [`store_call`](Observer::store_call). [`StoreError::Fenced`] on `complete`,
    /// `renew` or `release` means another attempt had taken the record over while this
    /// one ran: its lease lapsed although the heartbeat renews it, as when the worker
    /// stalled, the renewals failed, or the clocks of the instances sharing the store
    /// disagree.
    fn store_error(&self, op: &'static str, error: &StoreError) {
        let _ = (op, error);
    }

    /// A key write (`complete` or `release`) failed every try before the caller got
    /// its answer (the store is down, say), and goes on in the background for as long
    /// as the lease. Until it ends, retries of the key get 409.
    fn write_deferred(&self, op: &'static str) {
        let _ = op;
    }

    /// A deferred key write ended: made (or fenced by a takeover) if `settled`; else
    /// given up, so the key stays in progress until its lease lapses, and after an
    /// answer that was never recorded the next retry runs the handler again.
    fn deferred_write_ended(&self, op: &'static str, settled: bool) {
        let _ = (op, settled);
    }

    /// An upstream failed, once for each failure the layer answers: a proxy inside the
    /// layer returned it as a [`ForwardError`](crate::ForwardError) (an unreachable
    /// upstream, a timeout before the head; for a keyed request, an unkeyed one, or the
    /// `GET` that renders a reference), or the layer found a
    /// [`Proxied`](crate::Proxied) answer unusable while it read it to record it (too
    /// slow, broken off or too large).
    fn upstream_failed(&self, failure: UpstreamFailure) {
        let _ = failure;
    }

    /// A keyed request named its tenant (before any limit looked at it): for
    /// counting requests per tenant. Called once per keyed request that got as far.
    fn tenant_keyed(&self, tenant: &idem_core::Tenant) {
        let _ = tenant;
    }

    /// A keyed request of `tenant` was refused under a limit per tenant: `in_flight`
    /// ([`IdempotencyLayer::tenant_max_in_flight`]) or `key_rate`
    /// ([`IdempotencyLayer::tenant_key_rate`]); or under the rate of every unverified
    /// tenant's new keys together, `unverified_key_rate`
    /// ([`IdempotencyLayer::unverified_key_rate`]).
    ///
    /// [`IdempotencyLayer::tenant_max_in_flight`]: crate::IdempotencyLayer::tenant_max_in_flight
    /// [`IdempotencyLayer::tenant_key_rate`]: crate::IdempotencyLayer::tenant_key_rate
    /// [`IdempotencyLayer::unverified_key_rate`]: crate::IdempotencyLayer::unverified_key_rate
    fn tenant_limited(&self, tenant: &idem_core::Tenant, limit: &'static str) {
        let _ = (tenant, limit);
    }

    /// A duplicate of an in-progress attempt started to wait for its answer (SPEC S15).
    fn wait_started(&self) {}

    /// A wait ended, as `ended` says: `replay` (the attempt completed), `retry` (its
    /// key was released, or its lease lapsed: the waiter, which kept no body, gets 409
    /// and its client's retry executes), `timeout`
    /// (still in progress at the end: 409), `abandoned` (the client hung up) or
    /// `other` (a mismatch, a store error).
    fn wait_ended(&self, ended: &'static str) {
        let _ = ended;
    }

    /// An execution's outcome is one the layer cannot know, for `reason`, and an
    /// operator may have to reconcile it with the business's records: an attempt took
    /// over a record whose earlier attempt's lease lapsed ([`Ambiguity::Takeover`]), a
    /// proxied upstream timed out or broke off after the request was sent (the record
    /// stays in progress), an answer was too large to record, or the handler failed
    /// after it started (a problem is recorded, marked with the reason, see
    /// [`StoredResponse::ambiguity`](idem_core::StoredResponse::ambiguity)).
    /// `scope_digest` is the record's [`Scope::digest`](idem_core::Scope::digest),
    /// which names it without the key or the tenant: log that, never the key.
    fn ambiguous_outcome(&self, reason: Ambiguity, scope_digest: &str) {
        let _ = (reason, scope_digest);
    }
}

/// The default observer: does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoopObserver;

impl Observer for NoopObserver {}

/// Runs one store call, reporting it to `observer` under `op`.
pub(crate) async fn timed<T>(
    observer: &dyn Observer,
    op: &'static str,
    call: impl Future<Output = idem_core::Result<T>>,
) -> idem_core::Result<T> {
    let started = std::time::Instant::now();
    let result = call.await;
    observer.store_call(op, started.elapsed(), result.is_ok());
    if let Err(e) = &result {
        observer.store_error(op, e);
    }
    result
}
