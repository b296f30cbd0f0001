//! The syntax of setting values, one parser per kind of value, shared by the command
//! line, the environment and the TOML file so that each spelling means the same
//! wherever it is written.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idem_tower::ReleaseStatuses;

use super::error::{ConfigError, invalid};

/// Parses a humantime duration (`500ms`, `2s`, `24h`, `1h 30m`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (examples: 500ms, 2s, 24h)"))
}

/// Parses a byte count: `1048576`, `64KiB`, `1MiB`, `2MB`, `1GiB` (binary units for
/// `Ki`/`Mi`/`Gi` and for bare `K`/`M`/`G`, decimal for `KB`/`MB`/`GB`).
pub(crate) fn parse_byte_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (examples: 65536, 64KiB, 1MiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?} (use B, KiB, MiB, GiB)"
            ));
        }
    };
    num.checked_mul(mult)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Methods as listed, in upper case; blank items are skipped.
pub(crate) fn parse_methods(list: &[String], setting: &str) -> Result<Vec<Method>, ConfigError> {
    list.iter()
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
        .map(|m| {
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|e| invalid(setting, format!("{m:?}: {e}")))
        })
        .collect()
}

/// `grpc_release_codes` as given (setting `what`): gRPC status names or numbers, or
/// `none` alone for none.
pub(crate) fn parse_grpc_release_codes(
    list: &[String],
    what: &str,
) -> Result<idem_tower::GrpcReleaseCodes, ConfigError> {
    let list: Vec<&str> = list
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    match list[..] {
        [] => return Err(invalid(what, "names no status; write `none` for none")),
        [only] if only.eq_ignore_ascii_case("none") => {
            return Ok(idem_tower::GrpcReleaseCodes::new([]));
        }
        _ => {}
    }
    idem_tower::GrpcReleaseCodes::parse(list).map_err(|e| invalid(what, e))
}

/// `release_statuses` as given: status codes, or `none` alone for none.
pub(crate) fn parse_release_statuses(list: &[String]) -> Result<ReleaseStatuses, ConfigError> {
    let items: Vec<&str> = list
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    match items.as_slice() {
        [] => {
            return Err(invalid(
                "release_statuses",
                "the list is empty; give status codes, or none to record every answer",
            ));
        }
        [only] if only.eq_ignore_ascii_case("none") => return Ok(ReleaseStatuses::new([])),
        _ => {}
    }
    let codes = items
        .iter()
        .map(|s| {
            s.parse::<u16>().map_err(|_| {
                invalid(
                    "release_statuses",
                    format!("{s:?} is not a status code (give e.g. 409,429,503, or none)"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_release_statuses(codes, "release_statuses")
}

/// Admits only 4xx and 5xx: any other answer says the request was executed, and
/// releasing it would let a retry execute it again.
pub(crate) fn check_release_statuses(
    codes: Vec<u16>,
    setting: &str,
) -> Result<ReleaseStatuses, ConfigError> {
    codes
        .into_iter()
        .map(|code| match code {
            400..=599 => Ok(StatusCode::from_u16(code).expect("400-599 are status codes")),
            _ => Err(invalid(
                setting,
                format!(
                    "{code}: only 4xx and 5xx answers can release a key; any other status \
                     means the request was executed, and a retry would execute it again"
                ),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(ReleaseStatuses::new)
}

/// The tenant headers as given: names, in order, without repeats.
pub(crate) fn parse_tenant_headers(list: &[String]) -> Result<Vec<HeaderName>, ConfigError> {
    let mut names: Vec<HeaderName> = Vec::new();
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let name = HeaderName::try_from(item)
            .map_err(|e| invalid("tenant_header", format!("{item:?}: {e}")))?;
        if names.contains(&name) {
            return Err(invalid(
                "tenant_header",
                format!("{item:?} is listed twice"),
            ));
        }
        names.push(name);
    }
    if names.is_empty() {
        return Err(invalid(
            "tenant_header",
            "the list is empty; name at least one header, e.g. Authorization",
        ));
    }
    Ok(names)
}

/// Parses `--listen`: `IP:PORT`, or a bare port, which listens on loopback (127.0.0.1),
/// as `--admin` does.
pub(crate) fn parse_listen_addr(s: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(port) = s.trim().parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.trim().parse().map_err(|_| {
        invalid(
            "listen",
            format!("{s:?}: expected IP:PORT, e.g. 127.0.0.1:8080 or [::]:8080, or a port"),
        )
    })
}

/// An admin address: `ADDR:PORT`, or a bare port bound to loopback.
pub(crate) fn parse_admin_addr(s: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(port) = s.trim().parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.trim()
        .parse()
        .map_err(|e| invalid("admin", format!("{s:?}: {e}")))
}

/// A route's `key_header` list: header names, at least one, each once.
pub(super) fn parse_key_headers(list: &[String]) -> Result<Vec<http::HeaderName>, String> {
    let mut names: Vec<http::HeaderName> = Vec::new();
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let name = http::HeaderName::from_bytes(item.to_ascii_lowercase().as_bytes())
            .map_err(|_| format!("key_header: {item:?} is no header name"))?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err("key_header names no header".to_owned());
    }
    Ok(names)
}

/// `request_id_header` as given: a header name that is neither hop-by-hop nor one the
/// gateway writes itself; the default when not given.
pub(super) fn parse_request_id_header(name: Option<&str>) -> Result<http::HeaderName, ConfigError> {
    let name = name
        .unwrap_or(crate::access::DEFAULT_REQUEST_ID_HEADER)
        .trim();
    let header = http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
        .map_err(|_| invalid("request_id_header", format!("{name:?} is no header name")))?;
    let reserved = [
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "authorization",
        "cookie",
        "set-cookie",
        "idempotency-key",
        "idempotency-attempt",
        "idempotent-replayed",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
    ];
    if reserved.contains(&header.as_str()) {
        return Err(invalid(
            "request_id_header",
            format!("{name:?} carries something else; name a header of its own (x-request-id)"),
        ));
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_an_address_or_a_bare_port_on_loopback() {
        assert_eq!(
            parse_listen_addr("8081").unwrap(),
            "127.0.0.1:8081".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::]:8080").unwrap(),
            "[::]:8080".parse().unwrap()
        );
        let e = parse_listen_addr("localhost:8080").unwrap_err().to_string();
        assert!(e.contains("IP:PORT, e.g. 127.0.0.1:8080"), "{e}");
    }

    #[test]
    fn admin_bare_port_binds_loopback() {
        assert_eq!(
            parse_admin_addr("9091").unwrap(),
            "127.0.0.1:9091".parse().unwrap()
        );
        assert_eq!(
            parse_admin_addr("[::1]:9091").unwrap(),
            "[::1]:9091".parse().unwrap()
        );
    }

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!(parse_byte_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_byte_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_byte_size("65536"), Ok(65536));
        assert_eq!(parse_byte_size("2MB"), Ok(2_000_000));
        assert!(parse_byte_size("lots").is_err());
        assert!(parse_byte_size("1PiB").is_err());
    }
}
