//! What a store keeps per scope.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::{Fingerprint, Scope, Timestamp};

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

/// The pseudo-header a sealed answer names its sealing key under (SPEC S17); see
/// `seal::SEALED_HEADER`.
pub(crate) const SEALED_HEADER: &str = ":sealed";

/// The pseudo-header under which a replay of a sealed answer carries the token of the
/// attempt whose record holds it, as [`decide`](crate::decide) read it from the record.
/// A sealed answer is bound to that token, so the sealing wrapper needs it to open the
/// answer; the store's own copy of this header, if any, is never trusted.
pub(crate) const SEALING_ATTEMPT_HEADER: &str = ":sealed-attempt";

/// `response`, a completed record's answer, as its replay: a sealed one also names
/// `token`, the record's attempt ([`SEALING_ATTEMPT_HEADER`]); any other as it is.
pub(crate) fn name_sealing_attempt(
    mut response: StoredResponse,
    token: FencingToken,
) -> StoredResponse {
    if response
        .headers
        .first()
        .is_some_and(|(name, _)| name == SEALED_HEADER)
    {
        response
            .headers
            .retain(|(name, _)| name != SEALING_ATTEMPT_HEADER);
        response.headers.push((
            SEALING_ATTEMPT_HEADER.to_owned(),
            Bytes::from(format!("{:016x}", token.as_u64())),
        ));
    }
    response
}

/// A recorded answer: status, allow-listed headers and body (SPEC S6).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Allow-listed headers, names in lower case, in their original order.
    pub headers: Vec<(String, Bytes)>,
    /// The body.
    pub body: Bytes,
}

impl StoredResponse {
    /// A response with no headers.
    pub fn new(status: u16, body: impl Into<Bytes>) -> StoredResponse {
        StoredResponse {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: impl Into<Bytes>) -> StoredResponse {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// Records `reference`, a path on the same service (`/v1/reports/42`), as where
    /// this answer's body is to be rendered from at replay time, instead of the body
    /// itself (SPEC S6, for large answers). Stored among the headers under
    /// [`REFERENCE_HEADER`], which no HTTP field name can equal, so every store keeps it
    /// as it keeps headers.
    pub fn with_reference(self, reference: &str) -> StoredResponse {
        self.with_header(
            REFERENCE_HEADER,
            Bytes::copy_from_slice(reference.as_bytes()),
        )
    }

    /// The reference this answer's body is to be rendered from, if it was recorded as
    /// one ([`with_reference`](Self::with_reference)).
    pub fn reference(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(name, _)| name == REFERENCE_HEADER)
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }

    /// Records `traceparent`, the W3C trace context of the execution that produced this
    /// answer (`00-<trace id>-<span id>-<flags>`), so that a replay's trace can link to
    /// it. Kept among the headers under the pseudo-header name `:traceparent`, as a
    /// reference is kept, so every store keeps it without a column of its own.
    pub fn with_trace_parent(self, traceparent: &str) -> StoredResponse {
        self.with_header(
            TRACE_PARENT_HEADER,
            Bytes::copy_from_slice(traceparent.as_bytes()),
        )
    }

    /// The trace context recorded with [`with_trace_parent`](Self::with_trace_parent);
    /// `None` for an answer recorded without one.
    pub fn trace_parent(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(name, _)| name == TRACE_PARENT_HEADER)
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }

    /// Records a trailer field of the answer (a gRPC call's `grpc-status`, say), to be
    /// sent as a trailer again at replay. Kept among the headers under the pseudo-header
    /// name `:trailer:<name>`, as a reference is kept, so every store keeps it without a
    /// column of its own, and a build that does not know it skips it.
    pub fn with_trailer(mut self, name: &str, value: impl Into<Bytes>) -> StoredResponse {
        let mut key = String::with_capacity(TRAILER_PREFIX.len() + name.len());
        key.push_str(TRAILER_PREFIX);
        key.push_str(name);
        key.make_ascii_lowercase();
        self.headers.push((key, value.into()));
        self
    }

    /// The trailers recorded with [`with_trailer`](Self::with_trailer): names (without
    /// the prefix) and values, in their original order.
    pub fn trailers(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.headers
            .iter()
            .filter_map(|(name, value)| Some((name.strip_prefix(TRAILER_PREFIX)?, value)))
    }

    /// The stored headers that are HTTP headers: all but the pseudo-headers (the
    /// reference, the trace context), whose names start with a colon.
    pub fn http_headers(&self) -> impl Iterator<Item = &(String, Bytes)> {
        self.headers
            .iter()
            .filter(|(name, _)| !name.starts_with(':'))
    }
}

/// The name under which [`StoredResponse::with_reference`] keeps a reference among the
/// stored headers: a colon makes it an invalid HTTP field name, so it never collides
/// with a real header, and a build that does not know it skips it at replay.
pub const REFERENCE_HEADER: &str = ":reference";

/// The name under which [`StoredResponse::with_trace_parent`] keeps the trace context
/// among the stored headers: like [`REFERENCE_HEADER`], no HTTP field name.
const TRACE_PARENT_HEADER: &str = ":traceparent";

/// The prefix under which [`StoredResponse::with_trailer`] keeps a trailer among the
/// stored headers: like [`REFERENCE_HEADER`], no HTTP field name.
pub const TRAILER_PREFIX: &str = ":trailer:";

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
    fn pseudo_headers_are_kept_but_never_http_headers() {
        let stored = StoredResponse::new(201, "ok")
            .with_header("Location", "/v1/things/1")
            .with_reference("/v1/things/1")
            .with_trace_parent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        assert_eq!(stored.reference(), Some("/v1/things/1"));
        assert_eq!(
            stored.trace_parent(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        let http: Vec<&str> = stored.http_headers().map(|(n, _)| n.as_str()).collect();
        assert_eq!(http, ["location"]);
        assert_eq!(StoredResponse::new(200, "").trace_parent(), None);
    }

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
