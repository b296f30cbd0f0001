//! SPEC S14 at the gateway, for what upstream stacks read besides the request line and
//! the header names as spelt: method-override headers decide the method a request is
//! keyed as, a client's `X-Original-URL` and `X-Rewrite-URL` never reach the upstream,
//! a key header spelt with `_` is refused; a body framed two ways is read one way, and
//! an oversized head is answered at once.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{Gateway, Http, Upstream, new_key, read_message};

struct Setup {
    up: Upstream,
    gw: Gateway,
    http: Http,
    _dir: tempfile::TempDir,
}

async fn setup(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut args = vec!["--store", "memory://"];
    args.extend_from_slice(extra);
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    Setup {
        up,
        gw,
        http: Http::new(),
        _dir: dir,
    }
}

/// Sends `request` on a fresh connection; the answer's head and body, or `None` if the
/// gateway closed without one.
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> Option<(String, Vec<u8>)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), read_message(&mut stream))
        .await
        .expect("an answer or a close within 10 s")
}

/// A `GET` carrying `X-HTTP-Method-Override: POST`, which many upstream frameworks run
/// as a `POST`, is keyed as that `POST`: sent twice under one key, it executes once at
/// the upstream, which gets it as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_overridden_to_post_executes_once_at_the_upstream() {
    let s = setup(&[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let headers = [
        ("idempotency-key", key.as_str()),
        ("x-http-method-override", "POST"),
        ("content-type", "application/json"),
    ];
    let first = s.http.send("GET", &url, &headers, "{}").await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    let again = s.http.send("GET", &url, &headers, "{}").await;
    assert_eq!(again.status, 201, "{again:?}");
    assert!(again.replayed(), "the second GET replays: {again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(s.up.started(&key), 1);
    let seen = s.up.seen();
    assert_eq!(seen[0].method, "GET", "forwarded as sent");
    assert_eq!(seen[0].headers["x-http-method-override"], "POST");
}

/// `--require-key` holds for a `GET` overridden to `POST`; overrides that disagree are
/// a 400 that reaches nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_key_holds_for_a_get_overridden_to_post() {
    let s = setup(&["--require-key"]).await;
    let url = s.gw.url("/v1/charges");
    let missing = s
        .http
        .send("GET", &url, &[("x-http-method-override", "POST")], "")
        .await;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert_eq!(
        missing.problem_type(),
        "https://idem.dev/problems/missing-key"
    );
    let key = new_key();
    let conflicting = s
        .http
        .send(
            "GET",
            &url,
            &[
                ("idempotency-key", key.as_str()),
                ("x-http-method-override", "POST"),
                ("x-http-method", "DELETE"),
            ],
            "",
        )
        .await;
    assert_eq!(conflicting.status, 400, "{conflicting:?}");
    assert_eq!(
        conflicting.problem_type(),
        "https://idem.dev/problems/invalid-method-override"
    );
    assert_eq!(s.up.total(), 0, "nothing reached the upstream");
    // A plain GET still passes through.
    assert_eq!(s.http.send("GET", &url, &[], "").await.status, 201);
}

/// A `[[route]]` rule for `POST` holds for a `GET` overridden to `POST`: its required
/// key, and its template as the endpoint, so a plain `POST` under the key replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_rule_holds_for_a_get_overridden_to_post() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let toml = r#"
        [[route]]
        method = "POST"
        path = "/v1/orders/{id}/capture"
        require_key = true
    "#;
    std::fs::write(dir.path().join("idem.toml"), toml).unwrap();
    let args = ["--store", "memory://", "--config", "idem.toml"];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let http = Http::new();
    let url = gw.url("/v1/orders/7/capture");
    let missing = http
        .send("GET", &url, &[("x-http-method-override", "POST")], "")
        .await;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert_eq!(
        missing.problem_type(),
        "https://idem.dev/problems/missing-key"
    );
    assert_eq!(up.total(), 0);
    let key = new_key();
    let headers = [
        ("idempotency-key", key.as_str()),
        ("x-http-method-override", "POST"),
    ];
    let first = http.send("GET", &url, &headers, "").await;
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    let post = http
        .send("POST", &url, &[("idempotency-key", key.as_str())], "")
        .await;
    assert_eq!((post.status, post.replayed()), (201, true), "{post:?}");
    assert_eq!(up.started(&key), 1);
}

/// `X-Original-URL` and `X-Rewrite-URL`, by which some upstream stacks route in place
/// of the request line, never reach the upstream, keyed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_rewrite_headers_never_reach_the_upstream() {
    let s = setup(&[]).await;
    let url = s.gw.url("/v1/charges");
    let rewrites = [
        ("x-original-url", "/admin/refunds"),
        ("X-Rewrite-URL", "/admin/refunds"),
    ];
    let key = new_key();
    let keyed = s.http.post(&url, &key, "{}", &rewrites).await;
    assert_eq!(keyed.status, 201, "{keyed:?}");
    let unkeyed = s.http.send("GET", &url, &rewrites, "").await;
    assert_eq!(unkeyed.status, 201, "{unkeyed:?}");
    let seen = s.up.seen();
    assert_eq!(seen.len(), 2);
    for request in seen {
        assert_eq!(request.path, "/v1/charges");
        for (name, _) in rewrites {
            assert!(
                !request.headers.contains_key(name),
                "{name} reached the upstream: {:?}",
                request.headers
            );
        }
    }
}

