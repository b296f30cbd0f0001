//! A keyed route that reads its body (issue 61 item 1): a key at a `key_pointer`, `ignore`
//! pointers, `canonical_json = "jcs"`. A JSON body the gateway cannot read there is a 400
//! `unreadable-json` that reaches nobody, never a request forwarded unkeyed (which the
//! upstream's own parser may read a key from, and execute on every retry), and never one
//! fingerprinted as raw bytes where the route meant to leave fields out or compare by JCS.

use crate::common::{Answer, Gateway, Http, Upstream, new_key};

/// The most arrays and objects nested in one another that the gateway reads.
const MAX_DEPTH: usize = 10_000;

const ROUTES: &str = "\
[[route]]\npath = \"/bk/{*rest}\"\nkey_pointer = \"/idempotency_key\"\n\n\
[[route]]\npath = \"/jcs/{*rest}\"\ncanonical_json = \"jcs\"\n\n\
[[route]]\npath = \"/ignoring/{*rest}\"\nignore = [\"/sent_at\"]\n\n\
[[route]]\npath = \"/stripe/{*rest}\"\nkey_pointer = \"/idempotency_key\"\nprofile = \"stripe\"\n";

struct Rig {
    up: Upstream,
    gw: Gateway,
    http: Http,
    _dir: tempfile::TempDir,
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("idem.toml"), ROUTES).unwrap();
    let up = Upstream::start().await;
    let args = ["--store", "memory://", "--config", "idem.toml"];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    Rig {
        up,
        gw,
        http: Http::new(),
        _dir: dir,
    }
}

impl Rig {
    async fn post(&self, path: &str, key: Option<&str>, body: Vec<u8>) -> Answer {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(key) = key {
            headers.push(("idempotency-key", key));
        }
        self.http
            .send("POST", &self.gw.url(path), &headers, body)
            .await
    }
}

/// The detail of the 400 for a body unreadable for `reason`.
fn detail(reason: &str) -> String {
    format!(
        "the JSON body cannot be read: {reason}; this route reads its key or its \
         fingerprint from the body, so a body idem cannot read is refused rather than \
         passed on unkeyed; nothing was reserved or forwarded"
    )
}

/// Asserts `answer` is the 400 `unreadable-json` for `reason`, in problem+json.
fn assert_unreadable(answer: &Answer, reason: &str) {
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    let body = answer.json();
    assert_eq!(body["type"], "https://idem.dev/problems/unreadable-json");
    assert_eq!(body["title"], "JSON body cannot be read");
    assert_eq!(body["status"], 400);
    assert_eq!(body["detail"], detail(reason), "{body}");
}

