//! The gateway's own hop, added to what a request's `Forwarded` and `X-Forwarded-*`
//! headers say of the hops before it.

use std::net::{IpAddr, Ipv4Addr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Appends the client to `X-Forwarded-For` and `Forwarded` and records the original
/// host and protocol.
///
/// What the client sent in either is kept (several fields joined with `", "`, as one
/// list) only if it parses ([`super::parse`]); otherwise it is dropped, with a
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
        super::is_valid,
        64 + 2 * host_len,
    );
    if let Some(ip) = client {
        let mut xff = prior(
            headers,
            &X_FORWARDED_FOR,
            super::x_forwarded_for_is_valid,
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
