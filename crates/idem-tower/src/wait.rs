//! Waiting duplicates (SPEC S15): a duplicate that finds the first attempt in progress
//! may wait for its answer, `Prefer: wait=N` (RFC 7240) or the route's default, instead
//! of getting 409 at once.
//!
//! The wait is bounded by the layer's maximum, the route's lease and a cap on waiters
//! per layer. The waiter awaits the store's [`Watch`](idem_core::Watch) (or a backoff
//! timer, for a store that cannot tell, and as a fallback for one that can, unless its
//! watch [misses nothing](idem_core::Watch::misses_nothing)), and then
//! reserves again through the normal path: a completion gives it the replay, a release
//! makes it the next attempt, and a lapsed lease lets it take over. A wake is only a
//! hint; the reserve decides. That loop is a step of the reserve (`execute.rs`,
//! `Keyed::wait_for`); this file holds what bounds it and how it ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use idem_core::{Lease, Reservation, Store};

use crate::IdempotencyBody;
use crate::handled::Handled;
use crate::hints::hint;
use crate::observer::{Observer, Outcome};
use crate::problem::{Problem, ProblemKind};

/// The header that says which preference was honoured (RFC 7240 §3).
pub const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// The longest wait the layer grants unless configured otherwise.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);

/// The most duplicates that wait at once per layer unless configured otherwise.
pub const DEFAULT_MAX_WAITERS: usize = 1024;

/// The `wait` preference of a request's `Prefer` headers, in seconds (RFC 7240): the
/// first `wait` among every header's comma-separated preferences, its name in any case,
/// its value a token or a quoted string of digits; parameters after `;` are ignored.
/// `None` when there is none, or the first is not a number.
pub(crate) fn preferred_wait(headers: &HeaderMap) -> Option<u64> {
    for value in headers.get_all(http::header::HeaderName::from_static("prefer")) {
        let Ok(value) = value.to_str() else {
            continue;
        };
        for preference in split_outside_quotes(value, ',') {
            let token = split_outside_quotes(preference, ';')
                .next()
                .unwrap_or_default();
            let (name, value) = match token.split_once('=') {
                Some((name, value)) => (name.trim(), Some(value.trim())),
                None => (token.trim(), None),
            };
            if !name.eq_ignore_ascii_case("wait") {
                continue;
            }
            // Only the first instance of a preference counts (RFC 7240 §2).
            let value = value?;
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            return Some(value.parse().unwrap_or(u64::MAX));
        }
    }
    None
}

