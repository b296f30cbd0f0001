//! The listeners' settings resolved: TLS files in pairs, HTTP/2 limits over their
//! defaults.

use std::path::PathBuf;

use super::ServeArgs;
use super::error::{ConfigError, invalid};
use crate::listener::{Http2Limits, TlsFiles};

/// The proxy listener's certificate and key, and the CA of client certificates, which
/// needs them.
pub(super) fn tls(a: &ServeArgs) -> Result<Option<TlsFiles>, ConfigError> {
    match (
        tls_files("tls", a.tls_cert.clone(), a.tls_key.clone())?,
        &a.tls_client_ca,
    ) {
        (Some(files), client_ca) => Ok(Some(TlsFiles {
            client_ca: client_ca.clone(),
            ..files
        })),
        (None, Some(_)) => Err(invalid("tls_client_ca", "needs tls_cert and tls_key")),
        (None, None) => Ok(None),
    }
}

/// The admin listener's certificate and key.
pub(super) fn admin_tls(a: &ServeArgs) -> Result<Option<TlsFiles>, ConfigError> {
    tls_files(
        "admin_tls",
        a.admin_tls_cert.clone(),
        a.admin_tls_key.clone(),
    )
}

/// A listener's certificate and key: both or neither.
fn tls_files(
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

/// The `http2_*` limits given, over the defaults.
pub(super) fn http2(a: &ServeArgs) -> Result<Http2Limits, ConfigError> {
    let defaults = Http2Limits::default();
    let max_header_list_size = match a.http2_max_header_list_size {
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
    let keepalive_timeout = a
        .http2_keepalive_timeout
        .unwrap_or(defaults.keepalive_timeout);
    if keepalive_timeout.is_zero() {
        return Err(invalid(
            "http2_keepalive_timeout",
            "must be longer than zero; --http2-keepalive-interval 0s turns the pings off",
        ));
    }
    let answer_budget = a.http2_answer_budget.unwrap_or(defaults.answer_budget);
    if answer_budget == 0 {
        return Err(invalid("http2_answer_budget", "must be more than zero"));
    }
    Ok(Http2Limits {
        answer_budget,
        max_concurrent_streams: a
            .http2_max_concurrent_streams
            .unwrap_or(defaults.max_concurrent_streams),
        max_header_list_size,
        keepalive_interval: match a.http2_keepalive_interval {
            Some(t) if t.is_zero() => None,
            Some(t) => Some(t),
            None => defaults.keepalive_interval,
        },
        keepalive_timeout,
    })
}