/// A body with the key `key` at `/idempotency_key`, and `note` as the raw bytes of a
/// member's JSON value; the offset of `note` in it.
fn keyed_body(key: &str, note: &[u8]) -> (Vec<u8>, usize) {
    let mut body = format!(r#"{{"idempotency_key":"{key}","note":"#).into_bytes();
    let at = body.len();
    body.extend_from_slice(note);
    body.extend_from_slice(br#","amount":100}"#);
    (body, at)
}

/// `levels` arrays nested in one another.
fn nested(levels: usize) -> Vec<u8> {
    let mut v = vec![b'['; levels];
    v.resize(2 * levels, b']');
    v
}

/// The three ways in: a lone surrogate escape, which JavaScript's `JSON.stringify` writes
/// for a string cut inside an emoji; nesting past the gateway's limit; a byte that is not
/// UTF-8. Each with the reason the 400 gives, at the offset of `note`.
fn ways_in(key: &str) -> Vec<(&'static str, Vec<u8>, String)> {
    let (surrogate, at) = keyed_body(key, br#""\ud800""#);
    let surrogate_reason = format!(
        "the escape at byte {} is half of a surrogate pair without its other half",
        at + 1
    );
    // The body's own object is the first level.
    let (deep, at) = keyed_body(key, &nested(MAX_DEPTH));
    let deep_reason = format!(
        "arrays and objects nest deeper than 10000 levels (at byte {})",
        at + MAX_DEPTH - 1
    );
    let (latin1, at) = keyed_body(key, b"\"caf\xe9\"");
    let latin1_reason = format!("byte {} is not UTF-8", at + 4);
    vec![
        ("surrogate", surrogate, surrogate_reason),
        ("deep", deep, deep_reason),
        ("not UTF-8", latin1, latin1_reason),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_pointer_route_refuses_a_body_it_cannot_read_and_forwards_nothing() {
    let r = rig().await;
    for (name, body, reason) in ways_in("K1") {
        // Twice, as a client retries: each is the same 400, and nothing ran.
        for _ in 0..2 {
            let answer = r.post("/bk/charges", None, body.clone()).await;
            assert_unreadable(&answer, &reason);
        }
        // With the key in a header too: the body is still read for the key's field.
        let answer = r.post("/bk/charges", Some(&new_key()), body).await;
        assert_unreadable(&answer, &reason);
        assert_eq!(r.up.total(), 0, "{name}: nothing reached the upstream");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_jcs_or_ignoring_route_refuses_a_body_it_cannot_read_and_forwards_nothing() {
    let r = rig().await;
    for path in ["/jcs/media_buys", "/ignoring/orders"] {
        for (name, body, reason) in ways_in("K1") {
            let key = new_key();
            for _ in 0..2 {
                let answer = r.post(path, Some(&key), body.clone()).await;
                assert_unreadable(&answer, &reason);
            }
            assert_eq!(
                r.up.total(),
                0,
                "{path} {name}: nothing reached the upstream"
            );
        }
    }
    // JCS writes every number as a double: one beyond a double's range has no JCS form.
    let body = br#"{"budget": 1e400}"#.to_vec();
    let answer = r.post("/jcs/media_buys", Some(&new_key()), body).await;
    assert_unreadable(
        &answer,
        "the number at byte 11 is beyond a double's range, which JCS cannot write",
    );
    assert_eq!(r.up.total(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn nesting_up_to_the_limit_is_read_and_keyed() {
    let r = rig().await;
    let key = new_key();
    // The body's own object and 9999 arrays: 10000 levels, as Go's parser allows.
    let (body, _) = keyed_body(&key, &nested(MAX_DEPTH - 1));
    let first = r.post("/bk/charges", None, body.clone()).await;
    assert_eq!(first.status, 201, "{first:?}");
    let retry = r.post("/bk/charges", None, body.clone()).await;
    assert!(retry.replayed(), "{retry:?}");
    // 200 levels: past serde_json's 128, which once forwarded such a body unkeyed.
    let (body, _) = keyed_body(&new_key(), &nested(200));
    for _ in 0..2 {
        assert_eq!(r.post("/bk/charges", None, body.clone()).await.status, 201);
    }
    assert_eq!(r.up.total(), 2, "each key ran once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_route_without_body_settings_keys_an_unreadable_body_by_its_bytes() {
    let r = rig().await;
    let key = new_key();
    let (body, _) = keyed_body("K1", br#""\ud800""#);
    let first = r.post("/v1/orders", Some(&key), body.clone()).await;
    assert_eq!(first.status, 201, "{first:?}");
    let retry = r.post("/v1/orders", Some(&key), body).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(r.up.total(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stripe_route_refuses_an_unreadable_body_in_stripes_envelope() {
    let r = rig().await;
    let (body, at) = keyed_body("K1", br#""\ud800""#);
    let answer = r.post("/stripe/v1/charges", None, body).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let error = &answer.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(
        error["doc_url"],
        "https://idem.dev/problems/unreadable-json"
    );
    let reason = format!(
        "the escape at byte {} is half of a surrogate pair without its other half",
        at + 1
    );
    assert_eq!(error["message"], detail(&reason));
    assert_eq!(r.up.total(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_deep_body_is_refused_and_the_gateway_answers_the_next_request() {
    let r = rig().await;
    // A megabyte of `[`: a parser that recursed once per level would overflow its stack.
    let hostile = vec![b'['; 1_000_000];
    for path in ["/bk/charges", "/jcs/media_buys"] {
        let answer = r.post(path, Some(&new_key()), hostile.clone()).await;
        assert_unreadable(
            &answer,
            &format!(
                "arrays and objects nest deeper than 10000 levels (at byte {})",
                MAX_DEPTH
            ),
        );
    }
    // Closed, and as deep as allowed but in objects: read, and keyed.
    let mut objects = b"{\"a\":".repeat(MAX_DEPTH);
    objects.extend_from_slice(b"1");
    objects.extend(std::iter::repeat_n(b'}', MAX_DEPTH));
    let key = new_key();
    let answer = r.post("/jcs/media_buys", Some(&key), objects.clone()).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert!(
        r.post("/jcs/media_buys", Some(&key), objects)
            .await
            .replayed()
    );
    let (body, _) = keyed_body(&new_key(), b"\"after\"");
    let next = r.post("/bk/charges", None, body).await;
    assert_eq!(next.status, 201, "the gateway still answers: {next:?}");
    assert_eq!(r.up.total(), 2);
}

/// An upstream that parses a body as JSON whatever its `Content-Type` (Go's
/// `encoding/json` on the request body) reads the key in a `text/plain` body: the
/// gateway reads it too, and keys the request, where it once forwarded it unkeyed.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_in_json_sent_as_text_is_keyed_all_the_same() {
    let r = rig().await;
    let (body, _) = keyed_body(&new_key(), b"\"plain\"");
    let url = r.gw.url("/bk/charges");
    let text = [("content-type", "text/plain")];
    let first = r.http.send("POST", &url, &text, body.clone()).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    // The same bytes under another type, or none: the same key, the same request.
    for headers in [
        &text[..],
        &[("content-type", "application/octet-stream")],
        &[],
    ] {
        let retry = r.http.send("POST", &url, headers, body.clone()).await;
        assert!(retry.replayed(), "{headers:?}: {retry:?}");
    }
    assert_eq!(r.up.total(), 1, "one key, one execution");
    // A body that is no JSON under such a type names no key: forwarded as it was.
    let form = b"idempotency_key=K9&amount=100".to_vec();
    let headers = [("content-type", "application/x-www-form-urlencoded")];
    let answer = r
        .http
        .send("POST", &r.gw.url("/bk/charges"), &headers, form)
        .await;
    assert_eq!(answer.status, 201);
    assert_eq!(r.up.total(), 2);
}
