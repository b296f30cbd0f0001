//! CORS headers on the answers the gateway makes itself (a 409, a 422, a 502…), so that
//! a page calling the API from another origin can read them.
//!
//! Cross-origin policy is the upstream's: it answers the preflight (`OPTIONS` passes
//! through) and puts its own CORS headers on its answers, which replays keep. But an
//! answer the gateway makes itself never reaches the upstream, and without
//! `Access-Control-Allow-Origin` a browser hides it from the page: `fetch` fails with a
//! network error instead of showing the 409 and its `Retry-After`, and the page cannot
//! tell "wait and retry" from "the network is down".
//!
//! The gateway allows the request's origin on its own answers only when the browser
//! must have sent a preflight for that request and the upstream must have allowed it,
//! as the request would not have been sent otherwise. A request proves that by what
//! browsers never send without asking first (Fetch standard, "CORS-unsafe request"): a
//! method other than `GET`, `HEAD` and `POST`, or a `Content-Type` other than the
//! three form types. A simple form post from another origin proves nothing of the
//! kind, and its answers get no CORS headers.
//!
//! An `Idempotency-Key` header proves nothing either, although a page's script cannot
//! add one without a preflight: a browser may add it by itself (Firefox adds a quoted
//! number to a POST that has none, `network.http.idempotencyKey.enabled`), and what a
//! browser adds needs no preflight. A form post that carries a key is a form post.
//! The common cross-origin call, a JSON `POST` or a `PATCH`, still proves its
//! preflight by its content type or method, so its 409, 422 and 400 stay readable;
//! a page that posts a form type with a key of its own gets the gateway's own answers
//! as opaque network errors, and should send JSON or handle the upstream's answers only.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response};
use idem_tower::ProblemKind;

/// The request's `Origin`, when the request is one a browser sends only after a
/// preflight the upstream allowed; `None` otherwise, and for requests without one.
pub(crate) fn preflighted_origin(method: &Method, headers: &HeaderMap) -> Option<HeaderValue> {
    let origin = headers.get(header::ORIGIN)?;
    // `Origin: null` (sandboxed frames, some redirects) names no origin to allow.
    if origin.as_bytes() == b"null" {
        return None;
    }
    // Not the `Idempotency-Key`: a browser may add one itself (see the module docs).
    let preflighted = !matches!(*method, Method::GET | Method::HEAD | Method::POST)
        || headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|ct| !is_form_type(ct.as_bytes()));
    preflighted.then(|| origin.clone())
}

/// Whether a `Content-Type` is one a page may send across origins without a preflight.
fn is_form_type(value: &[u8]) -> bool {
    let essence = value.split(|&b| b == b';').next().unwrap_or_default();
    let essence = essence.trim_ascii();
    [
        b"application/x-www-form-urlencoded".as_slice(),
        b"multipart/form-data",
        b"text/plain",
    ]
    .iter()
    .any(|form| essence.eq_ignore_ascii_case(form))
}

/// Adds to one of the gateway's own answers the headers that let `origin` read it:
/// the origin itself, credentials (the preflight allowed them, or the browser ignores
/// this), `Retry-After` exposed where there is one, and `Vary: Origin`. An answer that
/// already allows an origin is left as it is.
pub(crate) fn allow_origin(headers: &mut HeaderMap, origin: HeaderValue) {
    if headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        return;
    }
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
        HeaderValue::from_static("true"),
    );
    if headers.contains_key(header::RETRY_AFTER) {
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("retry-after"),
        );
    }
    headers.append(header::VARY, HeaderValue::from_static("origin"));
}

/// Lets a page read the headers of `published` an answer carries, where the answer
/// lets its origin read it at all (`Access-Control-Allow-Origin`, the upstream's, a
/// replay's or the gateway's own): each one it carries is added to
/// `Access-Control-Expose-Headers` unless already listed there (or `*` is). The
/// gateway's replay marker and retention header are the gateway's to expose: the
/// upstream does not know it writes them.
pub(crate) fn expose(headers: &mut HeaderMap, published: &[header::HeaderName]) {
    if !headers.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        return;
    }
    let listed: Vec<String> = headers
        .get_all(header::ACCESS_CONTROL_EXPOSE_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    if listed.iter().any(|name| name == "*") {
        return;
    }
    let missing: Vec<&str> = published
        .iter()
        .filter(|name| headers.contains_key(*name) && !listed.iter().any(|l| l == name.as_str()))
        .map(|name| name.as_str())
        .collect();
    if missing.is_empty() {
        return;
    }
    let all = listed
        .iter()
        .map(String::as_str)
        .chain(missing)
        .collect::<Vec<_>>()
        .join(", ");
    if let Ok(value) = HeaderValue::from_str(&all) {
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, value);
    }
}

