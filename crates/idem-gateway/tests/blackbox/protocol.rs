//! SPEC S2–S6 at the gateway: every S5 row, every S2 error, scope isolation, release
//! policy, JSON normalisation, the stored-header allow-list, the body limit and GET
//! pass-through.

use std::time::Duration;

use crate::common::{Gateway, Http, OLD_DATE, Proto, Upstream, new_key, over_both_protocols};

struct Setup {
    up: Upstream,
    gw: Gateway,
    http: Http,
    _dir: tempfile::TempDir,
}

async fn setup(extra: &[&str]) -> Setup {
    setup_over(Proto::Http1, extra).await
}

/// A gateway with `extra` arguments, and a client that speaks `proto` to it.
async fn setup_over(proto: Proto, extra: &[&str]) -> Setup {
    setup_in(proto, tempfile::tempdir().unwrap(), extra).await
}

/// A gateway on the memory store configured by `toml`, given as `--config`, and a
/// client that speaks `proto` to it.
async fn setup_with_file_over(proto: Proto, toml: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("idem.toml"), toml).unwrap();
    setup_in(proto, dir, &["--config", "idem.toml"]).await
}

/// A gateway on the memory store, run in `dir`, with `extra` arguments.
async fn setup_in(proto: Proto, dir: tempfile::TempDir, extra: &[&str]) -> Setup {
    let up = Upstream::start().await;
    let mut args = vec!["--store", "memory://"];
    args.extend_from_slice(extra);
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    Setup {
        up,
        gw,
        http: Http::speaking(proto),
        _dir: dir,
    }
}

over_both_protocols! {
async fn first_request_executes_and_retry_replays_it(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let first = s.http.post(&url, &key, r#"{"amount":100}"#, &[]).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let retry = s.http.post(&url, &key, r#"{"amount":100}"#, &[]).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(
        retry.body, first.body,
        "the stored body is replayed byte for byte"
    );
    assert_eq!(retry.header("content-type"), Some("application/json"));
    assert_eq!(s.up.started(&key), 1, "the upstream ran once");
    assert_eq!(first.json()["attempt"], "1");
}
}

over_both_protocols! {
async fn quoted_and_bare_key_name_the_same_record(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let bare = s.http.post(&url, &key, "{}", &[]).await;
    let quoted = s.http.post(&url, &format!("\"{key}\""), "{}", &[]).await;
    assert_eq!(bare.status, 201);
    assert!(quoted.replayed());
    assert_eq!(quoted.body, bare.body);
    assert_eq!(s.up.total(), 1);
}
}