/// `Idempotency_Key` is `Idempotency-Key` to CGI and WSGI upstreams: a keyed request
/// carrying it is refused rather than passed through unkeyed (or keyed by the other
/// header) while the upstream reads it as the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscore_key_header_is_refused_before_the_upstream() {
    let s = setup(&[]).await;
    let url = s.gw.url("/v1/charges");
    let key = new_key();
    for headers in [
        vec![("idempotency_key", key.as_str())],
        vec![
            ("idempotency-key", key.as_str()),
            ("Idempotency_Key", "other"),
        ],
    ] {
        let answer = s.http.send("POST", &url, &headers, "{}").await;
        assert_eq!(answer.status, 400, "{headers:?}: {answer:?}");
        assert_eq!(
            answer.problem_type(),
            "https://idem.dev/problems/ambiguous-header"
        );
    }
    assert_eq!(s.up.total(), 0);
}

/// A request with both `Transfer-Encoding` and `Content-Length` frames its body two
/// ways (RFC 9112 §6.1), the classic request-smuggling lever. The listener reads it by
/// its chunks alone, in either order of the two fields, drops the `Content-Length`, so
/// the upstream gets the body the key was fingerprinted by and no length that
/// disagrees with it, and closes the connection after the answer, so nothing after the
/// body is read as another request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_encoding_with_content_length_is_read_by_its_chunks_and_closes() {
    let s = setup(&[]).await;
    let framings = [
        "Content-Length: 3\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nContent-Length: 3",
    ];
    for (i, framing) in framings.iter().enumerate() {
        for method in ["POST", "PUT"] {
            let key = new_key();
            // A second request hidden after the chunks: it must never be read as one.
            let request = format!(
                "{method} /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n\
                 Content-Type: application/json\r\n{framing}\r\n\r\n\
                 7\r\n{{\"a\":1}}\r\n0\r\n\r\n\
                 POST /v1/smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            );
            let mut stream = tokio::net::TcpStream::connect(s.gw.addr).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
                .await
                .expect("answered and closed within 10 s")
                .unwrap();
            let out = String::from_utf8_lossy(&out);
            assert!(out.starts_with("HTTP/1.1 201"), "{framing} {method}: {out}");
            assert_eq!(out.matches("HTTP/1.1").count(), 1, "one answer: {out}");
            assert!(out.contains("connection: close"), "{out}");
            let seen = s.up.seen();
            let last = seen.last().unwrap();
            assert_eq!(last.body.as_ref(), br#"{"a":1}"#, "{framing} {method}");
            assert_ne!(
                last.headers.get("content-length").map(|v| v.as_bytes()),
                Some(&b"3"[..]),
                "{framing} {method}"
            );
            assert_eq!(seen.len(), 2 * i + if method == "POST" { 1 } else { 2 });
        }
    }
    assert!(s.up.seen().iter().all(|r| r.path == "/v1/charges"));
}

/// More header fields than the gateway reads, or one larger than its buffer, get a
/// 431 at once rather than a hang, and nothing reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_heads_are_431_at_once() {
    let s = setup(&[]).await;
    let mut many = String::from("POST /v1/charges HTTP/1.1\r\nHost: x\r\n");
    for i in 0..150 {
        many.push_str(&format!("X-Filler-{i}: {i}\r\n"));
    }
    many.push_str("Content-Length: 0\r\n\r\n");
    let huge = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nContent-Length: 0\r\n\r\n",
        "a".repeat(600 * 1024)
    );
    for request in [many, huge] {
        let mut stream = tokio::net::TcpStream::connect(s.gw.addr).await.unwrap();
        // The gateway may answer and close before it has read all of a huge head.
        let _ = stream.write_all(request.as_bytes()).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
            .await
            .expect("answered and closed within 10 s");
        let out = String::from_utf8_lossy(&out);
        assert!(
            out.starts_with("HTTP/1.1 431"),
            "{}",
            &out[..out.len().min(200)]
        );
    }
    assert_eq!(s.up.total(), 0);
}

/// A fragment in the request target (never sent by a client, RFC 9110 §7.1) is no way
/// to another resource: the rules and the upstream see the path without it, and the
/// key scopes the same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragment_in_the_target_names_the_path_without_it() {
    let s = setup(&[]).await;
    let key = new_key();
    for target in ["/v1/charges", "/v1/charges#/admin", "/v1/charges#x"] {
        let request = format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let (head, _) = raw(s.gw.addr, request.as_bytes()).await.expect("answer");
        assert!(head.starts_with("HTTP/1.1 201"), "{target}: {head}");
        let replayed = head.contains("idempotent-replayed: true");
        assert_eq!(replayed, target != "/v1/charges", "{target}: {head}");
    }
    assert_eq!(s.up.started(&key), 1);
    for seen in s.up.seen() {
        assert_eq!(seen.path, "/v1/charges");
    }
}

