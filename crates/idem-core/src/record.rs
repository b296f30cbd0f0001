//! What a store keeps per scope.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::{Ambiguity, Fingerprint, ResponseMeta, Scope, Timestamp};

/// Records expire this long after creation unless configured otherwise (SPEC S8).
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// An attempt's lease lasts this long unless renewed (SPEC S7).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// A value unique to one attempt (SPEC S7). Complete, renew and release succeed only
/// with the token of the attempt that currently holds the record, so a worker whose
/// lease was taken over cannot overwrite the new attempt's record.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A new token, unique to this attempt.
    ///
    /// Each process draws a random 64-bit base once from the operating system and adds
    /// a counter to it: tokens never repeat within a process, and any given token of one
    /// process equals a given token of another with probability 2^-64, as if each were
    /// drawn independently. This keeps a system call off every request's path; fencing
    /// needs uniqueness, not secrecy.
    pub fn generate() -> FencingToken {
        static BASE: OnceLock<u64> = OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = *BASE.get_or_init(|| {
            getrandom::u64().expect("the operating system's random generator failed")
        });
        loop {
            // Zero is never handed out, so storage can use it to mean "none".
            let t = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
            if t != 0 {
                return FencingToken(t);
            }
        }
    }

    /// A token from its stored value.
    pub const fn from_u64(v: u64) -> FencingToken {
        FencingToken(v)
    }

    /// The stored value.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// The stored value as a signed 64-bit integer, for SQL `BIGINT` columns.
    pub const fn as_i64(self) -> i64 {
        self.0 as i64
    }

    /// A token from a SQL `BIGINT` column.
    pub const fn from_i64(v: i64) -> FencingToken {
        FencingToken(v as u64)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({:016x})", self.0)
    }
}

/// `response`, a completed record's answer, as its replay: a sealed one also names
/// `token`, the record's attempt ([`ResponseMeta`]'s sealing attempt), which the
/// sealing wrapper needs to open it; any other as it is.
pub(crate) fn name_sealing_attempt(
    mut response: StoredResponse,
    token: FencingToken,
) -> StoredResponse {
    if response.meta.sealed_by.is_some() {
        response.meta.sealing_attempt = Some(token);
    }
    response
}

/// A recorded answer: status, allow-listed headers and body (SPEC S6), and what the
/// record keeps about it besides ([`ResponseMeta`]: a reference, an ambiguity reason,
/// trailers, a trace context, the sealing key's id).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Allow-listed HTTP headers, names in lower case, in their original order.
    pub headers: Vec<(String, Bytes)>,
    /// The body.
    pub body: Bytes,
    /// Everything else the record keeps about the answer, typed.
    pub meta: ResponseMeta,
}

impl StoredResponse {
    /// A response with no headers.
    pub fn new(status: u16, body: impl Into<Bytes>) -> StoredResponse {
        StoredResponse {
            status,
            headers: Vec::new(),
            body: body.into(),
            meta: ResponseMeta::default(),
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: impl Into<Bytes>) -> StoredResponse {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }
}

/// Where a record stands.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RecordState {
    /// An attempt is executing and holds the lease until `lease_until`.
    InProgress {
        /// When the lease lapses unless renewed.
        lease_until: Timestamp,
    },
    /// The attempt finished and its answer is recorded.
    Completed {
        /// The recorded answer.
        response: StoredResponse,
        /// When it was recorded.
        completed_at: Timestamp,
    },
    /// What is left of a completed record once it expired, if it was reserved with a
    /// tombstone TTL (SPEC S16): no body and no headers, only when the operation
    /// completed and with what status, until the record's
    /// [`expires_at`](Record::expires_at). A retry with the same payload is refused with
    /// [`Reservation::Gone`](crate::Reservation::Gone), not executed again.
    Tombstone {
        /// When the operation's answer was recorded.
        completed_at: Timestamp,
        /// The status it was recorded with.
        status: u16,
    },
}

