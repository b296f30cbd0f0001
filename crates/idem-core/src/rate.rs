//! A rate of new keys per tenant (a token bucket), and the bucket a process keeps
//! when its store does not keep one for every instance (see
//! [`Store::take_rate_token`](crate::Store::take_rate_token)).

use std::fmt;
use std::time::Duration;

use crate::Timestamp;

/// A rate of new keys: `per_second` on average, up to `burst` at once after a quiet
/// spell (a token bucket that holds `burst` tokens and gains `per_second` a second;
/// each new key takes one).
///
/// ```
/// use idem_core::KeyRate;
///
/// let rate: KeyRate = "600/min,50".parse().unwrap();
/// assert_eq!(rate.per_second(), 10.0);
/// assert_eq!(rate.burst(), 50);
/// // The burst defaults to one second's worth, and at least 1.
/// assert_eq!("5/s".parse::<KeyRate>().unwrap().burst(), 5);
/// assert!("0/s".parse::<KeyRate>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq)]
pub struct KeyRate {
    per_second: f64,
    burst: u32,
}

/// Why a rate cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyRateError(String);

impl KeyRate {
    /// `per_second` keys a second, `burst` at most at once.
    pub fn new(per_second: f64, burst: u32) -> Result<KeyRate, KeyRateError> {
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(KeyRateError(format!(
                "a key rate must be a positive number a second, not {per_second}"
            )));
        }
        if burst == 0 {
            return Err(KeyRateError("a key rate's burst must be at least 1".into()));
        }
        Ok(KeyRate { per_second, burst })
    }

    /// Keys a second, on average.
    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    /// The most keys at once, after a quiet spell.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// How long a refused key is told to wait (`Retry-After`): the time one token
    /// takes to come back, rounded up to whole seconds, at least one.
    pub fn retry_after(&self) -> Duration {
        Duration::from_secs((1.0 / self.per_second).ceil().max(1.0) as u64)
    }

    /// How long an emptied bucket takes to fill again: after that, a bucket nobody
    /// took from is full, and a store may forget it.
    pub fn refill(&self) -> Duration {
        Duration::from_secs_f64(f64::from(self.burst) / self.per_second)
    }
}

impl fmt::Debug for KeyRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// `RATE/UNIT,BURST`, the form it is parsed from: `10/s,20`.
impl fmt::Display for KeyRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s,{}", self.per_second, self.burst)
    }
}

/// Parses `RATE/UNIT[,BURST]`: `10/s`, `600/min,50`, `36000/h`. The unit is `s`,
/// `min` or `h` (also `sec`, `second`, `m`, `minute`, `hour`); the burst defaults to
/// one second's worth of the rate, at least 1.
impl std::str::FromStr for KeyRate {
    type Err = KeyRateError;

    fn from_str(s: &str) -> Result<KeyRate, KeyRateError> {
        let bad = |why: &str| {
            KeyRateError(format!(
                "{s:?} is no key rate ({why}); write RATE/UNIT[,BURST], e.g. 10/s or 600/min,50"
            ))
        };
        let (rate, burst) = match s.split_once(',') {
            Some((rate, burst)) => (rate, Some(burst.trim())),
            None => (s, None),
        };
        let (count, unit) = rate.split_once('/').ok_or_else(|| bad("no /UNIT"))?;
        let count: f64 = count
            .trim()
            .parse()
            .map_err(|_| bad("the rate is no number"))?;
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            _ => return Err(bad("the unit is none of s, min, h")),
        };
        let per_second = count / seconds;
        let burst = match burst {
            Some(b) => b.parse().map_err(|_| bad("the burst is no whole number"))?,
            None => per_second.ceil().clamp(1.0, f64::from(u32::MAX)) as u32,
        };
        KeyRate::new(per_second, burst).map_err(|e| bad(&e.0))
    }
}

/// A token bucket kept in one process: what a store that does not share buckets
/// between instances leaves to each (memory, SQLite), and what tests compare a
/// shared one with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalBucket {
    tokens: f64,
    at: Timestamp,
}

impl LocalBucket {
    /// A full bucket for `rate`, as of `now`.
    pub fn full(rate: &KeyRate, now: Timestamp) -> LocalBucket {
        LocalBucket {
            tokens: f64::from(rate.burst),
            at: now,
        }
    }