over_both_protocols! {
async fn mismatched_payload_is_422(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    assert_eq!(
        s.http
            .post(&url, &key, r#"{"amount":100}"#, &[])
            .await
            .status,
        201
    );
    let other = s.http.post(&url, &key, r#"{"amount":999}"#, &[]).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem_type(), "https://idem.dev/problems/key-reused");
    assert_eq!(s.up.started(&key), 1);
}
}

over_both_protocols! {
async fn in_progress_duplicate_is_409_with_retry_after(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let slow = {
        let (http, url, key) = (s.http.clone(), url.clone(), key.clone());
        tokio::spawn(async move {
            http.post(&url, &key, "{}", &[("x-test-delay-ms", "1500")])
                .await
        })
    };
    // Wait until the first attempt is at the upstream, then duplicate it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.up.started(&key) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dup = s
        .http
        .post(&url, &key, "{}", &[("x-test-delay-ms", "1500")])
        .await;
    assert_eq!(dup.status, 409);
    assert_eq!(
        dup.problem_type(),
        "https://idem.dev/problems/request-in-progress"
    );
    let retry_after: u64 = dup.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(slow.await.unwrap().status, 201);
    assert_eq!(s.up.started(&key), 1);
}
}

over_both_protocols! {
async fn concurrent_duplicates_execute_once(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (http, url, key) = (s.http.clone(), url.clone(), key.clone());
            tokio::spawn(async move {
                http.post(&url, &key, r#"{"a":1}"#, &[("x-test-delay-ms", "200")])
                    .await
            })
        })
        .collect();
    let mut executed = 0;
    for t in tasks {
        let a = t.await.unwrap();
        match a.status {
            201 if !a.replayed() => executed += 1,
            201 | 409 => {}
            other => panic!("unexpected {other}: {a:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(s.up.started(&key), 1);
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_record_executes_again() {
    // The replay must come within the TTL of the first request: 3 s, so that a loaded
    // machine's two round trips still fit.
    let s = setup(&["--ttl", "3s", "--lease", "3s"]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    assert_eq!(s.http.post(&url, &key, "{}", &[]).await.status, 201);
    assert!(s.http.post(&url, &key, "{}", &[]).await.replayed());
    // The binary runs on the real clock: wait out the TTL, with margin.
    tokio::time::sleep(Duration::from_millis(3300)).await;
    let after = s.http.post(&url, &key, "{}", &[]).await;
    assert_eq!(after.status, 201);
    assert!(!after.replayed(), "an expired record counts as absent");
    assert_eq!(s.up.started(&key), 2);
}

over_both_protocols! {
async fn malformed_keys_are_400_and_never_reach_upstream(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let url = s.gw.url("/v1/charges");
    let long = "k".repeat(256);
    for bad in [
        long.as_str(),
        "\"unterminated",
        "\"a\"b",
        "\"bad\\escape\"",
        "\t ",
    ] {
        let a = s.http.post(&url, bad, "{}", &[]).await;
        assert_eq!(a.status, 400, "{bad:?}: {a:?}");
        assert_eq!(a.problem_type(), "https://idem.dev/problems/invalid-key");
        assert!(
            a.json()["detail"].as_str().unwrap().len() > 10,
            "says what is wrong"
        );
    }
    // A key of exactly 255 characters is fine.
    let ok = s.http.post(&url, &"k".repeat(255), "{}", &[]).await;
    assert_eq!(ok.status, 201);
    assert_eq!(s.up.total(), 1);
}
}

over_both_protocols! {
async fn non_ascii_key_is_400(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let url = s.gw.url("/v1/charges");
    let mut req = http::Request::post(&url)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    req.headers_mut().insert(
        "idempotency-key",
        http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
    );
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let res = client.request(req).await.unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(s.up.total(), 0);
}
}

over_both_protocols! {
async fn two_key_headers_are_400(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let a = s
        .http
        .send(
            "POST",
            &s.gw.url("/v1/charges"),
            &[("idempotency-key", "a"), ("idempotency-key", "b")],
            "{}",
        )
        .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.problem_type(), "https://idem.dev/problems/invalid-key");
    assert_eq!(s.up.total(), 0);
}
}

over_both_protocols! {
async fn missing_key_is_400_when_required(proto: Proto) {
    let s = setup_over(proto, &["--require-key"]).await;
    let a = s
        .http
        .send("POST", &s.gw.url("/v1/charges"), &[], "{}")
        .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.problem_type(), "https://idem.dev/problems/missing-key");
    assert_eq!(s.up.total(), 0);
    // GET is not a keyed method: no key needed.
    let g = s.http.send("GET", &s.gw.url("/v1/charges"), &[], "").await;
    assert_eq!(g.status, 201);
}
}

over_both_protocols! {
async fn missing_key_passes_through_when_optional(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let url = s.gw.url("/v1/charges");
    let a = s.http.send("POST", &url, &[], "{}").await;
    let b = s.http.send("POST", &url, &[], "{}").await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!b.replayed());
    assert_eq!(s.up.total(), 2, "without a key every request executes");
}
}

over_both_protocols! {
async fn get_passes_through_untouched_and_streams_large_bodies(proto: Proto) {
    let s = setup_over(proto, &["--body-limit", "1KiB"]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let a = s
        .http
        .send("GET", &url, &[("idempotency-key", &key)], "")
        .await;
    let b = s
        .http
        .send("GET", &url, &[("idempotency-key", &key)], "")
        .await;
    assert!(!b.replayed());
    assert_ne!(a.body, b.body);
    assert_eq!(s.up.started(&key), 2, "GET is never de-duplicated");
    // Unkeyed traffic is not buffered: an answer far over the body limit streams
    // through, and so does an unkeyed POST body over the limit.
    let big = s
        .http
        .send("GET", &url, &[("x-test-body-bytes", "3000000")], "")
        .await;
    assert_eq!(big.status, 201);
    assert_eq!(big.body.len(), 3_000_000);
    let post = s
        .http
        .send(
            "POST",
            &url,
            &[("content-type", "text/plain")],
            vec![b'y'; 200_000],
        )
        .await;
    assert_eq!(post.status, 201);
    assert_eq!(post.json()["body_len"], 200_000);
}
}

over_both_protocols! {
async fn body_over_limit_is_413_and_nothing_is_reserved(proto: Proto) {
    let s = setup_over(proto, &["--body-limit", "1KiB"]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(2048));
    let a = s.http.post(&url, &key, &big, &[]).await;
    assert_eq!(a.status, 413);
    assert_eq!(a.problem_type(), "https://idem.dev/problems/body-too-large");
    assert_eq!(s.up.total(), 0);
    // Nothing was reserved: the same key with a body within the limit executes.
    let b = s.http.post(&url, &key, "{}", &[]).await;
    assert_eq!(b.status, 201);
    assert!(!b.replayed());
}
}

over_both_protocols! {
async fn answer_over_response_limit_is_recorded_as_502_and_never_run_again(proto: Proto) {
    let s = setup_over(proto, &["--response-limit", "64KiB"]).await;
    let key = new_key();
    let url = s.gw.url("/v1/exports");
    let big = [("x-test-body-bytes", "200000")];
    let first = s.http.post(&url, &key, "{}", &big).await;
    assert_eq!(first.status, 502);
    assert_eq!(
        first.problem_type(),
        "https://idem.dev/problems/upstream-answer-too-large"
    );
    assert!(!first.replayed());
    assert_eq!(s.up.finished(&key), 1, "the upstream acted");
    // Recorded, not released: the retry replays the problem and the upstream is not
    // called again.
    let retry = s.http.post(&url, &key, "{}", &big).await;
    assert_eq!(retry.status, 502);
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(s.up.started(&key), 1);
    // An answer within the limit is relayed and recorded whole.
    let key = new_key();
    let fits = [("x-test-body-bytes", "60000")];
    let ok = s.http.post(&url, &key, "{}", &fits).await;
    assert_eq!(ok.status, 201);
    assert_eq!(ok.body.len(), 60_000);
    let again = s.http.post(&url, &key, "{}", &fits).await;
    assert!(again.replayed());
    assert_eq!(again.body.len(), 60_000);
}
}

/// Sends a fresh key twice with `headers` that make the upstream answer `status` with
/// 200 000 bytes, over the 64 KiB response limit the caller's gateway runs with:
/// released, the answer streams through whole each time and each retry executes.
async fn released_answer_streams_whole(
    http: &Http,
    up: &Upstream,
    url: &str,
    status: u16,
    headers: &[(&str, &str)],
) {
    let key = new_key();
    let mut headers = headers.to_vec();
    headers.push(("x-test-body-bytes", "200000"));
    for n in 1..=2 {
        let a = http.post(url, &key, "{}", &headers).await;
        assert_eq!((a.status, a.body.len()), (status, 200_000), "{a:?}");
        assert!(!a.replayed());
        assert!(a.header("idempotency-disposition").is_none());
        assert_eq!(up.finished(&key), n, "released: each retry executes");
    }
}

over_both_protocols! {
async fn released_answer_over_response_limit_streams_through_whole(proto: Proto) {
    let s = setup_over(proto, &["--response-limit", "64KiB"]).await;
    let url = s.gw.url("/v1/exports");
    // Released by the upstream's header, and by a release status: neither is recorded,
    // so neither is held to the limit on recorded answers.
    let by_header = [("x-test-disposition", "release")];
    released_answer_streams_whole(&s.http, &s.up, &url, 201, &by_header).await;
    let by_status = [("x-test-status", "503")];
    released_answer_streams_whole(&s.http, &s.up, &url, 503, &by_status).await;
}
}

over_both_protocols! {
async fn equal_json_in_another_spelling_replays(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let first = s
        .http
        .post(
            &url,
            &key,
            r#"{"amount":100,"currency":"eur","meta":{"a":1,"b":2}}"#,
            &[],
        )
        .await;
    let again = s
        .http
        .post(
            &url,
            &key,
            "{ \"meta\": {\"b\": 2, \"a\": 1},\n  \"currency\": \"eur\", \"amount\": 100 }",
            &[],
        )
        .await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(s.up.started(&key), 1);
}
}

/// A client that compresses each attempt afresh sends other bytes on its retry:
/// Python's `gzip.compress` writes the current second into the gzip header. The content
/// is the same, so it is a replay; other content is a 422; and the upstream gets the
/// body as the client sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_retry_replays_and_the_upstream_gets_the_bytes_as_sent() {
    let gzip = |json: &str, mtime: u32| {
        use std::io::Write;
        let mut e = flate2::GzBuilder::new()
            .mtime(mtime)
            .write(Vec::new(), flate2::Compression::default());
        e.write_all(json.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let s = setup(&[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let headers = [
        ("idempotency-key", key.as_str()),
        ("content-type", "application/json"),
        ("content-encoding", "gzip"),
    ];
    let json = r#"{"amount":100,"currency":"eur"}"#;
    let sent = gzip(json, 1_796_140_000);
    let first = s.http.send("POST", &url, &headers, sent.clone()).await;
    assert_eq!(first.status, 201);
    let again = s
        .http
        .send("POST", &url, &headers, gzip(json, 1_796_140_001))
        .await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    let other = gzip(r#"{"amount":999,"currency":"eur"}"#, 1_796_140_002);
    let changed = s.http.send("POST", &url, &headers, other).await;
    assert_eq!(changed.status, 422);

    assert_eq!(s.up.started(&key), 1);
    let seen: Vec<_> =
        s.up.seen()
            .into_iter()
            .filter(|r| {
                r.headers
                    .get("idempotency-key")
                    .is_some_and(|k| k == key.as_str())
            })
            .collect();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, sent);
    assert_eq!(seen[0].headers["content-encoding"], "gzip");
}

/// A deflate stream says where it ends, and a decoder stops there: a body with bytes
/// after its stream is not the first body's content, so the key's reuse is a 422, not
/// the first answer replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deflate_body_with_bytes_after_its_stream_is_another_request() {
    let zlib = |json: &str| {
        use std::io::Write;
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(json.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let s = setup(&[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let headers = [
        ("idempotency-key", key.as_str()),
        ("content-type", "application/json"),
        ("content-encoding", "deflate"),
    ];
    let sent = zlib(r#"{"amount":100,"currency":"eur"}"#);
    let first = s.http.send("POST", &url, &headers, sent.clone()).await;
    assert_eq!(first.status, 201);
    let longer = [&sent[..], br#"{"amount":999}"#].concat();
    let changed = s.http.send("POST", &url, &headers, longer).await;
    assert_eq!(changed.status, 422, "{changed:?}");
    assert!(!changed.replayed());
    let again = s.http.send("POST", &url, &headers, sent).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(s.up.started(&key), 1);
}

over_both_protocols! {
/// An upload retried as curl `-F` or Python's `requests` retry it: the same form under
/// a new random boundary. It is the same request (replayed); a changed file is not.
async fn multipart_retry_with_a_new_boundary_replays(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/files");
    let mut answers = Vec::new();
    for (boundary, file) in [
        ("------------------------d74496d66958873e", "invoice"),
        ("------------------------0f3a5b7c9d1e2f40", "invoice"),
        ("------------------------77aa", "another invoice"),
    ] {
        let ct = format!("multipart/form-data; boundary={boundary}");
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n\
             dispute\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
             filename=\"inv.txt\"\r\nContent-Type: text/plain\r\n\r\n{file}\r\n--{boundary}--\r\n"
        );
        let headers = [("idempotency-key", key.as_str()), ("content-type", &ct)];
        answers.push(s.http.send("POST", &url, &headers, body).await);
    }
    let [first, again, changed] = &answers[..] else {
        unreachable!()
    };
    assert_eq!(first.status, 201);
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(changed.status, 422);
    assert_eq!(s.up.started(&key), 1);
}
}

over_both_protocols! {
/// A browser reads a cross-origin answer only if it carries the CORS headers that
/// allow its origin; a replay without them would look to the page like a network
/// error, and its retries would never get the answer.
async fn replay_keeps_the_cors_headers(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let origin = [("origin", "https://shop.example")];
    let first = s.http.post(&url, &key, "{}", &origin).await;
    assert_eq!(first.status, 201);
    let again = s.http.post(&url, &key, "{}", &origin).await;
    assert!(again.replayed(), "{again:?}");
    for name in [
        "access-control-allow-origin",
        "access-control-allow-credentials",
        "access-control-expose-headers",
    ] {
        assert!(first.header(name).is_some(), "{name}");
        assert_eq!(again.header(name), first.header(name), "{name}");
    }
    assert_eq!(s.up.started(&key), 1);
}
}

/// The gateway's own answers (409, 422, 400) reach the upstream never, so they carry no
/// CORS headers of the upstream's; without some, a page on another origin sees a
/// network error instead of "retry after 1 s". They allow the request's origin when
/// the request needed a preflight (which the upstream answered), and only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_own_answers_are_readable_across_origins() {
    const SHOP: &str = "https://shop.example";
    let s = setup(&["--require-key"]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let origin = ("origin", SHOP);
    let allows = |a: &crate::common::Answer| {
        a.header("access-control-allow-origin") == Some(SHOP)
            && a.header("access-control-allow-credentials") == Some("true")
            && a.headers.get_all("vary").iter().any(|v| v == "origin")
    };

    let slow = {
        let (http, url, key) = (s.http.clone(), url.clone(), key.clone());
        tokio::spawn(async move {
            http.post(&url, &key, "{}", &[("x-test-delay-ms", "1500"), origin])
                .await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.up.started(&key) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let conflict = s.http.post(&url, &key, "{}", &[origin]).await;
    assert_eq!(conflict.status, 409);
    assert!(allows(&conflict), "{conflict:?}");
    assert_eq!(
        conflict.header("access-control-expose-headers"),
        Some("retry-after, idempotency-operation-state")
    );
    let plain = s.http.post(&url, &key, "{}", &[]).await;
    assert_eq!(plain.status, 409);
    assert_eq!(plain.header("access-control-allow-origin"), None);
    assert_eq!(slow.await.unwrap().status, 201);

    let reused = s.http.post(&url, &key, r#"{"a":1}"#, &[origin]).await;
    assert_eq!(reused.status, 422);
    assert!(allows(&reused), "{reused:?}");
    // Where the operation stands is the gateway's to expose, as on every keyed answer.
    assert_eq!(
        reused.header("access-control-expose-headers"),
        Some("idempotency-operation-state")
    );
    let invalid = s.http.post(&url, "", "{}", &[origin]).await;
    assert_eq!(invalid.status, 400);
    assert!(allows(&invalid), "{invalid:?}");

    // A form post needs no preflight: nothing says the upstream allows this origin.
    let form = s
        .http
        .send(
            "POST",
            &url,
            &[
                origin,
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            "a=1",
        )
        .await;
    assert_eq!(form.status, 400);
    assert_eq!(form.problem_type(), "https://idem.dev/problems/missing-key");
    assert_eq!(form.header("access-control-allow-origin"), None);
    // The upstream's own answers are its business, CORS headers or none.
    let bare = s
        .http
        .post(&url, &new_key(), "{}", &[origin, ("x-test-no-cors", "1")])
        .await;
    assert_eq!(bare.status, 201);
    assert_eq!(bare.header("access-control-allow-origin"), None);
    assert_eq!(s.up.started(&key), 1);
}

/// A browser may add an `Idempotency-Key` to a POST by itself (Firefox does, a quoted
/// number, to POSTs that carry none), with no preflight: a form post from another
/// origin that carries one proves nothing about what the upstream allows, so the
/// gateway's own answers to it (409, 422) carry no CORS headers; a JSON post's still do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_a_browser_adds_by_itself_does_not_make_answers_readable_across_origins() {
    const SHOP: &str = "https://shop.example";
    let s = setup(&[]).await;
    let url = s.gw.url("/v1/charges");
    // As Firefox writes its own keys.
    let key = format!(
        "\"{}\"",
        1_733_077_500_123_u64 + u64::from(std::process::id())
    );
    let headers = |key: &str, delay: Option<&'static str>| -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("origin", SHOP.to_owned()),
            (
                "content-type",
                "application/x-www-form-urlencoded".to_owned(),
            ),
            ("idempotency-key", key.to_owned()),
        ];
        h.extend(delay.map(|ms| ("x-test-delay-ms", ms.to_owned())));
        h
    };
    let send = |h: Vec<(&'static str, String)>, body: &'static str| {
        let (http, url) = (s.http.clone(), url.clone());
        async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            http.send("POST", &url, &h, body).await
        }
    };
    let slow = tokio::spawn(send(headers(&key, Some("1500")), "a=1"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.up.total() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let conflict = send(headers(&key, None), "a=1").await;
    assert_eq!(conflict.status, 409, "{conflict:?}");
    assert_eq!(conflict.header("access-control-allow-origin"), None);
    assert_eq!(conflict.header("access-control-allow-credentials"), None);
    assert_eq!(slow.await.unwrap().status, 201);
    let reused = send(headers(&key, None), "a=2").await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(reused.header("access-control-allow-origin"), None);
    // A page's JSON post needed a preflight, key or not: its 422 stays readable.
    let json = s
        .http
        .post(&url, &key, r#"{"a":3}"#, &[("origin", SHOP)])
        .await;
    assert_eq!(json.status, 422, "{json:?}");
    assert_eq!(json.header("access-control-allow-origin"), Some(SHOP));
    assert_eq!(s.up.total(), 1);
}

over_both_protocols! {
/// An upstream that names its answer's resource in `Idempotency-Resource` has the
/// answer recorded as that reference (SPEC S6): the first client gets the whole body,
/// even over `--response-limit`, and a retry gets the resource rendered again by a
/// `GET` upstream, under the first answer's status and stored headers. The upstream
/// never executes the operation twice; a resource it cannot render is a 503 that says
/// the operation ran.
async fn an_answer_recorded_as_a_reference_is_rendered_again_upstream(proto: Proto) {
    let s = setup_over(proto, &["--response-limit", "1KiB"]).await;
    let key = new_key();
    let url = s.gw.url("/v1/reports");
    let first = s
        .http
        .post(
            &url,
            &key,
            "{}",
            &[
                ("x-test-body-bytes", "5000"),
                ("x-test-resource", "/v1/reports/7?format=csv"),
            ],
        )
        .await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), 5000);
    assert_eq!(first.header("idempotency-resource"), None, "stripped");

    let retry = s.http.post(&url, &key, "{}", &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("location"), first.header("location"));
    assert_eq!(
        retry.header("content-location"),
        Some("/v1/reports/7?format=csv")
    );
    assert_eq!(retry.header("content-type"), Some("application/json"));
    let rendered = retry.json();
    assert_eq!(rendered["method"], "GET");
    assert_eq!(rendered["path"], "/v1/reports/7");
    assert_eq!(s.up.started(&key), 1, "executed once");
    let get = s.up.seen().pop().unwrap();
    assert_eq!(get.method, "GET");
    assert!(get.headers.get("idempotency-key").is_none());
    assert!(get.headers.get("content-type").is_none());
    assert!(get.body.is_empty());

    // The upstream cannot render it now (the retry's headers reach the GET).
    let gone = s
        .http
        .post(&url, &key, "{}", &[("x-test-status", "404")])
        .await;
    assert_eq!(gone.status, 503, "{gone:?}");
    assert_eq!(
        gone.problem_type(),
        "https://idem.dev/problems/replay-unavailable"
    );
    assert_eq!(s.up.started(&key), 1);
}
}

over_both_protocols! {
/// A compressed answer is recorded as the bytes it is, so its replay must say how they
/// are encoded, or the client cannot read them.
async fn replay_keeps_the_content_encoding(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let gzip = [
        ("accept-encoding", "gzip"),
        ("x-test-content-encoding", "gzip"),
    ];
    let first = s.http.post(&url, &key, "{}", &gzip).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.header("content-encoding"), Some("gzip"));
    let again = s.http.post(&url, &key, "{}", &gzip).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("content-encoding"), Some("gzip"));
    assert_eq!(s.up.started(&key), 1);
}
}

over_both_protocols! {
/// Amounts past a double's precision are still payloads of their own: a retry that
/// changes one is refused, not answered with the first charge. (A repeated member is
/// refused outright: `key_sources`' duplicate-member tests.)
async fn json_that_differs_only_past_a_double_is_422(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let url = s.gw.url("/v1/charges");
    for (first, changed, same) in [
        (
            r#"{"amount_wei":20000000000000000001}"#,
            r#"{"amount_wei":20000000000000000002}"#,
            r#"{"amount_wei": 2.0000000000000000001e19}"#,
        ),
        (
            r#"{"rate":394301.33835633675}"#,
            r#"{"rate":394301.3383563367}"#,
            r#"{"rate":394301.338356336750}"#,
        ),
    ] {
        let key = new_key();
        let a = s.http.post(&url, &key, first, &[]).await;
        assert_eq!(a.status, 201, "{first}");
        let b = s.http.post(&url, &key, changed, &[]).await;
        assert_eq!(b.status, 422, "{first} then {changed}");
        let c = s.http.post(&url, &key, same, &[]).await;
        assert!(c.replayed(), "{first} then {same}: {c:?}");
        assert_eq!(s.up.started(&key), 1, "{first}");
    }
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_rule_ignores_pointers_and_stores_extra_headers() {
    let Setup {
        up: _up,
        gw,
        http,
        _dir,
    } = setup_with_file_over(
        Proto::Http1,
        r#"
[[route]]
method = "POST"
path = "/v1/orders/{id}/capture"
require_key = true
ignore = ["/client_sent_at"]
store_headers = ["x-order-id"]
"#,
    )
    .await;
    let key = new_key();
    let url = gw.url("/v1/orders/42/capture");
    let first = http
        .post(
            &url,
            &key,
            r#"{"amount":5,"client_sent_at":"10:00:00"}"#,
            &[],
        )
        .await;
    assert_eq!(first.status, 201);
    let retry = http
        .post(
            &url,
            &key,
            r#"{"amount":5,"client_sent_at":"10:00:07"}"#,
            &[],
        )
        .await;
    assert!(
        retry.replayed(),
        "the ignored pointer does not count: {retry:?}"
    );
    assert_eq!(retry.header("x-order-id"), first.header("x-order-id"));
    assert!(retry.header("x-order-id").is_some());
    let changed = http
        .post(
            &url,
            &key,
            r#"{"amount":6,"client_sent_at":"10:00:07"}"#,
            &[],
        )
        .await;
    assert_eq!(changed.status, 422);
    // The rule requires a key on its route only.
    let keyless = http.send("POST", &url, &[], "{}").await;
    assert_eq!(keyless.status, 400);
    let elsewhere = http.send("POST", &gw.url("/v1/other"), &[], "{}").await;
    assert_eq!(elsewhere.status, 201);
    // On other routes the extra header is not stored.
    let k2 = new_key();
    http.post(&gw.url("/v1/other"), &k2, "{}", &[]).await;
    let r2 = http.post(&gw.url("/v1/other"), &k2, "{}", &[]).await;
    assert!(r2.replayed());
    assert_eq!(r2.header("x-order-id"), None);
}

over_both_protocols! {
async fn tenants_never_share_records(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let alice = s
        .http
        .post(&url, &key, "{}", &[("authorization", "Bearer alice")])
        .await;
    let bob = s
        .http
        .post(&url, &key, "{}", &[("authorization", "Bearer bob")])
        .await;
    assert!(!bob.replayed(), "bob never gets alice's answer");
    assert_ne!(alice.body, bob.body);
    let anon = s.http.post(&url, &key, "{}", &[]).await;
    assert!(!anon.replayed());
    assert_eq!(s.up.started(&key), 3);
    let alice_again = s
        .http
        .post(&url, &key, "{}", &[("authorization", "Bearer alice")])
        .await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    // A different payload from another tenant is not a mismatch either.
    let carol = s
        .http
        .post(
            &url,
            &key,
            r#"{"x":1}"#,
            &[("authorization", "Bearer carol")],
        )
        .await;
    assert_eq!(carol.status, 201);
}
}

over_both_protocols! {
async fn tenant_header_is_configurable(proto: Proto) {
    let s = setup_over(proto, &["--tenant-header", "x-api-key"]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let a = s.http.post(&url, &key, "{}", &[("x-api-key", "k1")]).await;
    let b = s.http.post(&url, &key, "{}", &[("x-api-key", "k2")]).await;
    assert!(!b.replayed());
    let a2 = s
        .http
        .post(
            &url,
            &key,
            "{}",
            &[("x-api-key", "k1"), ("authorization", "x")],
        )
        .await;
    assert!(a2.replayed(), "Authorization no longer names the tenant");
    assert_eq!(a2.body, a.body);
}
}

over_both_protocols! {
async fn endpoints_are_isolated_in_public_scope(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let a = s.http.post(&s.gw.url("/v1/a"), &key, "{}", &[]).await;
    let b = s.http.post(&s.gw.url("/v1/b"), &key, "{}", &[]).await;
    assert!(!a.replayed() && !b.replayed());
    assert_eq!(s.up.started(&key), 2);
}
}

over_both_protocols! {
async fn internal_scope_spans_endpoints(proto: Proto) {
    let s = setup_over(proto, &["--scope", "internal"]).await;
    let key = new_key();
    let a = s.http.post(&s.gw.url("/v1/a"), &key, "{}", &[]).await;
    assert_eq!(a.status, 201);
    // Same key, other endpoint: the same record, and a different request → 422.
    let b = s.http.post(&s.gw.url("/v1/b"), &key, "{}", &[]).await;
    assert_eq!(b.status, 422);
    assert_eq!(s.up.started(&key), 1);
}
}

/// Whether the gateway recorded an upstream answer of `status`: a fresh key gets it,
/// then a plain retry of the key either replays it (recorded; the upstream saw the key
/// once) or executes afresh, 201 (released; the upstream saw it twice).
async fn recorded(http: &Http, up: &Upstream, url: &str, status: u16) -> bool {
    let key = new_key();
    let a = http
        .post(url, &key, "{}", &[("x-test-status", &status.to_string())])
        .await;
    assert_eq!(a.status, status, "{a:?}");
    let b = http.post(url, &key, "{}", &[]).await;
    if b.replayed() {
        assert_eq!(b.status, status, "the replay is the recorded answer");
        assert_eq!(up.started(&key), 1);
        true
    } else {
        assert_eq!(b.status, 201, "released: the retry executes");
        assert_eq!(up.started(&key), 2);
        false
    }
}

over_both_protocols! {
async fn failures_that_started_are_recorded_and_replayed(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let url = s.gw.url("/v1/charges");
    for status in [500, 402] {
        assert!(recorded(&s.http, &s.up, &url, status).await, "{status}");
    }
}
}

over_both_protocols! {
async fn refusals_release_the_key(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let url = s.gw.url("/v1/charges");
    for status in [400, 401, 403, 404, 409, 422, 429, 503] {
        assert!(!recorded(&s.http, &s.up, &url, status).await, "{status}");
    }
}
}

over_both_protocols! {
async fn release_statuses_flag_replaces_the_default_list(proto: Proto) {
    let s = setup_over(proto, &["--release-statuses", "418,503", "--response-limit", "64KiB"]).await;
    let url = s.gw.url("/v1/charges");
    // Listed: released, and streamed whole past the limit on recorded answers (the
    // proxy reads the same list as the layer).
    let teapot = [("x-test-status", "418")];
    released_answer_streams_whole(&s.http, &s.up, &url, 418, &teapot).await;
    // A default release status left off the list: recorded and replayed.
    assert!(recorded(&s.http, &s.up, &url, 409).await);
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_rule_release_statuses_apply_to_their_route() {
    let Setup { up, gw, http, _dir } = setup_with_file_over(
        Proto::Http1,
        r#"
response_limit = "64KiB"

[[route]]
path = "/v1/payouts"
release_statuses = [502]
"#,
    )
    .await;
    // The route's own list: a 502 releases, and streams whole past the recorded-answer
    // limit, since the proxy asks the layer's context rather than a list of its own.
    let url = gw.url("/v1/payouts");
    let bad_gateway = [("x-test-status", "502")];
    released_answer_streams_whole(&http, &up, &url, 502, &bad_gateway).await;
    // Elsewhere the global list holds: 502 is recorded, and 409 still releases.
    let url = gw.url("/v1/charges");
    assert!(recorded(&http, &up, &url, 502).await);
    assert!(!recorded(&http, &up, &url, 409).await);
}

over_both_protocols! {
async fn release_statuses_none_records_every_answer(proto: Proto) {
    let s = setup_over(proto, &["--release-statuses", "none"]).await;
    let url = s.gw.url("/v1/charges");
    for status in [409, 503] {
        assert!(recorded(&s.http, &s.up, &url, status).await, "{status}");
    }
}
}

over_both_protocols! {
async fn upstream_disposition_header_overrides_and_is_stripped(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let url = s.gw.url("/v1/charges");
    // A 500 that did nothing: release.
    let key = new_key();
    let a = s
        .http
        .post(
            &url,
            &key,
            "{}",
            &[("x-test-status", "500"), ("x-test-disposition", "release")],
        )
        .await;
    assert_eq!(a.status, 500);
    assert_eq!(a.header("idempotency-disposition"), None, "stripped");
    let b = s.http.post(&url, &key, "{}", &[]).await;
    assert_eq!((b.status, b.replayed()), (201, false));
    // A 503 after the effect happened: record.
    let key = new_key();
    let a = s
        .http
        .post(
            &url,
            &key,
            "{}",
            &[("x-test-status", "503"), ("x-test-disposition", "record")],
        )
        .await;
    assert_eq!(a.header("idempotency-disposition"), None);
    let b = s.http.post(&url, &key, "{}", &[]).await;
    assert_eq!((b.status, b.replayed()), (503, true));
    assert_eq!(s.up.started(&key), 1);
}
}

over_both_protocols! {
async fn only_allow_listed_headers_are_replayed(proto: Proto) {
    let s = setup_over(proto, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let first = s.http.post(&url, &key, "{}", &[]).await;
    assert_eq!(first.header("set-cookie"), Some("session=abc; HttpOnly"));
    assert!(first.header("x-request-id").is_some());
    let replay = s.http.post(&url, &key, "{}", &[]).await;
    assert!(replay.replayed());
    assert_eq!(replay.header("location"), first.header("location"));
    assert!(replay.header("location").is_some());
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(replay.header("set-cookie"), None);
    // Never the stored one: the gateway's id of the replaying request.
    assert!(replay.header("x-request-id").is_some());
    assert_ne!(replay.header("x-request-id"), first.header("x-request-id"));
    assert_eq!(
        replay.header("x-order-id"),
        None,
        "not in the default allow-list"
    );
    assert_ne!(
        replay.header("date"),
        Some(OLD_DATE),
        "the date is not replayed"
    );
}
}

/// A form-encoded API (Stripe's is one): a retry whose SDK sent the same parameters in
/// another order, or spelt them with other escapes, replays; another amount is a 422.
#[tokio::test]
async fn a_form_retry_with_its_parameters_reordered_replays() {
    let s = setup(&[]).await;
    let url = s.gw.url("/v1/charges");
    let key = new_key();
    let form = |body: &'static str| {
        let (http, url, key) = (s.http.clone(), url.clone(), key.clone());
        async move {
            let headers = [
                ("idempotency-key", key.as_str()),
                ("content-type", "application/x-www-form-urlencoded"),
            ];
            http.send("POST", &url, &headers, body).await
        }
    };
    let first = form("amount=100&currency=eur&metadata[order]=A+7").await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let retry = form("metadata%5Border%5D=A%207&currency=eur&amount=100").await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    let other = form("amount=1000&currency=eur&metadata[order]=A+7").await;
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(s.up.started(&key), 1, "the upstream ran once");
    // The upstream got the body as the client first sent it.
    assert_eq!(
        s.up.seen()[0].body.as_ref(),
        b"amount=100&currency=eur&metadata[order]=A+7"
    );
}

/// A route whose clients send their key in another header (issue 40 §2): the key from
/// `PayPal-Request-Id` or `Idempotency-Key`, one record whichever it came in; two
/// different keys in the two headers are a 400 that reaches nobody; elsewhere the other
/// header is no key.
#[tokio::test]
async fn a_route_takes_its_key_from_the_headers_it_names() {
    let s = setup_with_file_over(
        Proto::Http1,
        "[[route]]\nmethod = \"POST\"\npath = \"/v2/checkout/orders\"\n\
         key_header = [\"Idempotency-Key\", \"PayPal-Request-Id\"]\n",
    )
    .await;
    let url = s.gw.url("/v2/checkout/orders");
    let key = new_key();
    let paypal = |key: String| {
        let (http, url) = (s.http.clone(), url.clone());
        async move {
            let headers = [
                ("paypal-request-id", key.as_str()),
                ("content-type", "application/json"),
            ];
            http.send("POST", &url, &headers, r#"{"intent":"CAPTURE"}"#)
                .await
        }
    };
    let first = paypal(key.clone()).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    let again = paypal(key.clone()).await;
    assert!(again.replayed(), "{again:?}");
    // The same key in the other header names the same record.
    let same = s
        .http
        .post(&url, &key, r#"{"intent":"CAPTURE"}"#, &[])
        .await;
    assert!(same.replayed(), "{same:?}");
    // The counting upstream numbers executions by Idempotency-Key: count them all.
    assert_eq!(s.up.total(), 1, "the upstream ran once");
    // Two different keys: the upstream could read either.
    let other = new_key();
    let split = s
        .http
        .post(
            &url,
            &other,
            r#"{"intent":"CAPTURE"}"#,
            &[("paypal-request-id", "another-key")],
        )
        .await;
    assert_eq!(split.status, 400, "{split:?}");
    assert_eq!(
        split.problem_type(),
        "https://idem.dev/problems/invalid-key"
    );
    let detail = split.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("paypal-request-id"), "{detail}");
    assert_eq!(s.up.total(), 1, "the 400 reached nobody");
    // On another route the header is no key: each request executes.
    let elsewhere = s.gw.url("/v1/charges");
    for _ in 0..2 {
        let headers = [
            ("paypal-request-id", "not-a-key-here"),
            ("content-type", "application/json"),
        ];
        let a = s.http.send("POST", &elsewhere, &headers, "{}").await;
        assert!(!a.replayed());
    }
    assert_eq!(s.up.total(), 3, "unkeyed elsewhere: both executed");
}
