//! The retry budget (SPEC S11): retries shared by every operation of a client, capped
//! at a fraction of recent requests plus a small floor, so that a struggling server
//! sees at most that much extra load from retries however many operations fail.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use idem_core::{SharedClock, duration_millis};

/// How many retries a client may make: at most `min_retries + ratio × requests` within
/// any `window`, where `requests` counts operations sent (first attempts) in the
/// window and every retry of any operation spends from the same allowance.
///
/// The default, 10% of requests plus 10 per 10 seconds, means a server that fails
/// every request sees at most 1.1× the original traffic plus one retry a second.
///
/// ```
/// use std::time::Duration;
/// use idem_client::RetryBudget;
///
/// let budget = RetryBudget::default().ratio(0.2).min_retries(5).window(Duration::from_secs(30));
/// assert_eq!(budget.allowance(1_000), 205);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryBudget {
    ratio: f64,
    min_retries: u32,
    window: Duration,
}

impl Default for RetryBudget {
    fn default() -> RetryBudget {
        RetryBudget {
            ratio: 0.1,
            min_retries: 10,
            window: Duration::from_secs(10),
        }
    }
}

impl RetryBudget {
    /// Sets the fraction of recent requests that may be retried (clamped to `0..=1000`).
    pub fn ratio(mut self, ratio: f64) -> RetryBudget {
        self.ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1000.0)
        } else {
            0.0
        };
        self
    }

    /// Sets the retries allowed per window whatever the traffic, so that a client that
    /// sends little can still retry.
    pub fn min_retries(mut self, n: u32) -> RetryBudget {
        self.min_retries = n;
        self
    }

    /// Sets how far back "recent" reaches (at least 10 ms).
    pub fn window(mut self, window: Duration) -> RetryBudget {
        self.window = window.max(Duration::from_millis(10));
        self
    }

    /// How many retries `requests` requests within one window allow.
    pub fn allowance(&self, requests: u64) -> u64 {
        self.min_retries as u64 + (self.ratio * requests as f64).floor() as u64
    }
}

/// Counts since the client was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BudgetStats {
    /// Operations sent (first attempts), each of which deposits into the budget.
    pub requests: u64,
    /// Retries the budget allowed.
    pub retries_granted: u64,
    /// Retries the budget refused; each ended an operation with
    /// [`GiveUp::Budget`](crate::GiveUp::Budget).
    pub retries_refused: u64,
}

/// The live budget: a window of ten slots, each counting requests and retries.
#[derive(Debug)]
pub(crate) struct BudgetState {
    config: RetryBudget,
    clock: SharedClock,
    slot_millis: i64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: VecDeque<Slot>,
    stats: BudgetStats,
}

#[derive(Debug)]
struct Slot {
    index: i64,
    requests: u64,
    retries: u64,
}

const SLOTS: i64 = 10;

impl BudgetState {
    pub(crate) fn new(config: RetryBudget, clock: SharedClock) -> BudgetState {
        let slot_millis = (duration_millis(config.window) / SLOTS).max(1);
        BudgetState {
            config,
            clock,
            slot_millis,
            inner: Mutex::default(),
        }
    }

    /// Counts one operation sent.
    pub(crate) fn deposit(&self) {
        let mut inner = self.lock();
        let slot = self.current(&mut inner);
        slot.requests += 1;
        inner.stats.requests += 1;
    }

    /// Spends one retry if the window allows it.
    pub(crate) fn try_withdraw(&self) -> bool {
        let mut inner = self.lock();
        self.current(&mut inner);
        let (requests, retries) = inner
            .slots
            .iter()
            .fold((0, 0), |(q, r), s| (q + s.requests, r + s.retries));
        if retries < self.config.allowance(requests) {
            inner.slots.back_mut().expect("current slot").retries += 1;
            inner.stats.retries_granted += 1;
            true
        } else {
            inner.stats.retries_refused += 1;
            false
        }
    }

    pub(crate) fn stats(&self) -> BudgetStats {
        self.lock().stats
    }

    /// The slot for now, after dropping the ones that left the window.
    fn current<'a>(&self, inner: &'a mut Inner) -> &'a mut Slot {
        let index = self.clock.now().as_millis().div_euclid(self.slot_millis);
        while inner
            .slots
            .front()
            .is_some_and(|s| s.index <= index - SLOTS)
        {
            inner.slots.pop_front();
        }
        if inner.slots.back().is_none_or(|s| s.index < index) {
            inner.slots.push_back(Slot {
                index,
                requests: 0,
                retries: 0,
            });
        }
        // A clock that stepped back lands in the newest slot rather than reordering.
        inner.slots.back_mut().expect("just pushed")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use idem_core::{ManualClock, Timestamp};

    use super::*;

    fn state(config: RetryBudget) -> (BudgetState, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        (BudgetState::new(config, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn floor_allows_retries_without_traffic() {
        let (b, _) = state(RetryBudget::default().min_retries(3));
        assert_eq!((0..5).filter(|_| b.try_withdraw()).count(), 3);
        assert_eq!(
            b.stats(),
            BudgetStats {
                requests: 0,
                retries_granted: 3,
                retries_refused: 2
            }
        );
    }

    #[test]
    fn retries_are_capped_at_ratio_of_requests_plus_floor() {
        let (b, _) = state(RetryBudget::default().ratio(0.1).min_retries(10));
        for _ in 0..1000 {
            b.deposit();
        }
        let granted = (0..1000).filter(|_| b.try_withdraw()).count();
        assert_eq!(granted, 110);
    }

    #[test]
    fn old_requests_and_retries_leave_the_window() {
        let (b, clock) = state(
            RetryBudget::default()
                .ratio(0.5)
                .min_retries(0)
                .window(Duration::from_secs(10)),
        );
        for _ in 0..10 {
            b.deposit();
        }
        assert_eq!((0..10).filter(|_| b.try_withdraw()).count(), 5);
        // Still inside the window: nothing new.
        clock.advance(Duration::from_secs(9));
        assert!(!b.try_withdraw());
        // Past it, the old deposits are gone too: a quiet client earns nothing.
        clock.advance(Duration::from_secs(2));
        assert!(!b.try_withdraw());
        b.deposit();
        b.deposit();
        assert!(b.try_withdraw());
        assert!(!b.try_withdraw());
    }

    #[test]
    fn allowance_rounds_down() {
        let c = RetryBudget::default().ratio(0.25).min_retries(1);
        assert_eq!(c.allowance(0), 1);
        assert_eq!(c.allowance(3), 1);
        assert_eq!(c.allowance(4), 2);
    }
}
