//! The request and answer headers the proxy strips or sets on the way: hop-by-hop
//! headers (RFC 9110 §7.6.1), the client's rewrite headers and look-alikes, and the
//! `Forwarded` and `X-Forwarded-*` headers of the gateway's hop.

use std::net::{IpAddr, Ipv4Addr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Whether `name` is a header that concerns one connection, never forwarded (RFC 9110
/// §7.6.1, plus the non-standard `proxy-connection` and `keep-alive` that old clients
/// send).
///
/// A match on the name, not a `const` array of `HeaderName`s: each use of such a
/// constant builds the array and drops it again, which on every header of every
/// message cost more than the comparisons.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Request headers by which some upstream stacks take the path from the header rather
/// than the request line (IIS's URL rewriting, Symfony and Zend before they stopped).
/// A client's would route the request past the path the gateway normalised, matched
/// its rules on and scoped its key by, so they are never forwarded.
pub const REWRITE_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
];

/// The request headers the gateway sets itself, whose look-alikes with `_` for `-` a
/// client may not send (see [`strip_look_alikes`]).
const SET_BY_THE_GATEWAY: [&str; 5] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "idempotency-attempt",
    "host",
];

/// Removes the client's headers that are named as one the gateway sets is, but with
/// `_` for `-` (`X_Forwarded_For`, `Idempotency_Attempt`): CGI and WSGI servers, and
/// nginx with `underscores_in_headers`, read them as the header itself, so a client
/// could pass for another address, or make a first attempt look recovered. Other
/// names with `_` pass; names are lower case in a `HeaderMap`.
pub fn strip_look_alikes(headers: &mut HeaderMap) {
    let folded = |name: &HeaderName| name.as_str().replace('_', "-");
    let look_alikes: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().contains('_'))
        .filter(|name| SET_BY_THE_GATEWAY.contains(&folded(name).as_str()))
        .cloned()
        .collect();
    for name in &look_alikes {
        tracing::debug!(header = %name, "dropped a look-alike of a header the gateway sets");
        headers.remove(name);
    }
}