/// `value` split at each `sep` that is not inside a quoted string.
fn split_outside_quotes(value: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut rest = Some(value);
    std::iter::from_fn(move || {
        let s = rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, c) in s.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                c if c == sep && !quoted => {
                    rest = Some(&s[i + 1..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

/// How long a duplicate of this request may wait, and what it asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    /// The wait granted: the asked (or the route's default) wait, bounded by the
    /// layer's maximum and the route's lease.
    pub(crate) within: Duration,
    /// The seconds `Prefer: wait` asked for, echoed in `Preference-Applied`; `None`
    /// for a route's default wait.
    pub(crate) preferred: Option<u64>,
}

impl Wait {
    /// The wait for a request: `preferred` (from `Prefer`) over the route's `default`,
    /// bounded by `max` and `lease`; `None` for no wait.
    pub(crate) fn new(
        preferred: Option<u64>,
        default: Duration,
        max: Duration,
        lease: Duration,
    ) -> Option<Wait> {
        let asked = preferred.map_or(default, Duration::from_secs);
        let within = asked.min(max).min(lease);
        (!within.is_zero()).then_some(Wait { within, preferred })
    }

    /// `Preference-Applied: wait=N`, when the client asked.
    pub(crate) fn applied(&self) -> Option<HeaderValue> {
        self.preferred
            .and_then(|n| HeaderValue::from_str(&format!("wait={n}")).ok())
    }
}

/// The cap on duplicates waiting at once, shared by every service of a layer.
#[derive(Clone, Debug)]
pub(crate) struct Waiters {
    max: usize,
    count: Arc<AtomicUsize>,
}

impl Waiters {
    pub(crate) fn new(max: usize) -> Waiters {
        Waiters {
            max,
            count: Arc::default(),
        }
    }

    /// A slot, or `None` when `max` duplicates wait already.
    pub(crate) fn enter(&self) -> Option<WaiterSlot> {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| WaiterSlot(self.count.clone()))
    }

    /// A cap of `self`'s size counting the same waiters as `earlier` (a layer that
    /// takes over from another).
    pub(crate) fn counted_with(&self, earlier: &Waiters) -> Waiters {
        Waiters {
            max: self.max,
            count: earlier.count.clone(),
        }
    }

    /// How many wait now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

/// A waiter's slot, freed when dropped: when the wait ends, or the client hangs up
/// and its request's future is dropped.
pub(crate) struct WaiterSlot(Arc<AtomicUsize>);

impl Drop for WaiterSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tells the observer that a wait started, and when dropped how it ended:
/// `abandoned` unless [`ended`](Self::ended) said otherwise.
pub(crate) struct Observed<'a> {
    observer: &'a dyn Observer,
    ended: &'static str,
}

impl<'a> Observed<'a> {
    pub(crate) fn start(observer: &'a dyn Observer) -> Observed<'a> {
        observer.wait_started();
        Observed {
            observer,
            ended: "abandoned",
        }
    }

    /// Records how the wait ended, from the reservation it ended with.
    pub(crate) fn ended(mut self, reserved: &idem_core::Result<Reservation>) {
        self.ended = match reserved {
            Ok(Reservation::Replay(_)) => "replay",
            Ok(Reservation::Acquired(_)) => "retry",
            Ok(Reservation::InProgress { .. }) => "timeout",
            _ => "other",
        };
    }
}

impl Drop for Observed<'_> {
    fn drop(&mut self) {
        self.observer.wait_ended(self.ended);
    }
}

/// Ends the wait of a duplicate whose reserve acquired the key: the attempt it waited
/// for was released, or its lease lapsed. The waiter kept only its body's fingerprint
/// (see [`execute`](crate::execute::execute)), so it cannot execute: it gives the key
/// back as it found it, and answers 409 with `Retry-After: 1`, as a wait that timed
/// out. The client's retry, which holds the body, then executes.
///
/// A released key is released again: nothing ran under this lease. A lapsed lease is
/// left lapsed (renewed for no time) rather than released, so that the retry takes the
/// key over as a recovered attempt, as it would have without this waiter: an earlier
/// attempt may have had effects, and the upstream must hear so (SPEC S7).
pub(crate) async fn hand_back<St: Store + ?Sized, B>(
    store: &St,
    observer: &dyn Observer,
    lease: Lease,
    dialect: crate::profile::Dialect,
    hints: bool,
) -> http::Response<crate::IdempotencyBody<B>> {
    if let Err(e) = crate::late::give_back(store, observer, &lease).await {
        // The key stays in progress until this lease lapses; the retry then takes over.
        tracing::warn!(
            error = %e,
            scope = %lease.scope.digest(),
            "a waiter could not hand back the key it acquired without its body"
        );
    }
    waited_without_answer(observer, dialect, hints)
}

/// The 409 a waiter gets when the attempt it waited for ended without an answer to
/// replay (its key released, or its lease lapsed) while it no longer holds its body
/// (see [`hand_back`]): as a wait that timed out, with a retry
/// hint on routes with `hints`.
pub(crate) fn waited_without_answer<B>(
    observer: &dyn Observer,
    dialect: crate::profile::Dialect,
    hints: bool,
) -> http::Response<IdempotencyBody<B>> {
    observer.outcome(Outcome::Conflict);
    let problem = Problem::new(
        ProblemKind::RequestInProgress,
        "the attempt this request waited for ended without an answer to replay (its key \
         was released, or its lease lapsed); nothing was executed for this request: send \
         it again with the same key to execute it",
    )
    .retry_after(std::time::Duration::from_secs(1));
    let mut response = problem.answer(dialect).map(IdempotencyBody::buffered);
    Handled::mark(&mut response, Outcome::Conflict);
    if hints {
        hint(&mut response, true);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefer(values: &[&str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append("prefer", HeaderValue::from_str(v).unwrap());
        }
        preferred_wait(&headers)
    }

    #[test]
    fn prefer_wait_is_read_as_rfc_7240_says() {
        assert_eq!(prefer(&["wait=10"]), Some(10));
        assert_eq!(prefer(&["respond-async, wait=5"]), Some(5));
        assert_eq!(prefer(&["WAIT = 7"]), Some(7));
        assert_eq!(prefer(&["Wait=\"12\""]), Some(12));
        assert_eq!(prefer(&["wait=3; foo=bar"]), Some(3));
        assert_eq!(prefer(&["return=minimal", "wait=4"]), Some(4));
        assert_eq!(prefer(&["foo=\"a,wait=9\", wait=2"]), Some(2));
        // The first instance counts, even if it is not a number.
        assert_eq!(prefer(&["wait=1, wait=9"]), Some(1));
        assert_eq!(prefer(&["wait=soon, wait=9"]), None);
        assert_eq!(prefer(&["wait"]), None);
        assert_eq!(prefer(&["wait=-1"]), None);
        assert_eq!(prefer(&["waiting=5"]), None);
        assert_eq!(prefer(&[]), None);
        assert_eq!(prefer(&["wait=99999999999999999999999"]), Some(u64::MAX));
    }

    #[test]
    fn the_wait_is_bounded_by_the_maximum_and_the_lease() {
        let s = Duration::from_secs;
        let wait = |p, d, m, l| Wait::new(p, s(d), s(m), s(l)).map(|w| w.within.as_secs());
        assert_eq!(wait(Some(10), 0, 30, 60), Some(10));
        assert_eq!(wait(Some(100), 0, 30, 60), Some(30));
        assert_eq!(wait(Some(100), 0, 300, 60), Some(60));
        assert_eq!(wait(None, 5, 30, 60), Some(5));
        assert_eq!(
            wait(Some(0), 5, 30, 60),
            None,
            "wait=0 overrides the default"
        );
        assert_eq!(wait(None, 0, 30, 60), None);
        assert_eq!(
            Wait::new(Some(3), s(0), s(30), s(60)).unwrap().applied(),
            Some(HeaderValue::from_static("wait=3"))
        );
        assert_eq!(Wait::new(None, s(3), s(30), s(60)).unwrap().applied(), None);
    }

    #[test]
    fn waiter_slots_are_capped_and_freed_on_drop() {
        let waiters = Waiters::new(2);
        let (a, b) = (waiters.enter(), waiters.enter());
        assert!(a.is_some() && b.is_some());
        assert!(waiters.enter().is_none());
        drop(a);
        assert_eq!(waiters.waiting(), 1);
        assert!(waiters.enter().is_some());
    }
}
