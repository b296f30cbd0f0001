//! The listeners' settings resolved: TLS files in pairs, HTTP/2 limits over their
//! defaults.

use std::path::PathBuf;
use std::time::Duration;

use super::error::{ConfigError, invalid};
use crate::listener::{Http2Limits, TlsFiles};

/// A listener's certificate and key: both or neither.
pub(super) fn tls_files(
    setting: &str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<TlsFiles>, ConfigError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert,
            key,
            client_ca: None,
        })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(invalid(
            format!("{setting}_key"),
            format!("required with {setting}_cert"),
        )),
        (None, Some(_)) => Err(invalid(
            format!("{setting}_cert"),
            format!("required with {setting}_key"),
        )),
    }
}

/// The HTTP/2 limits given, over the defaults.
pub(super) fn http2_limits(
    max_concurrent_streams: Option<u32>,
    max_header_list_size: Option<usize>,
    keepalive_interval: Option<Duration>,
    keepalive_timeout: Option<Duration>,
    answer_budget: Option<usize>,
) -> Result<Http2Limits, ConfigError> {
    let defaults = Http2Limits::default();
    let max_header_list_size = match max_header_list_size {
        None => defaults.max_header_list_size,
        Some(n) => match u32::try_from(n) {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(invalid(
                    "http2_max_header_list_size",
                    "must be more than zero and less than 4GiB",
                ));
            }
        },
    };
    let keepalive_timeout = keepalive_timeout.unwrap_or(defaults.keepalive_timeout);
    if keepalive_timeout.is_zero() {
        return Err(invalid(
            "http2_keepalive_timeout",
            "must be longer than zero; --http2-keepalive-interval 0s turns the pings off",
        ));
    }
    let answer_budget = answer_budget.unwrap_or(defaults.answer_budget);
    if answer_budget == 0 {
        return Err(invalid("http2_answer_budget", "must be more than zero"));
    }
    Ok(Http2Limits {
        answer_budget,
        max_concurrent_streams: max_concurrent_streams.unwrap_or(defaults.max_concurrent_streams),
        max_header_list_size,
        keepalive_interval: match keepalive_interval {
            Some(t) if t.is_zero() => None,
            Some(t) => Some(t),
            None => defaults.keepalive_interval,
        },
        keepalive_timeout,
    })
}