/// The comma-separated options of the `Connection` header fields, trimmed.
pub(super) fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
///
/// Twice per forwarded request, and most messages carry none of them: one pass over
/// the names present finds what to remove, rather than a hashed removal for each of
/// the nine names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut present: Vec<HeaderName> = headers
        .keys()
        .filter(|name| is_hop_by_hop(name))
        .cloned()
        .collect();
    if present.contains(&header::CONNECTION) {
        present.extend(
            connection_options(headers)
                .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok()),
        );
    }
    for name in &present {
        headers.remove(name);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Appends the client to `X-Forwarded-For` and `Forwarded` and records the original
/// host and protocol.
///
/// What the client sent in either is kept (several fields joined with `", "`, as one
/// list) only if it parses ([`crate::forwarded`]); otherwise it is dropped, with a
/// debug log line, and the upstream gets the gateway's hop alone: appended to a broken
/// value, the gateway's element could end up inside the client's open quote.
///
/// On every forwarded request, so built without a `format!` or a header-name parse:
/// each value is written once into a buffer sized for it.
pub fn add_forwarded(headers: &mut HeaderMap, client: Option<IpAddr>, host: Option<&HeaderValue>) {
    use std::fmt::Write as _;
    // Each value starts with room for what is appended to it (an IPv6 address, the
    // host with every character escaped), so it is allocated once.
    let host_len = host.map_or(0, HeaderValue::len);
    let prior = |headers: &HeaderMap, name: &HeaderName, valid: fn(&str) -> bool, room: usize| {
        let fields = headers.get_all(name);
        let mut value =
            String::with_capacity(fields.iter().map(|v| v.len() + 2).sum::<usize>() + room);
        let mut visible = true;
        for field in fields {
            match field.to_str() {
                Ok(text) => {
                    if !value.is_empty() {
                        value.push_str(", ");
                    }
                    value.push_str(text);
                }
                Err(_) => visible = false,
            }
        }
        if value.trim().is_empty() && visible {
            value.clear();
        } else if visible && valid(&value) {
            value.push_str(", ");
        } else {
            tracing::debug!(
                header = %name,
                "dropped the client's value, which does not parse, before adding this hop"
            );
            value.clear();
        }
        value
    };
    let mut forwarded = prior(
        headers,
        &header::FORWARDED,
        crate::forwarded::is_valid,
        64 + 2 * host_len,
    );
    if let Some(ip) = client {
        let mut xff = prior(
            headers,
            &X_FORWARDED_FOR,
            crate::forwarded::x_forwarded_for_is_valid,
            48,
        );
        match ip {
            IpAddr::V4(v4) => {
                push_ipv4(&mut xff, v4);
                forwarded.push_str("for=");
                push_ipv4(&mut forwarded, v4);
                forwarded.push(';');
            }
            IpAddr::V6(v6) => {
                write!(xff, "{v6}").expect("writing to a String");
                write!(forwarded, "for=\"[{v6}]\";").expect("writing to a String");
            }
        }
        if let Ok(v) = HeaderValue::try_from(xff) {
            headers.insert(X_FORWARDED_FOR, v);
        }
    }
    forwarded.push_str("proto=http");
    if let Some(h) = host.and_then(|h| h.to_str().ok()) {
        forwarded.push_str(";host=\"");
        for c in h.chars() {
            if matches!(c, '\\' | '"') {
                forwarded.push('\\');
            }
            forwarded.push(c);
        }
        forwarded.push('"');
        headers.insert(X_FORWARDED_HOST, host.cloned().expect("checked"));
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    if let Ok(v) = HeaderValue::try_from(forwarded) {
        headers.insert(header::FORWARDED, v);
    }
}

/// Writes `ip` in dotted-decimal, as its `Display` does: that goes through the
/// formatting machinery octet by octet, which on pass-through traffic cost as much as
/// the rest of the forwarding headers together.
fn push_ipv4(out: &mut String, ip: Ipv4Addr) {
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_connection_named_ones_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret-Hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic x"),
        );
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut h);
        // The order of fields with different names carries no meaning (RFC 9110 §5.3).
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn look_alikes_of_the_gateways_headers_are_dropped() {
        let mut h = HeaderMap::new();
        for name in [
            "x_forwarded_for",
            "x-forwarded_host",
            "X_Forwarded_Proto",
            "idempotency_attempt",
            "x_request_id",
            "x-forwarded-for",
        ] {
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        strip_look_alikes(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-forwarded-for", "x_request_id"]);
    }

    #[test]
    fn forwarded_headers_append_to_prior_hops() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        h.insert(
            header::FORWARDED,
            HeaderValue::from_static("for=203.0.113.9"),
        );
        let host = HeaderValue::from_static("api.example:8080");
        add_forwarded(&mut h, Some("127.0.0.1".parse().unwrap()), Some(&host));
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
        assert_eq!(
            h[header::FORWARDED],
            "for=203.0.113.9, for=127.0.0.1;proto=http;host=\"api.example:8080\""
        );
        assert_eq!(h["x-forwarded-host"], "api.example:8080");
        assert_eq!(h["x-forwarded-proto"], "http");

        let mut h = HeaderMap::new();
        add_forwarded(&mut h, Some("::1".parse().unwrap()), None);
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h[header::FORWARDED], "for=\"[::1]\";proto=http");

        // A quoted-string escapes its quote and backslash; no client, no `for=`.
        let mut h = HeaderMap::new();
        let host = HeaderValue::from_static(r#"a"b\c"#);
        add_forwarded(&mut h, None, Some(&host));
        assert_eq!(h[header::FORWARDED], r#"proto=http;host="a\"b\\c""#);
        assert!(h.get("x-forwarded-for").is_none());
    }

    /// A client value that does not parse is dropped, so the gateway's element cannot
    /// end up inside the client's quoted-string; several fields are one list.
    #[test]
    fn broken_client_forwarded_values_are_dropped_and_fields_joined() {
        let client = Some("127.0.0.1".parse().unwrap());
        let ours = "for=127.0.0.1;proto=http";
        let cases: [(&[&str], &str); 6] = [
            (&[r#"for="6.6.6.6"#], ours),
            (&[r#"for="6.6.6.6\"#], ours),
            (&["for=a;for=b"], ours),
            (&["for=1.2.3.4", r#"for="5"#], ours),
            (
                &["for=1.2.3.4", "for=5.6.7.8"],
                "for=1.2.3.4, for=5.6.7.8, for=127.0.0.1;proto=http",
            ),
            (
                &[r#"for="a,b";by=c"#],
                r#"for="a,b";by=c, for=127.0.0.1;proto=http"#,
            ),
        ];
        for (fields, want) in cases {
            let mut h = HeaderMap::new();
            for f in fields {
                h.append(header::FORWARDED, HeaderValue::from_str(f).unwrap());
            }
            add_forwarded(&mut h, client, None);
            let got: Vec<_> = h.get_all(header::FORWARDED).iter().collect();
            assert_eq!(got, [want], "{fields:?}");
        }
        // Not visible ASCII: not a value the gateway can vouch for either.
        let mut h = HeaderMap::new();
        h.insert(
            header::FORWARDED,
            HeaderValue::from_bytes(b"for=\"\xff\"").unwrap(),
        );
        add_forwarded(&mut h, client, None);
        assert_eq!(h[header::FORWARDED], ours);
    }

    #[test]
    fn garbage_in_x_forwarded_for_is_dropped_and_fields_joined() {
        let client = Some("127.0.0.1".parse().unwrap());
        let cases: [(&[&str], &str); 5] = [
            (&["203.0.113.7"], "203.0.113.7, 127.0.0.1"),
            (
                &["203.0.113.7", "10.0.0.1"],
                "203.0.113.7, 10.0.0.1, 127.0.0.1",
            ),
            (&["203.0.113.7, evil"], "127.0.0.1"),
            (&["203.0.113.7", "\"x"], "127.0.0.1"),
            (&[" "], "127.0.0.1"),
        ];
        for (fields, want) in cases {
            let mut h = HeaderMap::new();
            for f in fields {
                h.append("x-forwarded-for", HeaderValue::from_str(f).unwrap());
            }
            add_forwarded(&mut h, client, None);
            let got: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
            assert_eq!(got, [want], "{fields:?}");
        }
    }

    #[test]
    fn ipv4_is_written_as_display_writes_it() {
        for octet in 0..=255u8 {
            for ip in [
                Ipv4Addr::new(octet, 0, 100, 9),
                Ipv4Addr::new(10, octet, 255, 1),
                Ipv4Addr::new(192, 168, octet, 99),
                Ipv4Addr::new(0, 255, 10, octet),
            ] {
                let mut out = String::from("x");
                push_ipv4(&mut out, ip);
                assert_eq!(out, format!("x{ip}"));
            }
        }
    }
}
