//! How often and how long to retry one operation (SPEC S11): exponential backoff with
//! full jitter, a maximum number of attempts, a per-attempt timeout and an overall
//! deadline.

use std::sync::Mutex;
use std::time::Duration;

/// Retry limits for one operation. Every limit applies; the first one reached ends the
/// retries.
///
/// ```
/// use std::time::Duration;
/// use idem_client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(3)
///     .base_delay(Duration::from_millis(100))
///     .deadline(Duration::from_secs(10));
/// assert_eq!(policy.backoff_ceiling(1), Duration::from_millis(100));
/// assert_eq!(policy.backoff_ceiling(3), Duration::from_millis(400));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base_delay: Duration,
    max_delay: Duration,
    attempt_timeout: Duration,
    deadline: Duration,
}

impl Default for RetryPolicy {
    /// Five attempts, backoff from 200 ms doubling up to 10 s, 30 s per attempt, and
    /// 2 minutes in all: long enough to outlast a server's 60 s lease (a 409) and a
    /// restart, short enough that a caller still waiting learns the outcome.
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries: one attempt.
    pub fn no_retries() -> RetryPolicy {
        RetryPolicy::default().max_attempts(1)
    }

    /// Sets the most attempts, the first included (at least 1). A 409 answer after the
    /// first attempt does not count: another attempt holds the key, and the operation
    /// waits as the server's `Retry-After` asks, within the deadline.
    pub fn max_attempts(mut self, n: u32) -> RetryPolicy {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets the backoff ceiling of the first retry; it doubles for each retry after.
    pub fn base_delay(mut self, d: Duration) -> RetryPolicy {
        self.base_delay = d;
        self
    }

    /// Sets the largest backoff ceiling.
    pub fn max_delay(mut self, d: Duration) -> RetryPolicy {
        self.max_delay = d;
        self
    }

    /// Sets how long one attempt may take, connecting to reading the whole body.
    pub fn attempt_timeout(mut self, d: Duration) -> RetryPolicy {
        self.attempt_timeout = d;
        self
    }

    /// Sets how long the operation may take in all, waits included. A retry whose wait
    /// would end past the deadline is not made.
    pub fn deadline(mut self, d: Duration) -> RetryPolicy {
        self.deadline = d;
        self
    }

    /// The most attempts.
    pub fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The per-attempt timeout.
    pub fn get_attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The overall deadline.
    pub fn get_deadline(&self) -> Duration {
        self.deadline
    }

    /// The ceiling of the wait before retry number `retry` (1 for the first retry):
    /// `min(max_delay, base_delay × 2^(retry-1))`. The wait itself is drawn uniformly
    /// from zero to the ceiling ("full jitter"), so that clients that failed together
    /// do not come back together.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        let shift = retry.saturating_sub(1).min(31);
        self.base_delay
            .checked_mul(1u32 << shift)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }
}

/// The random source of full jitter, seedable so tests see the same waits every run.
#[derive(Debug)]
pub(crate) struct Jitter(Mutex<fastrand::Rng>);

impl Jitter {
    pub(crate) fn new(seed: Option<u64>) -> Jitter {
        let seed = seed.unwrap_or_else(|| {
            getrandom::u64().expect("the operating system's random generator failed")
        });
        Jitter(Mutex::new(fastrand::Rng::with_seed(seed)))
    }

    /// A wait drawn uniformly from `[0, ceiling]`, at nanosecond resolution.
    pub(crate) fn full(&self, ceiling: Duration) -> Duration {
        let max = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        let mut rng = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Duration::from_nanos(rng.u64(0..=max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_ceiling_doubles_up_to_the_cap() {
        let p = RetryPolicy::default()
            .base_delay(Duration::from_millis(100))
            .max_delay(Duration::from_secs(1));
        let ceilings: Vec<u64> = (1..=6)
            .map(|n| p.backoff_ceiling(n).as_millis() as u64)
            .collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(p.backoff_ceiling(1000), Duration::from_secs(1));
    }

    #[test]
    fn full_jitter_stays_within_the_ceiling_and_spreads() {
        let j = Jitter::new(Some(7));
        let ceiling = Duration::from_millis(800);
        let draws: Vec<Duration> = (0..10_000).map(|_| j.full(ceiling)).collect();
        assert!(draws.iter().all(|d| *d <= ceiling));
        let mean = draws.iter().sum::<Duration>() / draws.len() as u32;
        // Uniform on [0, 800 ms]: mean 400 ms; 10,000 draws put it well within ±20 ms.
        assert!(
            (380..=420).contains(&mean.as_millis()),
            "mean {mean:?} is not about half the ceiling"
        );
        let below_tenth = draws.iter().filter(|d| d.as_millis() < 80).count();
        assert!(
            (800..=1200).contains(&below_tenth),
            "{below_tenth} draws below 10% of the ceiling: full jitter starts at zero"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_waits() {
        let a = Jitter::new(Some(42));
        let b = Jitter::new(Some(42));
        let c = Jitter::new(Some(43));
        let ceiling = Duration::from_secs(5);
        let wa: Vec<_> = (0..5).map(|_| a.full(ceiling)).collect();
        let wb: Vec<_> = (0..5).map(|_| b.full(ceiling)).collect();
        let wc: Vec<_> = (0..5).map(|_| c.full(ceiling)).collect();
        assert_eq!(wa, wb);
        assert_ne!(wa, wc);
    }

    #[test]
    fn max_attempts_is_at_least_one() {
        assert_eq!(RetryPolicy::default().max_attempts(0).get_max_attempts(), 1);
        assert_eq!(RetryPolicy::no_retries().get_max_attempts(), 1);
    }
}