/// One scope's record.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Record {
    /// Whose record it is.
    pub scope: Scope,
    /// The fingerprint of the request that created it.
    pub fingerprint: Fingerprint,
    /// When it was created (reset when an expired record is replaced).
    pub created_at: Timestamp,
    /// When it stops counting (SPEC S8).
    pub expires_at: Timestamp,
    /// 1 for the first execution, n+1 after each lease takeover.
    pub attempt: u32,
    /// The token of the attempt that holds (or completed) the record.
    pub token: FencingToken,
    /// In progress, completed, or a tombstone.
    pub state: RecordState,
    /// For a completed record reserved with a tombstone TTL: when the tombstone that
    /// follows its expiry ends (SPEC S16). Between [`expires_at`](Self::expires_at) and
    /// this time the record is refused as a tombstone would be, whether or not a
    /// store has compacted it yet ([`Record::into_tombstone`]). `None` otherwise.
    pub tombstone_until: Option<Timestamp>,
    /// For an in-progress record: why its attempt left it in progress without an
    /// answer it could record (an upstream that sent no answer by the deadline, or
    /// broke the connection, after the request was sent), as
    /// [`Store::mark_ambiguous`](crate::Store::mark_ambiguous) recorded it. `None`
    /// otherwise: a completed record's reason is its answer's
    /// ([`StoredResponse::ambiguity`]), and a takeover clears it.
    pub in_progress_ambiguity: Option<Ambiguity>,
}

impl Record {
    /// Whether the record has expired at `now` and so counts as absent, unless a
    /// tombstone follows it ([`Record::tombstone`]).
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at <= now
    }

    /// The completion a live tombstone at `now` holds of this record: when it completed
    /// and with what status. A [`RecordState::Tombstone`] that has not expired, or a
    /// completed record that has expired before its
    /// [`tombstone_until`](Self::tombstone_until).
    pub fn tombstone(&self, now: Timestamp) -> Option<(Timestamp, u16)> {
        match &self.state {
            RecordState::Tombstone {
                completed_at,
                status,
            } if !self.is_expired(now) => Some((*completed_at, *status)),
            RecordState::Completed {
                response,
                completed_at,
            } if self.is_expired(now) && self.tombstone_until.is_some_and(|t| t > now) => {
                Some((*completed_at, response.status))
            }
            _ => None,
        }
    }

    /// Whether a store may delete the record at `now` (SPEC S8): it has expired and no
    /// tombstone follows it.
    pub fn is_purgeable(&self, now: Timestamp) -> bool {
        self.is_expired(now) && self.tombstone(now).is_none()
    }

    /// The compact tombstone of a completed record that has expired at `now` and keeps
    /// one: its answer dropped, living until its `tombstone_until`. Anything else comes
    /// back unchanged.
    pub fn into_tombstone(self, now: Timestamp) -> Record {
        match (&self.state, self.tombstone_until) {
            (
                RecordState::Completed {
                    response,
                    completed_at,
                },
                Some(until),
            ) if self.is_expired(now) && until > now => Record {
                state: RecordState::Tombstone {
                    completed_at: *completed_at,
                    status: response.status,
                },
                expires_at: until,
                ..self
            },
            _ => self,
        }
    }

    /// Whether the record is completed.
    pub fn is_completed(&self) -> bool {
        matches!(self.state, RecordState::Completed { .. })
    }
}

/// The right to execute, handed to exactly one caller per attempt.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Lease {
    /// The record's scope.
    pub scope: Scope,
    /// This attempt's fencing token.
    pub token: FencingToken,
    /// The fingerprint of the request the record was reserved for: a sealed answer is
    /// bound to it (SPEC S17).
    pub fingerprint: Fingerprint,
    /// 1 for a first execution, n+1 after a takeover.
    pub attempt: u32,
    /// The TTL the record was reserved with ([`ReserveRequest::ttl`]): completing sets
    /// its expiry to creation + this (see [`Lease::completed_expires_at`]).
    pub ttl: Duration,
    /// The tombstone TTL the record was reserved with ([`ReserveRequest::tombstone`]):
    /// how long a tombstone outlives the completed record (see
    /// [`Lease::tombstone_until`]). Zero for none.
    pub tombstone: Duration,
}

