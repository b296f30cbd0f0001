//! The settings and the shared timer of the access log, below the modules that use
//! them (the configuration, the proxy and the serving front, see [`crate::serve`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The header that carries the request id unless `--request-id-header` names another.
pub(crate) const DEFAULT_REQUEST_ID_HEADER: &str = "x-request-id";

/// The longest request id taken from a client.
pub(crate) const MAX_REQUEST_ID_LEN: usize = 128;

/// Whether, and how often, requests are logged (`--access-log`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AccessLog {
    /// No line per request.
    Off,
    /// A line for about this fraction of requests, chosen at random: 1.0 for every one.
    Sampled(f64),
}

impl AccessLog {
    /// `on` (every request), `off`, or a fraction between 0 and 1 (`0.1`: one request
    /// in ten, at random).
    pub(crate) fn parse(value: &str) -> Result<AccessLog, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "on" | "true" => Ok(AccessLog::Sampled(1.0)),
            "off" | "false" => Ok(AccessLog::Off),
            other => match other.parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => Ok(if f == 0.0 {
                    AccessLog::Off
                } else {
                    AccessLog::Sampled(f)
                }),
                _ => Err(format!(
                    "{value:?}: expected on, off, or the fraction of requests to log (0.1)"
                )),
            },
        }
    }

    /// Whether to log the next request.
    pub(crate) fn pick(self) -> bool {
        match self {
            AccessLog::Off => false,
            AccessLog::Sampled(f) if f >= 1.0 => true,
            AccessLog::Sampled(f) => {
                let draw = getrandom::u64().unwrap_or(0) >> 11;
                (draw as f64) < f * (1u64 << 53) as f64
            }
        }
    }
}

impl std::fmt::Display for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccessLog::Off => f.write_str("off"),
            AccessLog::Sampled(r) if *r >= 1.0 => f.write_str("on"),
            AccessLog::Sampled(r) => write!(f, "{r}"),
        }
    }
}

/// The time from sending a request upstream to its answer's head, noted by the proxy
/// in the request's extensions for the access log (microseconds; `u64::MAX` until
/// then).
#[derive(Debug, Clone)]
pub(crate) struct UpstreamTime(Arc<AtomicU64>);

impl UpstreamTime {
    pub(crate) fn new() -> UpstreamTime {
        UpstreamTime(Arc::new(AtomicU64::new(u64::MAX)))
    }

    /// Notes that the upstream's answer head came `elapsed` after the request was sent.
    pub(crate) fn answered(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX - 1);
        self.0.store(micros, Ordering::Relaxed);
    }

    pub(crate) fn millis(&self) -> Option<f64> {
        match self.0.load(Ordering::Relaxed) {
            u64::MAX => None,
            micros => Some(micros as f64 / 1000.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_log_setting_reads_on_off_and_fractions() {
        assert_eq!(AccessLog::parse("on"), Ok(AccessLog::Sampled(1.0)));
        assert_eq!(AccessLog::parse("OFF"), Ok(AccessLog::Off));
        assert_eq!(AccessLog::parse("0.25"), Ok(AccessLog::Sampled(0.25)));
        assert_eq!(AccessLog::parse("0"), Ok(AccessLog::Off));
        assert!(AccessLog::parse("1.5").is_err());
        assert!(AccessLog::parse("sometimes").is_err());
        assert_eq!(AccessLog::Sampled(0.25).to_string(), "0.25");
        let picked = (0..10_000)
            .filter(|_| AccessLog::Sampled(0.25).pick())
            .count();
        assert!(
            (2_000..3_000).contains(&picked),
            "{picked} of 10000 at 0.25"
        );
    }
}