    /// Takes one token at `now`: `true` when there was one.
    pub fn take(&mut self, rate: &KeyRate, now: Timestamp) -> bool {
        let elapsed = now.as_millis().saturating_sub(self.at.as_millis()) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate.per_second).min(f64::from(rate.burst));
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the bucket is full again if nobody takes from it (rounded up to the
    /// millisecond): all a table that forgets buckets needs to keep of one so that,
    /// recalled with [`LocalBucket::full_at_the_latest`], it never holds more than it
    /// had.
    pub fn full_at(&self, rate: &KeyRate) -> Timestamp {
        let missing = (f64::from(rate.burst) - self.tokens).max(0.0);
        let millis = (missing / rate.per_second * 1000.0).ceil();
        Timestamp::from_millis(
            self.at
                .as_millis()
                .saturating_add(millis.min(i64::MAX as f64) as i64),
        )
    }

    /// A bucket, as of `now`, that is full again at `full_at`: `rate`'s burst less
    /// what it gains back until then, none when that is more than the burst.
    pub fn full_at_the_latest(rate: &KeyRate, full_at: Timestamp, now: Timestamp) -> LocalBucket {
        let missing = full_at.since(now).as_secs_f64() * rate.per_second;
        LocalBucket {
            tokens: (f64::from(rate.burst) - missing).max(0.0),
            at: now,
        }
    }

    /// Whether the bucket is full again at `now` (and so may be forgotten).
    pub fn is_full(&self, rate: &KeyRate, now: Timestamp) -> bool {
        let elapsed = now.as_millis().saturating_sub(self.at.as_millis()) as f64 / 1000.0;
        self.tokens + elapsed * rate.per_second >= f64::from(rate.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let rate: KeyRate = "2/s,3".parse().unwrap();
        let t0 = Timestamp::from_millis(1_000_000);
        let mut b = LocalBucket::full(&rate, t0);
        assert!((0..3).all(|_| b.take(&rate, t0)), "the burst");
        assert!(!b.take(&rate, t0), "empty");
        assert!(!b.take(&rate, t0.plus(Duration::from_millis(400))));
        assert!(
            b.take(&rate, t0.plus(Duration::from_millis(500))),
            "one back"
        );
        assert!(!b.is_full(&rate, t0.plus(Duration::from_millis(500))));
        assert!(b.is_full(&rate, t0.plus(Duration::from_millis(2000))));
        assert_eq!(rate.retry_after(), Duration::from_secs(1));
        assert_eq!(
            "1/min".parse::<KeyRate>().unwrap().retry_after(),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_bucket_recalled_from_when_it_is_full_has_no_more_than_it_had() {
        let rate: KeyRate = "2/s,4".parse().unwrap();
        let t0 = Timestamp::from_millis(1_000_000);
        let mut b = LocalBucket::full(&rate, t0);
        assert_eq!(b.full_at(&rate), t0, "full already");
        assert!((0..3).all(|_| b.take(&rate, t0)));
        assert_eq!(b.full_at(&rate), t0.plus(Duration::from_millis(1500)));
        let later = t0.plus(Duration::from_millis(500));
        let mut recalled = LocalBucket::full_at_the_latest(&rate, b.full_at(&rate), later);
        // One left, one gained back: two, not three.
        assert!(recalled.take(&rate, later) && recalled.take(&rate, later));
        assert!(!recalled.take(&rate, later));
        let mut gone = LocalBucket::full_at_the_latest(&rate, t0.plus(Duration::from_secs(60)), t0);
        assert!(
            !gone.take(&rate, t0),
            "a full_at beyond the burst holds none"
        );
    }

    #[test]
    fn rates_are_parsed_with_their_units_and_refused_clearly() {
        let r: KeyRate = "36000/h".parse().unwrap();
        assert_eq!((r.per_second(), r.burst()), (10.0, 10));
        assert_eq!("0.5/s".parse::<KeyRate>().unwrap().burst(), 1);
        for bad in ["10", "10/week", "x/s", "10/s,0", "10/s,x", "-1/s", "inf/s"] {
            let e = bad.parse::<KeyRate>().unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert_eq!(r.to_string().parse::<KeyRate>().unwrap(), r);
    }
}