/// [`allow_origin`] on an answer the gateway made itself: one that carries a
/// [`ProblemKind`], the layer's own problems, its answers to the proxy's failures (an
/// unreachable upstream, a timeout) among them, and the front's. Answers that came from the
/// upstream are left alone, and so are the problems the layer records in place of an
/// answer (a 500, or the 502 for an upstream answer too large to record), which carry
/// no kind: the first answer looks as its replays do.
pub(crate) fn allow_origin_on_problem<B>(response: &mut Response<B>, origin: HeaderValue) {
    if response.extensions().get::<ProblemKind>().is_some() {
        allow_origin(response.headers_mut(), origin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    const SHOP: &str = "https://shop.example";

    #[test]
    fn published_headers_an_answer_carries_are_exposed_where_its_origin_may_read_it() {
        let published = [
            header::HeaderName::from_static("idempotency-key"),
            header::HeaderName::from_static("x-idempotent-replayed"),
            header::HeaderName::from_static("idempotency-ttl"),
        ];
        let mut replay = headers(&[
            ("access-control-allow-origin", SHOP),
            ("access-control-expose-headers", "X-Order-Id"),
            ("x-idempotent-replayed", "true"),
            ("idempotency-ttl", "60"),
        ]);
        expose(&mut replay, &published);
        assert_eq!(
            replay["access-control-expose-headers"],
            "x-order-id, x-idempotent-replayed, idempotency-ttl"
        );
        // Once is enough.
        expose(&mut replay, &published);
        assert_eq!(
            replay
                .get_all("access-control-expose-headers")
                .iter()
                .count(),
            1
        );
        assert_eq!(
            replay["access-control-expose-headers"],
            "x-order-id, x-idempotent-replayed, idempotency-ttl"
        );
        // No origin allowed, nothing exposed; a wildcard already exposes everything.
        let mut closed = headers(&[("x-idempotent-replayed", "true")]);
        expose(&mut closed, &published);
        assert!(!closed.contains_key("access-control-expose-headers"));
        let mut open = headers(&[
            ("access-control-allow-origin", "*"),
            ("access-control-expose-headers", "*"),
            ("idempotency-ttl", "60"),
        ]);
        expose(&mut open, &published);
        assert_eq!(open["access-control-expose-headers"], "*");
    }

    /// A method, request headers, and whether they prove a preflight.
    type Case<'a> = (&'a Method, &'a [(&'a str, &'a str)], bool);

    #[test]
    fn only_requests_that_needed_a_preflight_get_their_origin() {
        let cases: [Case; 13] = [
            // Firefox adds a key to a POST that has none, with no preflight: a key,
            // whatever its form, proves nothing.
            (&Method::POST, &[("idempotency-key", "k")], false),
            (
                &Method::POST,
                &[
                    ("idempotency-key", "\"1733077500123\""),
                    ("content-type", "application/x-www-form-urlencoded"),
                ],
                false,
            ),
            (
                &Method::POST,
                &[
                    ("idempotency-key", "k"),
                    ("content-type", "application/json"),
                ],
                true,
            ),
            (&Method::POST, &[("content-type", "application/json")], true),
            (
                &Method::POST,
                &[("content-type", "Application/JSON; charset=utf-8")],
                true,
            ),
            (&Method::PATCH, &[], true),
            (&Method::DELETE, &[], true),
            (&Method::POST, &[], false),
            (&Method::GET, &[], false),
            (&Method::POST, &[("content-type", "text/plain")], false),
            (
                &Method::POST,
                &[("content-type", " Multipart/Form-Data ; boundary=x")],
                false,
            ),
            (
                &Method::POST,
                &[("content-type", "application/x-www-form-urlencoded")],
                false,
            ),
            // Sent by a browser on its own (cached credentials): no proof of a preflight.
            (&Method::POST, &[("authorization", "Basic eDp5")], false),
        ];
        for (method, pairs, expected) in cases {
            let mut h = headers(pairs);
            assert_eq!(preflighted_origin(method, &h), None, "{method} {pairs:?}");
            h.insert(header::ORIGIN, HeaderValue::from_static(SHOP));
            let got = preflighted_origin(method, &h);
            assert_eq!(got.is_some(), expected, "{method} {pairs:?}");
            if let Some(origin) = got {
                assert_eq!(origin, SHOP);
            }
        }
    }

    #[test]
    fn a_null_origin_is_never_allowed() {
        let h = headers(&[("origin", "null"), ("content-type", "application/json")]);
        assert_eq!(preflighted_origin(&Method::POST, &h), None);
    }

    #[test]
    fn allowing_adds_the_origin_credentials_vary_and_exposes_retry_after() {
        let mut h = headers(&[("retry-after", "3"), ("vary", "accept-encoding")]);
        allow_origin(&mut h, HeaderValue::from_static(SHOP));
        assert_eq!(h["access-control-allow-origin"], SHOP);
        assert_eq!(h["access-control-allow-credentials"], "true");
        assert_eq!(h["access-control-expose-headers"], "retry-after");
        let vary: Vec<_> = h.get_all("vary").iter().collect();
        assert_eq!(vary, ["accept-encoding", "origin"]);

        let mut h = HeaderMap::new();
        allow_origin(&mut h, HeaderValue::from_static(SHOP));
        assert!(!h.contains_key("access-control-expose-headers"));
    }

    #[test]
    fn an_answer_that_allows_an_origin_already_is_left_alone() {
        let mut h = headers(&[("access-control-allow-origin", "https://other.example")]);
        allow_origin(&mut h, HeaderValue::from_static(SHOP));
        assert_eq!(h["access-control-allow-origin"], "https://other.example");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn only_the_layers_problems_are_touched() {
        let mut upstream = Response::new(());
        allow_origin_on_problem(&mut upstream, HeaderValue::from_static(SHOP));
        assert!(upstream.headers().is_empty());

        let mut problem = Response::new(());
        problem
            .extensions_mut()
            .insert(ProblemKind::RequestInProgress);
        allow_origin_on_problem(&mut problem, HeaderValue::from_static(SHOP));
        assert_eq!(problem.headers()["access-control-allow-origin"], SHOP);
    }
}