impl Lease {
    /// When the record this lease completes expires (SPEC S8): its creation plus the
    /// TTL. While in progress the record lived at least as long as the lease, which may
    /// be longer than the TTL, so that an attempt still running is never taken for
    /// absent; once completed, the lease protects nothing, and the answer is kept for
    /// the TTL, counted from the first request, like any other. Never later than
    /// `expires_at`, the record's expiry while in progress (the minimum also keeps the
    /// sum from overflowing for a `Duration::MAX` TTL). An attempt that ran longer
    /// than the TTL completes a record that has already expired: its answer reaches the
    /// caller but is not replayed.
    pub fn completed_expires_at(&self, created_at: Timestamp, expires_at: Timestamp) -> Timestamp {
        created_at.plus(self.ttl).min(expires_at)
    }

    /// When the tombstone of the record this lease completes ends, given when the
    /// completed record expires ([`completed_expires_at`](Self::completed_expires_at)):
    /// that plus the tombstone TTL, or `None` when the lease keeps no tombstone.
    pub fn tombstone_until(&self, completed_expires_at: Timestamp) -> Option<Timestamp> {
        (!self.tombstone.is_zero()).then(|| completed_expires_at.plus(self.tombstone))
    }

    /// Whether this attempt took over a record whose earlier attempt died (SPEC S7): the
    /// handler should consult its business records before acting again.
    pub fn recovered(&self) -> bool {
        self.attempt > 1
    }
}

/// What a caller asks of [`Store::reserve`](crate::Store::reserve).
#[derive(Clone, Debug)]
pub struct ReserveRequest {
    /// The record's scope.
    pub scope: Scope,
    /// The incoming request's fingerprint.
    pub fingerprint: Fingerprint,
    /// How long a new record lives (SPEC S8), counted from its creation: a completed
    /// record expires then, an in-progress one not before its lease lapses.
    pub ttl: Duration,
    /// How long the lease lasts before it must be renewed (SPEC S7).
    pub lease: Duration,
    /// How long, after a completed record expires, its tombstone refuses a retry
    /// (SPEC S16). Zero, the default, keeps none: after expiry the key executes again.
    pub tombstone: Duration,
}

impl ReserveRequest {
    /// A request with the default TTL (24 h) and lease (60 s).
    pub fn new(scope: Scope, fingerprint: Fingerprint) -> ReserveRequest {
        ReserveRequest {
            scope,
            fingerprint,
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            tombstone: Duration::ZERO,
        }
    }

    /// Sets the tombstone TTL (zero for none).
    pub fn tombstone(mut self, tombstone: Duration) -> ReserveRequest {
        self.tombstone = tombstone;
        self
    }

    /// The lease of the reservation this request won, under `token` as `attempt`.
    pub fn lease_for(&self, token: FencingToken, attempt: u32) -> Lease {
        Lease {
            scope: self.scope.clone(),
            token,
            fingerprint: self.fingerprint,
            attempt,
            ttl: self.ttl,
            tombstone: self.tombstone,
        }
    }

    /// Sets the TTL.
    pub fn ttl(mut self, ttl: Duration) -> ReserveRequest {
        self.ttl = ttl;
        self
    }

    /// Sets the lease.
    pub fn lease(mut self, lease: Duration) -> ReserveRequest {
        self.lease = lease;
        self
    }

    /// When a record created now expires: the TTL, but never before the first lease
    /// lapses, so an in-progress record cannot expire under a live attempt. Renewals
    /// push it out with the lease; completing brings it back to creation + TTL
    /// ([`Lease::completed_expires_at`]).
    pub fn expires_at(&self, now: Timestamp) -> Timestamp {
        now.plus(self.ttl.max(self.lease))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_unique_and_never_zero() {
        let tokens: std::collections::HashSet<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..10_000)
                            .map(|_| FencingToken::generate().as_u64())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("thread"))
                .collect()
        });
        assert_eq!(tokens.len(), 40_000);
        assert!(!tokens.contains(&0));
    }
}
