//! Whether an attempt's result is worth another attempt with the same key (SPEC S11).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode, header::RETRY_AFTER};
use idem_core::Timestamp;

/// Whether to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retryable {
    /// The failure may pass: try again with the same key, after the server's
    /// `Retry-After` or the backoff.
    Transient,
    /// Trying again would get the same answer: stop.
    Fatal,
}

/// Classifies attempts. Override a hook to change one case and keep the rest. The
/// defaults:
///
/// | result                                   | classification |
/// |------------------------------------------|----------------|
/// | connection refused/reset/closed, timeout | `Transient` (backoff) |
/// | 502, 504                                 | `Transient` (backoff) |
/// | 409 (another attempt holds the key)      | `Transient` (server's `Retry-After`, else backoff; after the first attempt, not counted against `max_attempts` or the budget) |
/// | 429, 503                                 | `Transient` (server's `Retry-After`, else backoff) |
/// | 400, 422                                 | `Fatal`: returned as [`Error::InvalidKey`](crate::Error::InvalidKey), [`Error::KeyReused`](crate::Error::KeyReused) or [`Error::Rejected`](crate::Error::Rejected) |
/// | 410 `key-expired`                        | `Fatal`: returned as [`Error::KeyExpired`](crate::Error::KeyExpired) |
/// | anything else                            | `Fatal`: returned as the answer |
/// | an invalid request or a redirect error   | `Fatal` |
///
/// A retried answer's `Retry-After`, when present, sets the wait exactly; otherwise the
/// wait is drawn by the backoff.
///
/// ```
/// use http::StatusCode;
/// use idem_client::{Classify, Retryable};
///
/// /// An upstream whose load balancer answers 500 while it restarts.
/// #[derive(Debug)]
/// struct Retry500Too;
///
/// impl Classify for Retry500Too {
///     fn classify_status(&self, status: StatusCode, headers: &http::HeaderMap) -> Retryable {
///         if status == StatusCode::INTERNAL_SERVER_ERROR {
///             return Retryable::Transient;
///         }
///         idem_client::DefaultClassifier.classify_status(status, headers)
///     }
/// }
/// ```
pub trait Classify: Send + Sync + fmt::Debug + 'static {
    /// Classifies an answer by its status and headers.
    fn classify_status(&self, status: StatusCode, headers: &HeaderMap) -> Retryable {
        let _ = headers;
        match status {
            StatusCode::CONFLICT
            | StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => Retryable::Transient,
            _ => Retryable::Fatal,
        }
    }

    /// Classifies a failure to get an answer.
    fn classify_error(&self, error: &reqwest::Error) -> Retryable {
        // A request that could not be built, or a redirect loop, fails the same way
        // every time. Everything else is the network: connect, send, timeout, a body
        // cut short. The server may have executed; the same key makes the retry safe.
        if error.is_builder() || error.is_redirect() {
            Retryable::Fatal
        } else {
            Retryable::Transient
        }
    }
}

/// The default classification of [`Classify`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {}

/// The wait a `Retry-After` header asks for, relative to `now`: delta-seconds
/// (`Retry-After: 1`) or an HTTP-date (RFC 9110 §10.2.3). `None` when absent or
/// unreadable; a date in the past is a zero wait.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue, header::RETRY_AFTER};
/// use idem_core::Timestamp;
///
/// let mut headers = HeaderMap::new();
/// headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
/// let now = Timestamp::from_millis(0);
/// assert_eq!(idem_client::retry_after(&headers, now), Some(Duration::from_secs(7)));
/// ```
pub fn retry_after(headers: &HeaderMap, now: Timestamp) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let now = UNIX_EPOCH + Duration::from_millis(now.as_millis().max(0) as u64);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `t` as an HTTP-date, for servers and tests that send dated `Retry-After`s.
pub fn http_date(t: Timestamp) -> String {
    let at: SystemTime = UNIX_EPOCH + Duration::from_millis(t.as_millis().max(0) as u64);
    httpdate::fmt_http_date(at)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(retry_after: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(retry_after).unwrap());
        h
    }

    #[test]
    fn statuses_are_classified_as_specified() {
        let c = DefaultClassifier;
        let none = HeaderMap::new();
        for s in [409, 429, 502, 503, 504] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(c.classify_status(s, &none), Retryable::Transient, "{s}");
        }
        for s in [200, 201, 302, 400, 401, 402, 403, 404, 413, 422, 500, 501] {
            let s = StatusCode::from_u16(s).unwrap();
            assert_eq!(c.classify_status(s, &none), Retryable::Fatal, "{s}");
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        assert_eq!(
            retry_after(&headers("1"), now),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after(&headers(" 120 "), now),
            Some(Duration::from_secs(120))
        );
        let later = http_date(now.plus(Duration::from_secs(30)));
        assert_eq!(
            retry_after(&headers(&later), now),
            Some(Duration::from_secs(30))
        );
        let earlier = http_date(Timestamp::from_millis(1_600_000_000_000));
        assert_eq!(retry_after(&headers(&earlier), now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&headers("-1"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