/// `Host` as RFC 9112 §3.2 has it: an HTTP/1.1 request without one, with two, or with
/// one that names no host is a 400 `invalid-host` that reaches nobody; HTTP/1.0 may
/// leave it out. An absolute-form target's authority takes its place, so the upstream
/// is told of the host the target named, not of a `Host` that disagrees with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_is_required_once_and_the_absolute_target_names_it() {
    let s = setup(&[]).await;
    let refused = [
        "GET /v1/x HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "GET /v1/x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
        "GET /v1/x HTTP/1.1\r\nHost: a.example/admin\r\n\r\n",
        "GET /v1/x HTTP/1.1\r\nHost: user@a.example\r\n\r\n",
        "GET /v1/x HTTP/1.1\r\nHost: \r\n\r\n",
        "GET http://user@a.example/v1/x HTTP/1.1\r\nHost: a.example\r\n\r\n",
    ];
    for request in refused {
        let (head, body) = raw(s.gw.addr, request.as_bytes()).await.expect("answer");
        assert!(head.starts_with("HTTP/1.1 400"), "{request:?}: {head}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v["type"], "https://idem.dev/problems/invalid-host",
            "{request:?}"
        );
    }
    assert_eq!(s.up.total(), 0, "{:?}", s.up.seen());

    let (head, _) = raw(s.gw.addr, b"GET /v1/old HTTP/1.0\r\n\r\n")
        .await
        .expect("answer");
    assert!(head.starts_with("HTTP/1.0 201"), "{head}");
    let request = "GET http://a.example/v1/abs HTTP/1.1\r\nHost: b.example\r\n\r\n";
    let (head, _) = raw(s.gw.addr, request.as_bytes()).await.expect("answer");
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    let seen = s.up.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].path, "/v1/old");
    assert!(!seen[0].headers.contains_key("x-forwarded-host"));
    assert_eq!(seen[1].path, "/v1/abs");
    assert_eq!(seen[1].headers["x-forwarded-host"], "a.example");
    assert_eq!(
        seen[1].headers["forwarded"],
        "for=127.0.0.1;proto=http;host=\"a.example\""
    );
}

/// Heads that frame a body ambiguously or are malformed are 400s that reach nobody:
/// two different lengths, a `Transfer-Encoding` that does not end in `chunked`,
/// whitespace before a header's colon (which some stacks strip and others keep), and
/// a bare control character in a value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_framing_is_400_and_never_forwarded() {
    let s = setup(&[]).await;
    let refused = [
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}",
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key : k\r\nContent-Length: 2\r\n\r\n{}",
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x01b\r\nContent-Length: 2\r\n\r\n{}",
    ];
    for request in refused {
        let answer = raw(s.gw.addr, request.as_bytes()).await;
        let (head, _) = answer.unwrap_or_else(|| panic!("no answer to {request:?}"));
        assert!(head.starts_with("HTTP/1.1 400"), "{request:?}: {head}");
    }
    assert_eq!(s.up.total(), 0, "{:?}", s.up.seen());
}

/// A client's `X_Forwarded_For` or `Idempotency_Attempt`, which CGI and WSGI upstreams
/// read as the headers the gateway sets, never reach the upstream: a client cannot pass
/// for another address or make a first attempt look recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alikes_of_the_gateways_headers_never_reach_the_upstream() {
    let s = setup(&[]).await;
    let look_alikes = [
        ("x_forwarded_for", "6.6.6.6"),
        ("X_Forwarded_Host", "evil.example"),
        ("x-forwarded_proto", "https"),
        ("idempotency_attempt", "9"),
    ];
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    assert_eq!(
        s.http.post(&url, &key, "{}", &look_alikes).await.status,
        201
    );
    assert_eq!(s.http.send("GET", &url, &look_alikes, "").await.status, 201);
    let seen = s.up.seen();
    assert_eq!(seen.len(), 2);
    for request in seen {
        for (name, _) in look_alikes {
            assert!(
                !request.headers.contains_key(name),
                "{name}: {:?}",
                request.headers
            );
        }
        assert_eq!(request.headers["x-forwarded-for"], "127.0.0.1");
    }
}

/// A keyed request that asks for `100 Continue` with a body over `--body-limit` gets
/// its 413 before it sends the body: no `100 Continue` first, nothing reserved or
/// forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_over_the_body_limit_is_413_before_the_body() {
    let s = setup(&["--body-limit", "1KiB"]).await;
    let key = new_key();
    let request = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 2048\r\n\
         Expect: 100-continue\r\n\r\n"
    );
    let (head, body) = raw(s.gw.addr, request.as_bytes()).await.expect("answer");
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["type"], "https://idem.dev/problems/body-too-large");
    assert_eq!(s.up.total(), 0);
}
