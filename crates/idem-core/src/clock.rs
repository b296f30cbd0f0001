//! Time, injected: stores read "now" from a [`Clock`] so tests move time by hand
//! instead of sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: the unit every store persists.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// A timestamp from milliseconds since the Unix epoch.
    pub const fn from_millis(millis: i64) -> Timestamp {
        Timestamp(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This instant plus `d`, saturating.
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// How long from `earlier` to `self`; zero when `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0).max(0) as u64)
    }

    /// This instant as RFC 3339 in UTC, to the millisecond: `2026-12-01T09:30:00.125Z`.
    /// Any value formats, never failing: one past the year 9999 (a record kept "for
    /// ever" saturates to one) is written with more digits for its year, one before
    /// 1970 in the proleptic Gregorian calendar.
    pub fn to_rfc3339(self) -> String {
        let (days, ms_of_day) = (self.0.div_euclid(86_400_000), self.0.rem_euclid(86_400_000));
        // Civil from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let (h, m, s, milli) = (
            ms_of_day / 3_600_000,
            ms_of_day / 60_000 % 60,
            ms_of_day / 1000 % 60,
            ms_of_day % 1000,
        );
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
    }
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}ms)", self.0)
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock. Leases and expiry compare timestamps written by different
/// machines, so their clocks must agree to well within the lease (NTP suffices for the
/// 60 s default).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(duration_millis(since))
    }
}

/// A clock that moves only when told to; clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(start.0)))
    }

    /// A clock standing at the system's current time, so that records written with it
    /// look plausible to tools reading them.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(SystemClock.now())
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// A shared clock handle, as stores keep it.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_counts_leap_years_and_formats_any_instant() {
        let t = Timestamp::from_millis;
        assert_eq!(t(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(t(951_782_400_000).to_rfc3339(), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            t(4_107_542_399_999).to_rfc3339(),
            "2100-02-28T23:59:59.999Z"
        );
        assert_eq!(
            t(1_796_117_400_125).to_rfc3339(),
            "2026-12-01T09:30:00.125Z"
        );
        assert_eq!(t(-1).to_rfc3339(), "1969-12-31T23:59:59.999Z");
        // The saturated "for ever" and its opposite format too.
        assert!(t(i64::MAX).to_rfc3339().ends_with('Z'));
        assert!(t(i64::MIN).to_rfc3339().ends_with('Z'));
    }
}
