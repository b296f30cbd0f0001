//! The request and answer headers the proxy strips on the way: hop-by-hop headers
//! (RFC 9110 §7.6.1), the client's rewrite headers and look-alikes. The `Forwarded`
//! and `X-Forwarded-*` headers of the gateway's hop are [`crate::forwarded`]'s.

use http::header::{self, HeaderMap, HeaderName};

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
pub(crate) const REWRITE_HEADERS: [HeaderName; 2] = [
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
pub(crate) fn strip_look_alikes(headers: &mut HeaderMap) {
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
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
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

#[cfg(test)]
mod tests {
    use http::header::HeaderValue;

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
}
