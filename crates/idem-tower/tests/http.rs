//! SPEC S2–S8 at the HTTP level: a real axum server on 127.0.0.1 behind the layer, a real
//! client, and the handler's real execution counts. Every test runs against the memory
//! store and the SQLite store (`memory::…`, `sqlite::…`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, Method, StatusCode};
use idem_core::{
    FingerprintOptions, Lease, ManualClock, MemoryStore, Record, RecordState, Reservation,
    ReserveRequest, Result, Scope, ScopeMode, Store, StoreError, StoredResponse, Tenant,
};
use idem_test_support::scope;
use idem_test_support::{HookedStore, StoreHooks};
use idem_test_support::{WAIT, eventually};
use idem_tower::{Observer, Outcome, ReleaseStatuses, RouteConfig};
use sha2::{Digest, Sha256};
use support::{App, Counters, StoreKind, json_fingerprint};

const ORDER: &str = r#"{"sku":"tea","qty":2,"amount":100}"#;

fn count(c: &AtomicUsize) -> usize {
    Counters::get(c)
}

macro_rules! for_each_store {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::StoreKind::Memory).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::StoreKind::Sqlite).await
                }
            )*
        }
    };
}

for_each_store!(
    // S2: the key
    empty_key_is_400,
    overlong_key_is_400,
    key_of_255_characters_is_accepted,
    non_ascii_key_is_400,
    malformed_quoted_key_is_400,
    repeated_key_header_is_400,
    quoted_and_bare_forms_name_one_key,
    missing_key_on_required_route_is_400,
    missing_key_on_optional_route_passes_through,
    unkeyed_method_passes_through_with_key,
    // S4: fingerprint and body limit
    body_over_limit_is_413_and_nothing_reserved,
    chunked_body_over_limit_is_413_and_nothing_reserved,
    slow_body_is_408_and_nothing_reserved,
    semantically_equal_json_replays,
    changed_amount_is_422,
    compressed_bodies_are_fingerprinted_by_content,
    ignored_json_pointer_is_left_out,
    duplicate_json_member_is_400_and_nothing_reserved,
    duplicate_key_member_on_a_key_pointer_route_is_400,
    unreadable_json_on_a_body_reading_route_is_400_and_nothing_reserved,
    // S5: the decision table
    first_request_executes_and_records,
    replays_completed_response,
    mismatched_payload_is_422,
    another_query_string_is_422_naming_the_query,
    in_progress_is_409_with_retry_after,
    prefer_wait_duplicate_gets_the_replay_once_the_attempt_completes,
    waiter_finding_a_lapsed_lease_gets_409_and_its_retry_takes_over_as_recovered,
    expired_lease_is_taken_over_as_recovered_attempt,
    an_attempt_taken_over_while_it_ran_answers_with_the_record,
    expired_record_executes_again,
    // S3: scope
    same_key_two_tenants_execute_twice,
    same_key_two_endpoints_in_public_mode_execute_twice,
    same_key_two_endpoints_in_internal_mode_is_422,
    endpoint_is_route_template_and_path_is_fingerprinted,
    route_config_overrides_endpoint_and_requirement,
    // S6: record or release
    released_statuses_let_corrected_retry_execute,
    route_release_statuses_replace_the_layers,
    failures_500_and_402_are_replayed,
    disposition_record_overrides_release,
    disposition_release_overrides_record,
    disposition_keep_in_progress_lets_lease_lapse,
    stored_headers_are_allow_listed,
    handler_panic_is_recorded_as_500_replay,
    answer_over_response_limit_is_recorded_as_500_problem,
    released_answer_over_response_limit_streams_through_whole,
    // S7: concurrency, disconnects, leases
    concurrent_identical_requests_execute_once,
    client_disconnect_does_not_cancel_handler,
    heartbeat_renews_lease_while_handler_runs,
    stale_attempt_cannot_overwrite_takeover,
    observer_sees_each_outcome,
    ambiguous_outcomes_are_reported_and_recorded,
);

// ---------------------------------------------------------------- S2: the key

async fn assert_invalid_key(kind: StoreKind, key: &[u8], detail_has: &str) {
    let app = App::start(kind).await;
    let reply = app
        .post("/orders")
        .header("idempotency-key", key)
        .json(ORDER)
        .send()
        .await;
    let body = reply.assert_problem(400, "invalid-key");
    assert!(
        body["detail"].as_str().unwrap().contains(detail_has),
        "detail {:?} should mention {detail_has:?}",
        body["detail"]
    );
    assert!(!reply.is_replay());
    assert_eq!(count(&app.counters.orders), 0, "the handler must not run");
}

async fn empty_key_is_400(kind: StoreKind) {
    assert_invalid_key(kind, b"", "empty").await;
}

async fn overlong_key_is_400(kind: StoreKind) {
    assert_invalid_key(kind, "k".repeat(256).as_bytes(), "256 characters").await;
}

async fn key_of_255_characters_is_accepted(kind: StoreKind) {
    let app = App::start(kind).await;
    let key = "k".repeat(255);
    let first = app.post("/orders").key(&key).json(ORDER).send().await;
    assert_eq!(first.status, 201);
    let retry = app.post("/orders").key(&key).json(ORDER).send().await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay());
    assert_eq!(count(&app.counters.orders), 1);
}

async fn non_ascii_key_is_400(kind: StoreKind) {
    assert_invalid_key(kind, "caf\u{e9}-1".as_bytes(), "0xc3").await;
}

async fn malformed_quoted_key_is_400(kind: StoreKind) {
    assert_invalid_key(kind, b"\"8e03978e", "closing double quote").await;
    assert_invalid_key(kind, b"\"a\\nb\"", "escapes").await;
}

async fn repeated_key_header_is_400(kind: StoreKind) {
    let app = App::start(kind).await;
    let reply = app
        .post("/orders")
        .key("k-1")
        .key("k-1")
        .json(ORDER)
        .send()
        .await;
    let body = reply.assert_problem(400, "invalid-key");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("2 Idempotency-Key")
    );
    assert_eq!(count(&app.counters.orders), 0);
}

async fn quoted_and_bare_forms_name_one_key(kind: StoreKind) {
    let app = App::start(kind).await;
    let key = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    let first = app
        .post("/orders")
        .key(&format!("\"{key}\""))
        .json(ORDER)
        .send()
        .await;
    assert_eq!(first.status, 201);
    let bare = app.post("/orders").key(key).json(ORDER).send().await;
    assert_eq!(bare.status, 201);
    assert!(bare.is_replay());
    assert_eq!(bare.body, first.body);
    assert_eq!(count(&app.counters.orders), 1);
}

async fn missing_key_on_required_route_is_400(kind: StoreKind) {
    let app = App::start_with(kind, |l| l.require_key_if(|_, p| p.uri.path() == "/orders")).await;
    let reply = app.post("/orders").json(ORDER).send().await;
    let body = reply.assert_problem(400, "missing-key");
    assert!(body["detail"].as_str().unwrap().contains("idempotency-key"));
    assert_eq!(count(&app.counters.orders), 0);
    // The predicate leaves other routes optional.
    let other = app.post("/orders/1/capture").json("{}").send().await;
    assert_eq!(other.status, 200);
    assert_eq!(count(&app.counters.captures), 1);
}

async fn missing_key_on_optional_route_passes_through(kind: StoreKind) {
    let app = App::start(kind).await;
    for _ in 0..2 {
        let reply = app.post("/orders").json(ORDER).send().await;
        assert_eq!(reply.status, 201);
        assert!(!reply.is_replay());
        // Nothing was buffered or stripped: the first caller's headers are all there.
        assert!(reply.header("set-cookie").is_some());
    }
    assert_eq!(count(&app.counters.orders), 2);
}

async fn unkeyed_method_passes_through_with_key(kind: StoreKind) {
    let app = App::start(kind).await;
    for n in 1..=2 {
        let reply = app.call(Method::GET, "/orders").key("k-get").send().await;
        assert_eq!(reply.status, 200);
        assert!(!reply.is_replay());
        assert_eq!(reply.body, format!("read {n}"));
    }
    assert_eq!(count(&app.counters.reads), 2);
    let get_scope = idem_core::Scope::new(
        ScopeMode::Public,
        idem_core::Tenant::anonymous(),
        idem_core::Endpoint::new("GET", "/orders"),
        idem_core::Key::new("k-get").unwrap(),
    );
    assert!(app.store.get(&get_scope).await.unwrap().is_none());
}

// ---------------------------------------------------------------- S4: fingerprint

/// The detail of the 400 `duplicate-json-member` for a body that repeats `name`.
fn duplicate_detail(name: &str) -> String {
    format!(
        "the JSON body names the member \"{name}\" twice in one object; JSON parsers \
         disagree on which of the two counts, so the upstream could act on another \
         payload than the one this key is checked against; send each member once; \
         nothing was reserved or forwarded"
    )
}

/// RFC 7493 (I-JSON): a keyed JSON body that repeats a member name anywhere (names
/// equal once unescaped included) is refused before anything is reserved; the same
/// body unkeyed passes untouched.
async fn duplicate_json_member_is_400_and_nothing_reserved(kind: StoreKind) {
    let app = App::start(kind).await;
    let cases = [
        (r#"{"amount":100,"amount":1}"#, "amount"),
        (r#"{"sku":"tea","items":[{"qty":2,"qty":20}]}"#, "qty"),
        (r#"{"a":100,"\u0061":1}"#, "a"),
    ];
    for (n, (body, name)) in cases.into_iter().enumerate() {
        let key = format!("k-dup-{n}");
        let reply = app.post("/orders").key(&key).json(body).send().await;
        let problem = reply.assert_problem(400, "duplicate-json-member");
        assert_eq!(problem["detail"], duplicate_detail(name), "{body}");
        assert!(!reply.is_replay());
        assert!(
            !app.has_record("/orders", &key).await,
            "{body}: nothing stored"
        );
    }
    assert_eq!(count(&app.counters.orders), 0, "the handler must not run");
    // The same key with the body sent once each is a clean first attempt.
    let ok = app.post("/orders").key("k-dup-0").json(ORDER).send().await;
    assert_eq!(ok.status, 201);
    assert_eq!(count(&app.counters.orders), 1);
    // Unkeyed, the body is none of the layer's business.
    let unkeyed = app.post("/orders").json(cases[0].0).send().await;
    assert_eq!(unkeyed.status, 201);
    assert_eq!(count(&app.counters.orders), 2);
}

/// A key carried in the body twice (`KA` and `KB`) names no one operation: refused,
/// nothing reserved under either key, whether or not a header carries a key too.
async fn duplicate_key_member_on_a_key_pointer_route_is_400(kind: StoreKind) {
    let app = App::start_with(kind, |l| {
        l.route_config(|_, _| Some(RouteConfig::new().key_pointer("/idempotency_key").unwrap()))
    })
    .await;
    let twice = r#"{"idempotency_key":"KA","amount":100,"idempotency_key":"KB"}"#;
    let reply = app.post("/orders").json(twice).send().await;
    let problem = reply.assert_problem(400, "duplicate-json-member");
    assert_eq!(problem["detail"], duplicate_detail("idempotency_key"));
    // A second reading finding a key where the first finds none is as ambiguous.
    let null = r#"{"idempotency_key":"KA","idempotency_key":null}"#;
    let reply = app.post("/orders").json(null).send().await;
    reply.assert_problem(400, "duplicate-json-member");
    let header = app.post("/orders").key("KA").json(twice).send().await;
    header.assert_problem(400, "duplicate-json-member");
    let elsewhere = r#"{"idempotency_key":"KC","amount":100,"amount":1}"#;
    let reply = app.post("/orders").json(elsewhere).send().await;
    reply.assert_problem(400, "duplicate-json-member");
    assert_eq!(count(&app.counters.orders), 0, "the handler must not run");
    for key in ["KA", "KB", "KC"] {
        assert!(
            !app.has_record("/orders", key).await,
            "{key}: nothing stored"
        );
    }
    // A body that names no key anywhere stays unkeyed, repeated member or not.
    let unkeyed = app
        .post("/orders")
        .json(r#"{"amount":1,"amount":2}"#)
        .send()
        .await;
    assert_eq!(unkeyed.status, 201);
    let keyed = app
        .post("/orders")
        .json(r#"{"idempotency_key":"KA"}"#)
        .send()
        .await;
    assert_eq!(keyed.status, 201);
    assert_eq!(count(&app.counters.orders), 2);
    assert!(app.has_record("/orders", "KA").await);
}

async fn body_over_limit_is_413_and_nothing_reserved(kind: StoreKind) {
    let app = App::start_with(kind, |l| l.body_limit(64)).await;
    let big = format!(r#"{{"note":"{}"}}"#, "x".repeat(100));
    let reply = app.post("/orders").key("k-big").json(&big).send().await;
    let body = reply.assert_problem(413, "body-too-large");
    assert!(body["detail"].as_str().unwrap().contains("64-byte"));
    assert_eq!(count(&app.counters.orders), 0);
    assert!(!app.has_record("/orders", "k-big").await);
    // A body within the limit with the same key then executes.
    let ok = app.post("/orders").key("k-big").json(ORDER).send().await;
    assert_eq!(ok.status, 201);
    assert_eq!(count(&app.counters.orders), 1);
}

async fn chunked_body_over_limit_is_413_and_nothing_reserved(kind: StoreKind) {
    let app = App::start_with(kind, |l| l.body_limit(64)).await;
    // No Content-Length: the limit is found while reading.
    let chunk = "x".repeat(50);
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: {}\r\nIdempotency-Key: k-chunked\r\n\
         Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         32\r\n{chunk}\r\n32\r\n{chunk}\r\n0\r\n\r\n",
        app.addr
    );
    let answer = app.raw(request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("https://idem.dev/problems/body-too-large"),
        "{answer}"
    );
    assert_eq!(count(&app.counters.orders), 0);
    assert!(!app.has_record("/orders", "k-chunked").await);
}

async fn slow_body_is_408_and_nothing_reserved(kind: StoreKind) {
    let app = App::start_with(kind, |l| l.body_timeout(Duration::from_millis(200))).await;
    // Announces the whole order, sends 10 bytes and waits: the socket stays open, so the
    // timeout alone ends the read.
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: {}\r\nIdempotency-Key: k-slow\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        app.addr,
        ORDER.len(),
        &ORDER[..10]
    );
    let started = tokio::time::Instant::now();
    let answer = app.raw(request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("https://idem.dev/problems/body-timeout"),
        "{answer}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(count(&app.counters.orders), 0);
    assert!(!app.has_record("/orders", "k-slow").await);

    // Nothing was reserved: the retry, body whole, executes.
    let ok = app.post("/orders").key("k-slow").json(ORDER).send().await;
    assert_eq!(ok.status, 201);
    assert_eq!(count(&app.counters.orders), 1);
}

async fn semantically_equal_json_replays(kind: StoreKind) {
    let app = App::start(kind).await;
    let first = app.post("/orders").key("k-json").json(ORDER).send().await;
    assert_eq!(first.status, 201);
    let reordered = "{ \"amount\" : 100,\n  \"qty\": 2,\t\"sku\": \"tea\" }";
    let retry = app
        .post("/orders")
        .key("k-json")
        .json(reordered)
        .send()
        .await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
    assert_eq!(count(&app.counters.orders), 1);
}

async fn changed_amount_is_422(kind: StoreKind) {
    let app = App::start(kind).await;
    assert_eq!(
        app.post("/orders")
            .key("k-amt")
            .json(ORDER)
            .send()
            .await
            .status,
        201
    );
    let changed = r#"{"sku":"tea","qty":2,"amount":1000}"#;
    let reply = app.post("/orders").key("k-amt").json(changed).send().await;
    reply.assert_problem(422, "key-reused");
    assert!(!reply.is_replay());
    assert_eq!(count(&app.counters.orders), 1);
}

/// `body` gzipped with `mtime` in its header, as Python's `gzip.compress` writes the
/// current second there.
fn gzip(body: &str, mtime: u32, level: u32) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::GzBuilder::new()
        .mtime(mtime)
        .write(Vec::new(), flate2::Compression::new(level));
    e.write_all(body.as_bytes()).unwrap();
    e.finish().unwrap()
}

async fn compressed_bodies_are_fingerprinted_by_content(kind: StoreKind) {
    let app = App::start(kind).await;
    let send = |body: Vec<u8>, coding: Option<&'static str>| {
        let mut call = app
            .post("/orders")
            .key("k-gz")
            .header("content-type", "application/json")
            .body(body);
        if let Some(coding) = coding {
            call = call.header("content-encoding", coding);
        }
        call.send()
    };
    let first = send(gzip(ORDER, 1_796_140_000, 6), Some("gzip")).await;
    assert_eq!(first.status, 201);
    // Compressed afresh a second later, at another level, keys in another order: the
    // same content, so a replay.
    let reordered = r#"{"qty":2,"amount":100,"sku":"tea"}"#;
    let retry = send(gzip(reordered, 1_796_140_001, 9), Some("gzip")).await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
    // Not compressed at all: still the same content.
    let plain = send(ORDER.as_bytes().to_vec(), None).await;
    assert!(plain.is_replay());
    // Other content, however compressed, is another payload.
    let changed = gzip(r#"{"sku":"tea","qty":2,"amount":1000}"#, 1_796_140_002, 6);
    send(changed, Some("gzip"))
        .await
        .assert_problem(422, "key-reused");
    assert_eq!(count(&app.counters.orders), 1);
}

async fn ignored_json_pointer_is_left_out(kind: StoreKind) {
    let app = App::start_with(kind, |l| {
        l.fingerprint_options(
            FingerprintOptions::default()
                .ignore_pointer("/sent_at")
                .unwrap(),
        )
    })
    .await;
    let a = r#"{"amount":100,"sent_at":"2030-01-01T00:00:00Z"}"#;
    let b = r#"{"amount":100,"sent_at":"2030-01-01T00:00:09Z"}"#;
    assert_eq!(
        app.post("/orders").key("k-ptr").json(a).send().await.status,
        201
    );
    let retry = app.post("/orders").key("k-ptr").json(b).send().await;
    assert!(retry.is_replay());
    let c = r#"{"amount":101,"sent_at":"2030-01-01T00:00:00Z"}"#;
    app.post("/orders")
        .key("k-ptr")
        .json(c)
        .send()
        .await
        .assert_problem(422, "key-reused");
    assert_eq!(count(&app.counters.orders), 1);
}

/// Issue 61: on a route that reads the body (a key pointer, an ignored pointer), a JSON
/// body the layer cannot read is refused before anything is reserved, where it once
/// passed unkeyed (the key pointer) or was hashed as bytes (the ignored pointer). A
/// compressed body's key is read in its content, as its fingerprint is.
async fn unreadable_json_on_a_body_reading_route_is_400_and_nothing_reserved(kind: StoreKind) {
    let app = App::start_with(kind, |l| {
        l.route_config(|_, parts| {
            let route = RouteConfig::new();
            Some(match parts.uri.path() {
                "/orders" => route.key_pointer("/idempotency_key").unwrap(),
                _ => route.ignore_pointer("/sent_at").unwrap(),
            })
        })
    })
    .await;
    let lone = r#"{"idempotency_key":"K1","note":"\ud800","amount":100}"#;
    let deep = format!(
        r#"{{"idempotency_key":"K1","deep":{}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    for (path, key) in [
        ("/orders", None),
        ("/orders", Some("K1")),
        ("/refunds", Some("K1")),
    ] {
        for body in [lone, &deep] {
            let mut call = app.post(path).json(body);
            if let Some(key) = key {
                call = call.key(key);
            }
            let problem = call.send().await.assert_problem(400, "unreadable-json");
            let detail = problem["detail"].as_str().unwrap();
            assert!(
                detail.starts_with("the JSON body cannot be read: "),
                "{detail}"
            );
            assert!(
                detail.ends_with("nothing was reserved or forwarded"),
                "{detail}"
            );
        }
    }
    assert!(!app.has_record("/orders", "K1").await, "nothing stored");
    assert!(!app.has_record("/refunds", "K1").await, "nothing stored");
    assert_eq!(count(&app.counters.orders), 0, "the handler must not run");
    // A key in a gzipped body is read in its content: keyed, and its retry replays.
    let body = r#"{"idempotency_key":"K-gz","amount":100}"#;
    for attempt in 0..2u32 {
        let reply = app
            .post("/orders")
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(gzip(body, 1_796_140_000 + attempt, 6))
            .send()
            .await;
        assert_eq!(reply.status, 201);
        assert_eq!(reply.is_replay(), attempt == 1);
    }
    assert_eq!(count(&app.counters.orders), 1);
}

// ---------------------------------------------------------------- S5: the table

async fn first_request_executes_and_records(kind: StoreKind) {
    let app = App::start(kind).await;
    let reply = app.post("/orders").key("k-first").json(ORDER).send().await;
    assert_eq!(reply.status, 201);
    assert!(!reply.is_replay());
    let body = reply.json();
    assert_eq!(body["order"], 1);
    assert_eq!(body["attempt"], 1);
    assert_eq!(body["recovered"], false);
    // The first caller gets the handler's whole response.
    assert_eq!(reply.header("set-cookie"), Some("session=s3cret"));
    assert_eq!(reply.header("x-request-id"), Some("req-1"));
    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/orders", "k-first"))
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(record.attempt, 1);
    match record.state {
        RecordState::Completed { response, .. } => {
            assert_eq!(response.status, 201);
            assert_eq!(response.body, reply.body);
            let mut names: Vec<&str> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
            names.sort_unstable();
            assert_eq!(names, ["content-type", "location"]);
        }
        other => panic!("not completed: {other:?}"),
    }
    assert_eq!(count(&app.counters.orders), 1);
}

async fn replays_completed_response(kind: StoreKind) {
    let app = App::start(kind).await;
    let first = app.post("/orders").key("k-replay").json(ORDER).send().await;
    assert_eq!(first.status, 201);
    for _ in 0..3 {
        let retry = app.post("/orders").key("k-replay").json(ORDER).send().await;
        assert_eq!(retry.status, 201);
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
        assert_eq!(retry.header("content-type"), Some("application/json"));
        assert_eq!(retry.header("location"), Some("/orders/1"));
        assert_eq!(
            retry.header("set-cookie"),
            None,
            "cookies are never replayed"
        );
        assert_eq!(
            retry.header("x-request-id"),
            None,
            "request ids are never replayed"
        );
        assert_eq!(
            retry.header("x-order-version"),
            None,
            "not on the allow-list"
        );
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(count(&app.counters.orders), 1);
}

/// A retry whose query string differs is another request (SPEC S4: the fingerprint
/// covers the request target), and the 422 says the query string may be what changed.
async fn another_query_string_is_422_naming_the_query(kind: StoreKind) {
    let app = App::start(kind).await;
    let first = app
        .post("/orders?expand=customer")
        .key("k-query")
        .json(ORDER)
        .send()
        .await;
    assert_eq!(first.status, 201);
    let retry = app
        .post("/orders?expand=invoice")
        .key("k-query")
        .json(ORDER)
        .send()
        .await;
    let problem = retry.assert_problem(422, "key-reused");
    assert_eq!(
        problem["detail"],
        "this key was already used for a request with a different method, path, query \
         string or body; use a new key for a new operation"
    );
    assert!(!retry.is_replay());
    assert_eq!(count(&app.counters.orders), 1);
}

async fn mismatched_payload_is_422(kind: StoreKind) {
    let app = App::start(kind).await;
    assert_eq!(
        app.post("/orders")
            .key("k-mis")
            .json(ORDER)
            .send()
            .await
            .status,
        201
    );
    let reply = app
        .post("/orders")
        .key("k-mis")
        .json(r#"{"sku":"coffee","qty":2,"amount":100}"#)
        .send()
        .await;
    let body = reply.assert_problem(422, "key-reused");
    assert!(body["detail"].as_str().unwrap().contains("different"));
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(count(&app.counters.orders), 1);
    // The record still holds the first answer.
    let again = app.post("/orders").key("k-mis").json(ORDER).send().await;
    assert!(again.is_replay());
}

async fn in_progress_is_409_with_retry_after(kind: StoreKind) {
    let app = Arc::new(App::start(kind).await);
    let first = tokio::spawn({
        let app = app.clone();
        async move { app.post("/slow").key("k-busy").json("{}").send().await }
    });
    eventually("the slow handler started", WAIT, async || {
        count(&app.counters.slow_started) == 1
    })
    .await;
    let busy = app.post("/slow").key("k-busy").json("{}").send().await;
    busy.assert_problem(409, "request-in-progress");
    let wait: u64 = busy
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "Retry-After {wait}");
    app.open_gate(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let retry = app.post("/slow").key("k-busy").json("{}").send().await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, "slow 1 done");
    assert_eq!(count(&app.counters.slow_started), 1);
}

/// SPEC S15: with `Prefer: wait=N` the duplicate is held until the first attempt
/// completes and gets its answer, marked as the preference applied; the handler ran once.
async fn prefer_wait_duplicate_gets_the_replay_once_the_attempt_completes(kind: StoreKind) {
    let observer = Arc::new(CountingObserver::default());
    let app = Arc::new(App::start_with(kind, |l| l.observer(observer.clone())).await);
    let first = tokio::spawn({
        let app = app.clone();
        async move { app.post("/slow").key("k-wait").json("{}").send().await }
    });
    eventually("the slow handler started", WAIT, async || {
        count(&app.counters.slow_started) == 1
    })
    .await;
    let duplicate = tokio::spawn({
        let app = app.clone();
        async move {
            app.post("/slow")
                .key("k-wait")
                .header("prefer", "respond-async, wait=30")
                .json("{}")
                .send()
                .await
        }
    });
    // The duplicate's first reserve answered in progress; its watch was made before it.
    eventually("the duplicate reserved", WAIT, async || {
        let calls = observer.store_calls.lock().unwrap();
        calls.iter().filter(|(op, _)| *op == "reserve").count() == 2
    })
    .await;
    app.open_gate(1);
    let first = first.await.unwrap();
    let duplicate = duplicate.await.unwrap();
    assert_eq!(first.status, 201);
    assert!(duplicate.is_replay(), "{:?}", duplicate.status);
    assert_eq!(duplicate.status, 201);
    assert_eq!(duplicate.body, first.body);
    assert_eq!(duplicate.header("preference-applied"), Some("wait=30"));
    assert_eq!(count(&app.counters.slow_started), 1);
}

/// A waiter keeps its body's fingerprint, not its body, so a wait that ends with the
/// key to itself (here: the attempt's worker died and its lease lapsed) cannot execute:
/// it answers 409 with `Retry-After: 1`, and leaves the lease lapsed, so that its
/// client's retry takes over as a recovered attempt, as it would have had nobody waited.
async fn waiter_finding_a_lapsed_lease_gets_409_and_its_retry_takes_over_as_recovered(
    kind: StoreKind,
) {
    let observer = Arc::new(CountingObserver::default());
    let app = Arc::new(App::start_with(kind, |l| l.observer(observer.clone())).await);
    let lease_for = Duration::from_secs(60);
    let request = support::reserve_request("/orders", "k-lapse", ORDER, lease_for);
    let Reservation::Acquired(_dead) = app.store.reserve(&request).await.unwrap() else {
        panic!("the dead worker's reserve");
    };
    let waiter = tokio::spawn({
        let app = app.clone();
        async move {
            app.post("/orders")
                .key("k-lapse")
                .header("prefer", "wait=30")
                .json(ORDER)
                .send()
                .await
        }
    });
    // The waiter's first reserve answered in progress before the lease lapses.
    eventually("the waiter reserved", WAIT, async || {
        let calls = observer.store_calls.lock().unwrap();
        calls.iter().filter(|(op, _)| *op == "reserve").count() == 1
    })
    .await;
    app.clock.advance(lease_for + Duration::from_millis(1));
    let waited = waiter.await.unwrap();
    waited.assert_problem(409, "request-in-progress");
    assert_eq!(waited.header("retry-after"), Some("1"));
    assert_eq!(waited.header("preference-applied"), None);
    assert_eq!(count(&app.counters.orders), 0, "nothing ran for the waiter");

    let retry = app.post("/orders").key("k-lapse").json(ORDER).send().await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    let body = retry.json();
    assert_eq!(
        body["recovered"], true,
        "the upstream hears of the dead attempt"
    );
    // The waiter's hand-back counts as an attempt that did not run.
    assert_eq!(body["attempt"], 3);
    assert_eq!(count(&app.counters.orders), 1);
}

/// The child key `IdempotencyContext::derive` documents: SHA-256 of the scope digest
/// and the label, length-prefixed.
fn expected_child_key(scope: &Scope, label: &str) -> String {
    let mut h = Sha256::new();
    let digest = scope.digest();
    for part in [digest.as_bytes(), label.as_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}

async fn expired_lease_is_taken_over_as_recovered_attempt(kind: StoreKind) {
    let app = App::start(kind).await;
    // A worker reserved the key and died before completing.
    let lease_for = Duration::from_secs(60);
    let dead = match app
        .store
        .reserve(&support::reserve_request(
            "/orders", "k-dead", ORDER, lease_for,
        ))
        .await
        .unwrap()
    {
        Reservation::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    // While its lease lives, retries wait: a second, since the attempt has only just
    // begun.
    let busy = app.post("/orders").key("k-dead").json(ORDER).send().await;
    busy.assert_problem(409, "request-in-progress");
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(count(&app.counters.orders), 0);

    app.clock.advance(lease_for + Duration::from_millis(1));
    let taken = app.post("/orders").key("k-dead").json(ORDER).send().await;
    assert_eq!(taken.status, 201);
    assert!(!taken.is_replay());
    let body = taken.json();
    assert_eq!(body["attempt"], 2);
    assert_eq!(body["recovered"], true);
    let scope = scope(Tenant::anonymous(), "/orders", "k-dead");
    assert_eq!(body["charge_key"], expected_child_key(&scope, "charge"));
    assert_eq!(count(&app.counters.orders), 1);

    // The dead worker, were it to wake up, cannot overwrite the new attempt's answer.
    let late = app
        .store
        .complete(&dead, &StoredResponse::new(500, "stale"))
        .await;
    assert!(matches!(late, Err(StoreError::Fenced)), "{late:?}");
    let retry = app.post("/orders").key("k-dead").json(ORDER).send().await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, taken.body);
    assert_eq!(count(&app.counters.orders), 1);
}

/// An attempt that was taken over while it ran (its worker paused past its lease, say)
/// cannot record its answer; nor does its client get that answer, which the key's
/// record contradicts: it gets what a retry would, 409 while the other attempt runs,
/// then the recorded answer replayed (SPEC S7: answers never change).
async fn an_attempt_taken_over_while_it_ran_answers_with_the_record(kind: StoreKind) {
    let app = Arc::new(App::start(kind).await);
    let lease_for = Duration::from_secs(60);
    for theirs in [None, Some("theirs")] {
        let key = format!("k-paused-{}", theirs.is_some());
        let request = support::reserve_request("/slow", &key, ORDER, lease_for);
        let first = tokio::spawn({
            let (app, key) = (app.clone(), key.clone());
            async move { app.post("/slow").key(&key).json(ORDER).send().await }
        });
        eventually("the first attempt runs", WAIT, async || {
            app.counters.slow_started.load(Ordering::SeqCst) == usize::from(theirs.is_some()) + 1
        })
        .await;
        // Its lease lapses; another attempt takes the key over, and records its
        // answer or is still running.
        app.clock.advance(lease_for + Duration::from_millis(1));
        let Reservation::Acquired(second) = app.store.reserve(&request).await.unwrap() else {
            panic!("the takeover acquires");
        };
        assert_eq!(second.attempt, 2);
        if let Some(theirs) = theirs {
            app.store
                .complete(&second, &StoredResponse::new(201, theirs))
                .await
                .unwrap();
        }
        app.open_gate(1);
        let late = first.await.unwrap();
        match theirs {
            None => {
                late.assert_problem(409, "request-in-progress");
            }
            Some(theirs) => {
                assert!(late.is_replay(), "{late:?}");
                assert_eq!((late.status, late.body.as_ref()), (201, theirs.as_bytes()));
            }
        }
    }
    assert_eq!(app.counters.slow_finished.load(Ordering::SeqCst), 2);
}

async fn expired_record_executes_again(kind: StoreKind) {
    let ttl = Duration::from_secs(3600);
    let app = App::start_with(kind, |l| l.ttl(ttl)).await;
    assert_eq!(
        app.post("/orders")
            .key("k-ttl")
            .json(ORDER)
            .send()
            .await
            .status,
        201
    );
    app.clock.advance(ttl - Duration::from_secs(1));
    assert!(
        app.post("/orders")
            .key("k-ttl")
            .json(ORDER)
            .send()
            .await
            .is_replay()
    );
    app.clock.advance(Duration::from_secs(1));
    let again = app.post("/orders").key("k-ttl").json(ORDER).send().await;
    assert_eq!(again.status, 201);
    assert!(!again.is_replay());
    assert_eq!(again.json()["order"], 2);
    assert_eq!(again.json()["attempt"], 1);
    assert_eq!(count(&app.counters.orders), 2);
}

// ---------------------------------------------------------------- S3: scope

async fn same_key_two_tenants_execute_twice(kind: StoreKind) {
    let app = App::start(kind).await;
    let a = app
        .post("/orders")
        .key("shared")
        .header("authorization", "Bearer sk_a")
        .json(r#"{"sku":"a"}"#)
        .send()
        .await;
    let b = app
        .post("/orders")
        .key("shared")
        .header("authorization", "Bearer sk_b")
        .json(r#"{"sku":"b"}"#)
        .send()
        .await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!b.is_replay());
    assert_eq!(count(&app.counters.orders), 2);
    for (auth, first, sku) in [("Bearer sk_a", &a, "a"), ("Bearer sk_b", &b, "b")] {
        let retry = app
            .post("/orders")
            .key("shared")
            .header("authorization", auth)
            .json(&format!(r#"{{"sku":"{sku}"}}"#))
            .send()
            .await;
        assert!(retry.is_replay());
        assert_eq!(
            retry.body, first.body,
            "each tenant sees only its own answer"
        );
        assert_eq!(retry.json()["request"]["sku"], sku);
    }
    // An anonymous caller with the same key and tenant b's body executes on its own.
    let anon = app
        .post("/orders")
        .key("shared")
        .json(r#"{"sku":"b"}"#)
        .send()
        .await;
    assert!(!anon.is_replay());
    assert_eq!(count(&app.counters.orders), 3);
    // The raw credential is nowhere in the stored scope: its HMAC under the store's
    // secret names it, scheme folded.
    let tenants = idem_core::TenantKey::from_store(&*app.store).await.unwrap();
    let record = app
        .store
        .get(&scope(
            tenants.credential("authorization", b"bearer sk_a"),
            "/orders",
            "shared",
        ))
        .await
        .unwrap()
        .expect("tenant a's record");
    let tenant = record.scope.tenant().as_str();
    assert!(tenant.starts_with(idem_core::TENANT_PREFIX), "{tenant}");
    assert!(!tenant.contains("sk_a"), "{tenant}");
}

async fn same_key_two_endpoints_in_public_mode_execute_twice(kind: StoreKind) {
    let app = App::start(kind).await;
    let order = app.post("/orders").key("k-ep").json("{}").send().await;
    let capture = app
        .post("/orders/7/capture")
        .key("k-ep")
        .json("{}")
        .send()
        .await;
    assert_eq!((order.status, capture.status), (201, 200));
    assert!(!capture.is_replay());
    assert_eq!(count(&app.counters.orders), 1);
    assert_eq!(count(&app.counters.captures), 1);
    let again = app
        .post("/orders/7/capture")
        .key("k-ep")
        .json("{}")
        .send()
        .await;
    assert!(again.is_replay());
    assert_eq!(again.json()["captured"], 7);
}

async fn same_key_two_endpoints_in_internal_mode_is_422(kind: StoreKind) {
    let app = App::start_with(kind, |l| l.scope_mode(ScopeMode::Internal)).await;
    assert_eq!(
        app.post("/orders")
            .key("k-int")
            .json("{}")
            .send()
            .await
            .status,
        201
    );
    let other = app
        .post("/orders/7/capture")
        .key("k-int")
        .json("{}")
        .send()
        .await;
    other.assert_problem(422, "key-reused");
    assert_eq!(count(&app.counters.captures), 0);
}

async fn endpoint_is_route_template_and_path_is_fingerprinted(kind: StoreKind) {
    let app = App::start(kind).await;
    let one = app
        .post("/orders/1/capture")
        .key("k-cap")
        .json("{}")
        .send()
        .await;
    assert_eq!(one.json()["captured"], 1);
    // The record's endpoint is axum's route template.
    let template_scope = scope(Tenant::anonymous(), "/orders/{id}/capture", "k-cap");
    assert!(app.store.get(&template_scope).await.unwrap().is_some());
    // The same key on another order is not order 1's replay.
    let two = app
        .post("/orders/2/capture")
        .key("k-cap")
        .json("{}")
        .send()
        .await;
    two.assert_problem(422, "key-reused");
    assert_eq!(count(&app.counters.captures), 1);
}

async fn route_config_overrides_endpoint_and_requirement(kind: StoreKind) {
    let app = App::start_with(kind, |l| {
        l.route_config(|_method, parts| {
            (parts.uri.path() == "/orders").then(|| {
                RouteConfig::new()
                    .endpoint("/v1/orders")
                    .require_key(true)
                    .store_headers([HeaderName::from_static("x-order-version")])
            })
        })
    })
    .await;
    app.post("/orders")
        .json(ORDER)
        .send()
        .await
        .assert_problem(400, "missing-key");
    assert_eq!(
        app.post("/orders")
            .key("k-rc")
            .json(ORDER)
            .send()
            .await
            .status,
        201
    );
    assert!(
        app.store
            .get(&scope(Tenant::anonymous(), "/v1/orders", "k-rc"))
            .await
            .unwrap()
            .is_some()
    );
    let retry = app.post("/orders").key("k-rc").json(ORDER).send().await;
    assert_eq!(retry.header("x-order-version"), Some("v1"));
    assert_eq!(count(&app.counters.orders), 1);
}

// ---------------------------------------------------------------- S6: record or release

fn status_body(status: u16, disposition: Option<&str>) -> String {
    match disposition {
        Some(d) => format!(r#"{{"status":{status},"disposition":"{d}"}}"#),
        None => format!(r#"{{"status":{status}}}"#),
    }
}

async fn released_statuses_let_corrected_retry_execute(kind: StoreKind) {
    let app = App::start(kind).await;
    let mut calls = 0;
    for status in [400u16, 422, 429, 503] {
        let key = format!("k-rel-{status}");
        let refused = app
            .post("/status")
            .key(&key)
            .json(&status_body(status, None))
            .send()
            .await;
        calls += 1;
        assert_eq!(refused.status, status);
        assert!(
            refused
                .body
                .starts_with(format!("handler answered {status}").as_bytes())
        );
        assert!(
            !app.has_record("/status", &key).await,
            "{status} must release the key"
        );
        // The corrected request, same key, executes.
        let corrected = app
            .post("/status")
            .key(&key)
            .json(&status_body(201, None))
            .send()
            .await;
        calls += 1;
        assert_eq!(corrected.status, 201, "after {status}");
        assert!(!corrected.is_replay());
        assert_eq!(count(&app.counters.statuses), calls);
    }
}

async fn route_release_statuses_replace_the_layers(kind: StoreKind) {
    // /status releases only 500 (its handler answers before acting, say); every other
    // route keeps the layer's set.
    let app = App::start_with(kind, |l| {
        let statuses = ReleaseStatuses::new([StatusCode::INTERNAL_SERVER_ERROR]);
        l.route_config(move |_method, parts| {
            (parts.uri.path() == "/status")
                .then(|| RouteConfig::new().release_statuses(statuses.clone()))
        })
    })
    .await;
    let first = app
        .post("/status")
        .key("k-route-500")
        .json(&status_body(500, None))
        .send()
        .await;
    assert_eq!(first.status, 500);
    assert_eq!(first.header("x-context-releases"), Some("true"));
    let retry = app
        .post("/status")
        .key("k-route-500")
        .json(&status_body(500, None))
        .send()
        .await;
    assert!(!retry.is_replay(), "500 released on this route");
    assert_eq!(count(&app.counters.statuses), 2);

    // 409 is off the route's set: recorded and replayed.
    let first = app
        .post("/status")
        .key("k-route-409")
        .json(&status_body(409, None))
        .send()
        .await;
    assert_eq!(first.header("x-context-releases"), Some("false"));
    let retry = app
        .post("/status")
        .key("k-route-409")
        .json(&status_body(409, None))
        .send()
        .await;
    assert!(retry.is_replay(), "409 recorded on this route");
    assert_eq!(retry.status, 409);
    assert_eq!(count(&app.counters.statuses), 3);
}

async fn failures_500_and_402_are_replayed(kind: StoreKind) {
    let app = App::start(kind).await;
    for (i, status) in [500u16, 402].into_iter().enumerate() {
        let key = format!("k-fail-{status}");
        let body = status_body(status, None);
        let first = app.post("/status").key(&key).json(&body).send().await;
        assert_eq!(first.status, status);
        let retry = app.post("/status").key(&key).json(&body).send().await;
        assert_eq!(retry.status, status);
        assert!(retry.is_replay(), "{status} must be replayed");
        assert_eq!(retry.body, first.body);
        assert_eq!(count(&app.counters.statuses), i + 1);
    }
}

async fn disposition_record_overrides_release(kind: StoreKind) {
    let app = App::start(kind).await;
    let body = status_body(503, Some("record"));
    assert_eq!(
        app.post("/status")
            .key("k-d-rec")
            .json(&body)
            .send()
            .await
            .status,
        503
    );
    let retry = app.post("/status").key("k-d-rec").json(&body).send().await;
    assert_eq!(retry.status, 503);
    assert!(retry.is_replay());
    assert_eq!(count(&app.counters.statuses), 1);
}

async fn disposition_release_overrides_record(kind: StoreKind) {
    let app = App::start(kind).await;
    let body = status_body(200, Some("release"));
    for n in 1..=2 {
        let reply = app.post("/status").key("k-d-rel").json(&body).send().await;
        assert_eq!(reply.status, 200);
        assert!(!reply.is_replay());
        assert_eq!(count(&app.counters.statuses), n);
    }
}

async fn disposition_keep_in_progress_lets_lease_lapse(kind: StoreKind) {
    let lease = Duration::from_secs(60);
    let app = App::start_with(kind, |l| l.lease(lease)).await;
    let body = status_body(504, Some("keep"));
    let first = app.post("/status").key("k-d-keep").json(&body).send().await;
    assert_eq!(first.status, 504);
    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/status", "k-d-keep"))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    // Until the lease lapses the outcome is unknown: retries wait.
    app.post("/status")
        .key("k-d-keep")
        .json(&body)
        .send()
        .await
        .assert_problem(409, "request-in-progress");
    app.clock.advance(lease + Duration::from_millis(1));
    let corrected = status_body(201, None);
    // The fingerprint is the first request's; the retry must be the same request.
    app.post("/status")
        .key("k-d-keep")
        .json(&corrected)
        .send()
        .await
        .assert_problem(422, "key-reused");
    let taken = app.post("/status").key("k-d-keep").json(&body).send().await;
    assert_eq!(taken.status, 504);
    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/status", "k-d-keep"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempt, 2, "the retry took over as attempt 2");
    assert_eq!(count(&app.counters.statuses), 2);
}

async fn stored_headers_are_allow_listed(kind: StoreKind) {
    let app = App::start_with(kind, |l| {
        l.store_headers([
            HeaderName::from_static("x-order-version"),
            HeaderName::from_static("set-cookie"),
            HeaderName::from_static("x-request-id"),
            HeaderName::from_static("date"),
        ])
    })
    .await;
    let first = app.post("/orders").key("k-hdr").json(ORDER).send().await;
    assert_eq!(first.header("set-cookie"), Some("session=s3cret"));
    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/orders", "k-hdr"))
        .await
        .unwrap()
        .unwrap();
    let RecordState::Completed { response, .. } = record.state else {
        panic!("not completed")
    };
    let mut names: Vec<&str> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["content-type", "location", "x-order-version"]);
    let retry = app.post("/orders").key("k-hdr").json(ORDER).send().await;
    assert!(retry.is_replay());
    assert_eq!(retry.header("x-order-version"), Some("v1"));
    assert_eq!(retry.header("set-cookie"), None);
    assert_eq!(retry.header("x-request-id"), None);
}

async fn handler_panic_is_recorded_as_500_replay(kind: StoreKind) {
    let app = App::start(kind).await;
    let first = app.post("/panic").key("k-panic").json("{}").send().await;
    first.assert_problem(500, "handler-failed");
    assert!(!first.is_replay());
    let retry = app.post("/panic").key("k-panic").json("{}").send().await;
    retry.assert_problem(500, "handler-failed");
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
    assert_eq!(
        count(&app.counters.panics),
        1,
        "a panicked handler may have had effects"
    );
}

async fn answer_over_response_limit_is_recorded_as_500_problem(kind: StoreKind) {
    // The order's 201 answer is longer than 16 bytes.
    let app = App::start_with(kind, |l| l.response_limit(16)).await;
    let first = app.post("/orders").key("k-huge").json(ORDER).send().await;
    let problem = first.assert_problem(500, "response-too-large");
    assert!(problem["detail"].as_str().unwrap().contains("16-byte"));
    assert!(!first.is_replay());
    assert_eq!(count(&app.counters.orders), 1);
    // Recorded, not released: the order was placed, so it must not be placed again.
    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/orders", "k-huge"))
        .await
        .unwrap()
        .expect("a record");
    match record.state {
        RecordState::Completed { response, .. } => {
            assert_eq!(response.status, 500);
            assert_eq!(response.body, first.body);
        }
        other => panic!("expected a completed record, found {other:?}"),
    }
    let retry = app.post("/orders").key("k-huge").json(ORDER).send().await;
    retry.assert_problem(500, "response-too-large");
    assert!(retry.is_replay());
    assert_eq!(retry.body, first.body);
    assert_eq!(count(&app.counters.orders), 1);

    // An answer within the limit is recorded as it is.
    let app = App::start_with(kind, |l| l.response_limit(64 * 1024)).await;
    let ok = app.post("/orders").key("k-fits").json(ORDER).send().await;
    assert_eq!(ok.status, 201);
}

async fn released_answer_over_response_limit_streams_through_whole(kind: StoreKind) {
    // Every answer of /status is longer than 16 bytes. Released answers are not
    // recorded, so the limit on recorded answers does not cut them.
    let app = App::start_with(kind, |l| l.response_limit(16)).await;
    for (key, body) in [
        ("k-big-rel", status_body(200, Some("release"))),
        ("k-big-429", status_body(429, None)),
    ] {
        for _ in 1..=2 {
            let reply = app.post("/status").key(key).json(&body).send().await;
            let status = if key == "k-big-rel" { 200 } else { 429 };
            assert_eq!(reply.status, status, "{reply:?}");
            let calls = count(&app.counters.statuses);
            assert_eq!(
                reply.body,
                format!("handler answered {status} (call {calls})").as_bytes()
            );
            assert!(!reply.is_replay());
            assert!(!app.has_record("/status", key).await, "released: no record");
        }
    }
    assert_eq!(count(&app.counters.statuses), 4, "each retry executes");
}

// ---------------------------------------------------------------- S7

async fn concurrent_identical_requests_execute_once(kind: StoreKind) {
    const N: usize = 50;
    let app = Arc::new(App::start(kind).await);
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..N {
        let (app, barrier, tx) = (app.clone(), barrier.clone(), tx.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let reply = app.post("/slow").key("k-race").json(ORDER).send().await;
            tx.send(reply).expect("collector alive");
        });
    }
    // The handler is held at its gate, so every other request answers first.
    let mut conflicts = 0;
    for _ in 0..N - 1 {
        let reply = rx.recv().await.expect("a reply");
        reply.assert_problem(409, "request-in-progress");
        assert!(reply.header("retry-after").is_some());
        conflicts += 1;
    }
    assert_eq!(count(&app.counters.slow_started), 1);
    app.open_gate(N);
    let winner = rx.recv().await.expect("the executing reply");
    assert_eq!(winner.status, 201);
    assert!(!winner.is_replay());
    assert_eq!(conflicts, N - 1);
    // Retries now replay; the handler never ran twice.
    let retries: Vec<_> = (0..10)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.post("/slow").key("k-race").json(ORDER).send().await })
        })
        .collect();
    for r in retries {
        let r = r.await.unwrap();
        assert_eq!(r.status, 201);
        assert!(r.is_replay());
        assert_eq!(r.body, winner.body);
    }
    assert_eq!(count(&app.counters.slow_started), 1);
    assert_eq!(count(&app.counters.slow_finished), 1);
}

async fn client_disconnect_does_not_cancel_handler(kind: StoreKind) {
    let app = App::start(kind).await;
    let request = format!(
        "POST /slow HTTP/1.1\r\nHost: {}\r\nIdempotency-Key: k-gone\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
        app.addr
    );
    let mut stream = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
        .await
        .unwrap();
    eventually("the slow handler started", WAIT, async || {
        count(&app.counters.slow_started) == 1
    })
    .await;
    drop(stream);
    // The server noticed: the request's future outside the layer was dropped.
    eventually("the server dropped the request", WAIT, async || {
        count(&app.counters.cancelled) == 1
    })
    .await;
    assert_eq!(count(&app.counters.slow_finished), 0);
    app.open_gate(1);
    app.in_flight.wait().await;
    assert_eq!(
        count(&app.counters.slow_finished),
        1,
        "the handler ran to completion"
    );
    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/slow", "k-gone"))
        .await
        .unwrap()
        .unwrap();
    assert!(record.is_completed(), "its answer was recorded");
    let retry = app.post("/slow").key("k-gone").json("{}").send().await;
    assert_eq!(retry.status, 201);
    assert!(retry.is_replay());
    assert_eq!(retry.body, "slow 1 done");
    assert_eq!(count(&app.counters.slow_started), 1);
}

async fn heartbeat_renews_lease_while_handler_runs(kind: StoreKind) {
    // A real 300 ms lease, renewed every 100 ms of real time; the store's clock is moved
    // by hand past several leases while the handler is held.
    let lease = Duration::from_millis(300);
    let app = Arc::new(App::start_with(kind, |l| l.lease(lease)).await);
    let first = tokio::spawn({
        let app = app.clone();
        async move { app.post("/slow").key("k-beat").json("{}").send().await }
    });
    eventually("the slow handler started", WAIT, async || {
        count(&app.counters.slow_started) == 1
    })
    .await;
    let scope = scope(Tenant::anonymous(), "/slow", "k-beat");
    for _ in 0..4 {
        app.clock.advance(Duration::from_millis(250));
        let now = idem_core::Clock::now(&app.clock);
        eventually("the lease was renewed", WAIT, async || {
            match app.store.get(&scope).await.unwrap().map(|r| r.state) {
                Some(RecordState::InProgress { lease_until }) => lease_until >= now.plus(lease),
                other => panic!("{other:?}"),
            }
        })
        .await;
    }
    // A full second of store time has passed, over three leases: the record is still
    // held, so a retry waits instead of executing a second time.
    app.post("/slow")
        .key("k-beat")
        .json("{}")
        .send()
        .await
        .assert_problem(409, "request-in-progress");
    app.open_gate(1);
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(count(&app.counters.slow_started), 1);
}

async fn stale_attempt_cannot_overwrite_takeover(kind: StoreKind) {
    // The store's clock jumps past the lease before the first heartbeat (as when a worker
    // stalls): a retry takes over, and the stalled attempt's late answer must not
    // replace the new attempt's record.
    let lease = Duration::from_secs(60);
    let observer = Arc::new(CountingObserver::default());
    let app = Arc::new(App::start_with(kind, |l| l.lease(lease).observer(observer.clone())).await);
    let stalled = tokio::spawn({
        let app = app.clone();
        async move { app.post("/slow").key("k-stale").json("{}").send().await }
    });
    eventually("the slow handler started", WAIT, async || {
        count(&app.counters.slow_started) == 1
    })
    .await;
    app.clock.advance(lease + Duration::from_millis(1));
    let taker = tokio::spawn({
        let app = app.clone();
        async move { app.post("/slow").key("k-stale").json("{}").send().await }
    });
    eventually("the takeover started", WAIT, async || {
        count(&app.counters.slow_started) == 2
    })
    .await;
    // The gate is first come, first served: the stalled attempt finishes first and its
    // completion is fenced, so its client gets what a retry would, 409 while the
    // takeover runs (never its own answer, which the record will contradict); then the
    // takeover completes.
    app.open_gate(1);
    let stalled = stalled.await.unwrap();
    stalled.assert_problem(409, "request-in-progress");
    assert_eq!(count(&app.counters.slow_finished), 1);
    app.open_gate(1);
    let taker = taker.await.unwrap();
    assert_eq!(taker.status, 201);
    app.in_flight.wait().await;
    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/slow", "k-stale"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempt, 2);
    let RecordState::Completed { response, .. } = record.state else {
        panic!("not completed")
    };
    assert_eq!(taker.body, "slow 2 done");
    assert_eq!(
        response.body, taker.body,
        "the stale answer must not be recorded"
    );
    let retry = app.post("/slow").key("k-stale").json("{}").send().await;
    assert!(retry.is_replay());
    assert_eq!(retry.body, taker.body);
    // The observer heard of the one fenced write, and of no other store error.
    assert_eq!(
        *observer.store_errors.lock().unwrap(),
        [("complete", "fenced")]
    );
}

/// A memory store with failures on demand: the first n `complete`s or `release`s
/// fail, as a store that went down while the handler ran, or whose connection blipped.
struct Flaky {
    /// How many more `complete`s fail.
    complete_failures: AtomicUsize,
    /// How many more `release`s fail.
    release_failures: AtomicUsize,
}

impl Flaky {
    fn complete_fails(inner: MemoryStore) -> HookedStore<MemoryStore, Flaky> {
        Flaky::first_completes_fail(inner, usize::MAX)
    }

    fn first_completes_fail(inner: MemoryStore, n: usize) -> HookedStore<MemoryStore, Flaky> {
        let hooks = Flaky {
            complete_failures: AtomicUsize::new(n),
            release_failures: AtomicUsize::new(0),
        };
        HookedStore::new(inner, hooks)
    }

    fn first_releases_fail(inner: MemoryStore, n: usize) -> HookedStore<MemoryStore, Flaky> {
        let hooks = Flaky {
            complete_failures: AtomicUsize::new(0),
            release_failures: AtomicUsize::new(n),
        };
        HookedStore::new(inner, hooks)
    }
}

/// Whether one more call is to fail, counting it.
fn fails(remaining: &AtomicUsize) -> bool {
    remaining
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl StoreHooks<MemoryStore> for Flaky {
    async fn complete(&self, inner: &MemoryStore, l: &Lease, r: &StoredResponse) -> Result<()> {
        if fails(&self.complete_failures) {
            return down();
        }
        inner.complete(l, r).await
    }
    async fn release(&self, inner: &MemoryStore, l: &Lease) -> Result<()> {
        if fails(&self.release_failures) {
            return down();
        }
        inner.release(l).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecorded_answer_leaves_key_in_progress_until_lease_lapses() {
    let clock = ManualClock::starting_now();
    let store = Flaky::complete_fails(MemoryStore::with_clock(Arc::new(clock.clone())));
    let lease = Duration::from_secs(60);
    let app = App::start_on(clock, Arc::new(store), |l| l.lease(lease)).await;
    // The client still gets the handler's real answer.
    let first = app.post("/orders").key("k-unrec").json(ORDER).send().await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["order"], 1);
    // Nothing was recorded, so the outcome is unknown to the store: retries wait...
    app.post("/orders")
        .key("k-unrec")
        .json(ORDER)
        .send()
        .await
        .assert_problem(409, "request-in-progress");
    // ...until the lease lapses and a retry takes over as a recovered attempt.
    app.clock.advance(lease + Duration::from_millis(1));
    let taken = app.post("/orders").key("k-unrec").json(ORDER).send().await;
    assert_eq!(taken.json()["attempt"], 2);
    assert_eq!(taken.json()["recovered"], true);
    assert_eq!(count(&app.counters.orders), 2);
}

/// A store that is down for a moment when the handler finishes: the client gets its
/// answer at once, and the answer is recorded once the store is back, so the retry
/// replays it instead of waiting out the lease and running the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_store_could_not_take_is_recorded_once_it_is_back() {
    let clock = ManualClock::starting_now();
    // The three tries before answering and the first two after fail.
    let store = Flaky::first_completes_fail(MemoryStore::with_clock(Arc::new(clock.clone())), 5);
    let observer = Arc::new(CountingObserver::default());
    let app = App::start_on(clock, Arc::new(store), |l| {
        l.lease(Duration::from_secs(60)).observer(observer.clone())
    })
    .await;
    let first = app.post("/orders").key("k-later").json(ORDER).send().await;
    assert_eq!(first.status, 201);
    assert!(!first.is_replay());
    // Counted in flight until recorded, so a graceful shutdown waits for it.
    assert_eq!(app.in_flight.count(), 1);
    // Until then, retries wait (the record is in progress, its lease alive)...
    app.post("/orders")
        .key("k-later")
        .json(ORDER)
        .send()
        .await
        .assert_problem(409, "request-in-progress");
    // ...and then replay: the clock never moved, so this is no takeover.
    app.in_flight.wait().await;
    let retry = app.post("/orders").key("k-later").json(ORDER).send().await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(count(&app.counters.orders), 1);
    assert_eq!(
        *observer.deferred.lock().unwrap(),
        [("complete", None), ("complete", Some(true))]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_is_tried_again_so_the_retry_executes() {
    // Made on the second try, before the answer.
    release_that_fails_at_first(1, "k-rel-retry").await;
}

/// A release the store could not take at first is made once it is back: the retry
/// executes then, instead of getting 409 until the lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_store_could_not_take_is_made_once_it_is_back() {
    // The three tries before answering and the first two after fail.
    release_that_fails_at_first(5, "k-rel-later").await;
}

/// A refusal (429, released) whose first `failures` releases fail: once the release is
/// made, the retry executes again rather than replaying or waiting out the lease.
async fn release_that_fails_at_first(failures: usize, key: &str) {
    let clock = ManualClock::starting_now();
    let store =
        Flaky::first_releases_fail(MemoryStore::with_clock(Arc::new(clock.clone())), failures);
    let app = App::start_on(clock, Arc::new(store), |l| l.lease(Duration::from_secs(60))).await;
    let body = status_body(429, None);
    let send = || app.post("/status").key(key).json(&body).send();
    assert_eq!(send().await.status, 429);
    if failures >= 3 {
        // Still being released in the background: the key is in progress meanwhile.
        assert_eq!(app.in_flight.count(), 1);
        send().await.assert_problem(409, "request-in-progress");
        app.in_flight.wait().await;
    }
    let retry = send().await;
    assert_eq!(retry.status, 429, "{retry:?}");
    assert!(!retry.is_replay());
    assert_eq!(count(&app.counters.statuses), 2);
}

/// An answer recorded as a reference (SPEC S6) reaches the first caller whole, however
/// large, and keeps only its head and the reference in the store; a retry gets the
/// resource as rendered now, under the recorded status and headers, and the handler
/// does not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_recorded_as_a_reference_is_rendered_again_at_replay() {
    let app = App::start_around_router(StoreKind::Sqlite, |l| {
        l.response_limit(1024).render_references(true)
    })
    .await;
    let body = r#"{"size":5000}"#;
    let first = app.post("/reports").key("k-report").json(body).send().await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), 5000, "over the response limit, and whole");
    assert_eq!(first.header("content-location"), None);

    let record = app
        .store
        .get(&scope(Tenant::anonymous(), "/reports", "k-report"))
        .await
        .unwrap()
        .unwrap();
    let RecordState::Completed { response, .. } = record.state else {
        panic!("not completed: {record:?}");
    };
    assert_eq!(response.reference(), Some("/reports?id=1"));
    assert!(response.body.is_empty());

    for read in 1..=2 {
        let retry = app.post("/reports").key("k-report").json(body).send().await;
        assert!(retry.is_replay(), "{retry:?}");
        assert_eq!(retry.status, 201);
        assert_eq!(retry.header("location"), Some("/reports/1"));
        assert_eq!(retry.header("content-location"), Some("/reports?id=1"));
        // The rendering's representation, not the first answer's.
        assert_eq!(retry.header("content-type"), Some("application/json"));
        assert_eq!(retry.header("etag"), Some("\"v2\""));
        assert_eq!(retry.body, format!(r#"{{"report":1,"read":{read}}}"#));
    }
    assert_eq!(count(&app.counters.reports), 1);
    assert_eq!(count(&app.counters.report_reads), 2);
}

/// Under `Router::layer`, where the wrapped service is the `POST` handler itself, a
/// renderer of the application's own renders references: the handler runs once, and
/// the route's `GET` is not involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renderer_renders_references_under_router_layer() {
    let app = App::start_with(StoreKind::Memory, |l| {
        l.render_references_with(|get: http::Request<()>| async move {
            assert!(get.headers().get("idempotency-key").is_none());
            assert!(get.headers().get("content-type").is_none());
            let path = get.uri().path_and_query().map(|pq| pq.to_string());
            http::Response::builder()
                .header("content-type", "text/plain")
                .body(Bytes::from(format!(
                    "rendered {}",
                    path.unwrap_or_default()
                )))
        })
    })
    .await;
    let body = r#"{"size":3000}"#;
    let first = app
        .post("/reports")
        .key("k-rendered")
        .json(body)
        .send()
        .await;
    assert_eq!(first.body.len(), 3000);
    let retry = app
        .post("/reports")
        .key("k-rendered")
        .json(body)
        .send()
        .await;
    assert!(retry.is_replay(), "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(retry.body, "rendered /reports?id=1");
    assert_eq!(retry.header("content-type"), Some("text/plain"));
    assert_eq!(retry.header("content-location"), Some("/reports?id=1"));
    assert_eq!(count(&app.counters.reports), 1);
    assert_eq!(count(&app.counters.report_reads), 0);
}

/// A reference that cannot be rendered now is a 503 that says the operation ran, never
/// a new execution; the record stays as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_that_cannot_be_rendered_is_503_and_never_runs_again() {
    // Nothing to render, and (by default) no rendering at all.
    let (observed, by_default) = (
        Arc::new(CountingObserver::default()),
        Arc::new(CountingObserver::default()),
    );
    let gone = App::start_around_router(StoreKind::Memory, |l| {
        l.render_references(true).observer(observed.clone())
    });
    let off = App::start_with(StoreKind::Memory, |l| l.observer(by_default.clone()));
    for (app, observer) in [(gone.await, observed), (off.await, by_default)] {
        reference_that_cannot_be_rendered(&app).await;
        assert_eq!(
            *observer.outcomes.lock().unwrap(),
            [Outcome::ReplayUnavailable]
        );
    }
}

async fn reference_that_cannot_be_rendered(app: &App) {
    let scope = scope(Tenant::anonymous(), "/reports", "k-gone");
    // Recorded as a reference to a report that does not exist.
    let request = ReserveRequest::new(scope, json_fingerprint("/reports", r#"{"size":1}"#));
    let lease = app
        .store
        .reserve(&request)
        .await
        .unwrap()
        .lease()
        .cloned()
        .unwrap();
    let stored = StoredResponse::new(201, "").with_reference("/reports?id=404");
    app.store.complete(&lease, &stored).await.unwrap();

    let retry = app
        .post("/reports")
        .key("k-gone")
        .json(r#"{"size":1}"#)
        .send()
        .await;
    retry.assert_problem(503, "replay-unavailable");
    assert!(retry.header("retry-after").is_some());
    assert!(
        retry.json()["detail"]
            .as_str()
            .unwrap()
            .contains("never a new one")
    );
    assert_eq!(count(&app.counters.reports), 0);
}

/// Without the extension, or where the layer does not render references (the
/// default: under `Router::layer` a `GET` would reach the `POST` handler), the answer
/// is recorded whole, as ever, and a replay runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_recorded_whole_unless_references_are_rendered() {
    let unreferenced = App::start_around_router(StoreKind::Memory, |l| l.render_references(true));
    let by_default = App::start(StoreKind::Memory);
    let cases = [
        (unreferenced.await, r#"{"size":10,"by_value":true}"#),
        (by_default.await, r#"{"size":10}"#),
    ];
    for (app, body) in cases {
        let first = app.post("/reports").key("k-value").json(body).send().await;
        let retry = app.post("/reports").key("k-value").json(body).send().await;
        assert!(retry.is_replay());
        assert_eq!(retry.body, first.body);
        assert_eq!(retry.body.len(), 10);
        assert_eq!(retry.header("content-location"), None);
        assert_eq!(count(&app.counters.reports), 1);
        assert_eq!(count(&app.counters.report_reads), 0);
    }
}

#[derive(Default)]
struct CountingObserver {
    outcomes: std::sync::Mutex<Vec<Outcome>>,
    store_calls: std::sync::Mutex<Vec<(&'static str, bool)>>,
    store_errors: std::sync::Mutex<Vec<(&'static str, &'static str)>>,
    /// Deferred key writes: `None` when one is deferred, `Some(settled)` when it ends.
    deferred: std::sync::Mutex<Vec<(&'static str, Option<bool>)>>,
    /// Ambiguous outcomes: the reason and the scope's digest.
    ambiguous: std::sync::Mutex<Vec<(idem_core::Ambiguity, String)>>,
}

impl Observer for CountingObserver {
    fn outcome(&self, outcome: Outcome) {
        self.outcomes.lock().unwrap().push(outcome);
    }
    fn store_call(&self, op: &'static str, _elapsed: Duration, ok: bool) {
        self.store_calls.lock().unwrap().push((op, ok));
    }
    fn store_error(&self, op: &'static str, error: &StoreError) {
        self.store_errors.lock().unwrap().push((op, error.label()));
    }
    fn write_deferred(&self, op: &'static str) {
        self.deferred.lock().unwrap().push((op, None));
    }
    fn deferred_write_ended(&self, op: &'static str, settled: bool) {
        self.deferred.lock().unwrap().push((op, Some(settled)));
    }
    fn ambiguous_outcome(&self, reason: idem_core::Ambiguity, scope_digest: &str) {
        self.ambiguous
            .lock()
            .unwrap()
            .push((reason, scope_digest.to_owned()));
    }
}

/// A handler that fails after it started and an attempt that takes over a lapsed
/// lease are each reported once, by the scope's digest; the failure's recorded answer
/// keeps the reason, which its replay never shows.
async fn ambiguous_outcomes_are_reported_and_recorded(kind: StoreKind) {
    use idem_core::Ambiguity;
    let observer = Arc::new(CountingObserver::default());
    let app = App::start_with(kind, |l| l.observer(observer.clone())).await;
    app.post("/panic")
        .key("k-amb-panic")
        .json("{}")
        .send()
        .await;
    let panicked = scope(Tenant::anonymous(), "/panic", "k-amb-panic");
    let record = app.store.get(&panicked).await.unwrap().expect("recorded");
    let RecordState::Completed { response, .. } = &record.state else {
        panic!("{record:?}")
    };
    assert_eq!(response.ambiguity(), Some(Ambiguity::HandlerFailed));
    let replay = app
        .post("/panic")
        .key("k-amb-panic")
        .json("{}")
        .send()
        .await;
    assert!(replay.is_replay());
    assert_eq!(replay.header(":ambiguous"), None);

    let lease_for = Duration::from_secs(60);
    app.store
        .reserve(&support::reserve_request(
            "/orders",
            "k-amb-dead",
            ORDER,
            lease_for,
        ))
        .await
        .unwrap();
    app.clock.advance(lease_for + Duration::from_millis(1));
    let taken = app
        .post("/orders")
        .key("k-amb-dead")
        .json(ORDER)
        .send()
        .await;
    assert_eq!(taken.status, 201);
    // An ordinary first execution is not ambiguous.
    app.post("/orders")
        .key("k-amb-plain")
        .json(ORDER)
        .send()
        .await;
    assert_eq!(
        *observer.ambiguous.lock().unwrap(),
        [
            (Ambiguity::HandlerFailed, panicked.digest()),
            (
                Ambiguity::Takeover,
                scope(Tenant::anonymous(), "/orders", "k-amb-dead").digest()
            ),
        ]
    );
}

async fn observer_sees_each_outcome(kind: StoreKind) {
    let observer = Arc::new(CountingObserver::default());
    let app = App::start_with(kind, |l| l.observer(observer.clone())).await;
    app.post("/orders").key("k-obs").json(ORDER).send().await;
    app.post("/orders").key("k-obs").json(ORDER).send().await;
    app.post("/orders").key("k-obs").json("{}").send().await;
    app.post("/orders").json(ORDER).send().await;
    app.post("/orders").key("").json(ORDER).send().await;
    app.post("/status")
        .key("k-obs-rel")
        .json(&status_body(429, None))
        .send()
        .await;
    assert_eq!(
        *observer.outcomes.lock().unwrap(),
        [
            Outcome::Executed,
            Outcome::Replayed,
            Outcome::Mismatch,
            Outcome::PassedThrough,
            Outcome::Rejected,
            Outcome::Released,
        ]
    );
    let calls = observer.store_calls.lock().unwrap();
    let ops: Vec<&str> = calls.iter().map(|(op, _)| *op).collect();
    assert_eq!(
        ops,
        [
            "reserve", "complete", "reserve", "reserve", "reserve", "release"
        ]
    );
    assert!(calls.iter().all(|(_, ok)| *ok));
    assert!(observer.store_errors.lock().unwrap().is_empty());
}

// ---------------------------------------------------------------- S10: fail closed

/// A store whose every call fails as an unreachable server's would.
struct DownStore;

fn down<T>() -> Result<T> {
    Err(StoreError::unavailable("connection refused"))
}

#[async_trait]
impl Store for DownStore {
    async fn reserve(&self, _: &ReserveRequest) -> Result<Reservation> {
        down()
    }
    async fn complete(&self, _: &Lease, _: &StoredResponse) -> Result<()> {
        down()
    }
    async fn renew(&self, _: &Lease, _: Duration) -> Result<()> {
        down()
    }
    async fn release(&self, _: &Lease) -> Result<()> {
        down()
    }
    async fn mark_ambiguous(&self, _: &Lease, _: idem_core::Ambiguity) -> Result<()> {
        down()
    }
    async fn get(&self, _: &Scope) -> Result<Option<Record>> {
        down()
    }
    async fn remove(&self, _: &Scope) -> Result<bool> {
        down()
    }
    async fn purge_expired(&self, _: usize) -> Result<usize> {
        down()
    }
    async fn ping(&self) -> Result<()> {
        down()
    }
    async fn init_secret(&self, _: &str, _: &[u8]) -> Result<Vec<u8>> {
        down()
    }
    async fn list(&self, _: &idem_core::ListQuery) -> Result<idem_core::ListPage> {
        down()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_unavailable_is_503_and_handler_not_called() {
    let app = App::start_on(ManualClock::starting_now(), Arc::new(DownStore), |l| l).await;
    let reply = app.post("/orders").key("k-down").json(ORDER).send().await;
    reply.assert_problem(503, "store-unavailable");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(
        count(&app.counters.orders),
        0,
        "fail closed: the handler is not called"
    );
    // Unkeyed traffic does not touch the store and still flows.
    assert_eq!(app.post("/orders").json(ORDER).send().await.status, 201);
    assert_eq!(count(&app.counters.orders), 1);
}

// ------------------------------------------------- SPEC S14: a method in any case

/// The layer around a service that answers with the method it was called with.
type MethodEcho = tower::util::BoxCloneService<
    http::Request<http_body_util::Full<Bytes>>,
    http::Response<idem_tower::IdempotencyBody<http_body_util::Full<Bytes>>>,
    std::convert::Infallible,
>;

/// A counting service answering with the method it was called with, behind a layer
/// that `configure` adjusts: the method as the handler sees it, and how often it ran.
fn method_echo(
    configure: impl FnOnce(support::Layer) -> support::Layer,
) -> (MethodEcho, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = tower::service_fn(move |req: http::Request<idem_tower::IdempotencyBody<_>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let body = format!("{} #{n}", req.method());
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .body(http_body_util::Full::new(Bytes::from(body)))
                    .unwrap(),
            )
        }
    });
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let layer = configure(idem_tower::IdempotencyLayer::new(store));
    (
        tower::util::BoxCloneService::new(tower::Layer::layer(&layer, handler)),
        runs,
    )
}

async fn call_method(svc: &MethodEcho, method: &str, key: Option<&str>) -> (u16, bool, Bytes) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut req = http::Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri("/v1/charges")
        .header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let req = req
        .body(http_body_util::Full::new(Bytes::from_static(
            ORDER.as_bytes(),
        )))
        .unwrap();
    let res = svc.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, replayed, body)
}

/// `post`, `PoSt` and `POST` are one method to most frameworks: under one key the
/// handler runs once, for the first spelling, which it sees as sent; the other two
/// replay its answer rather than passing through unkeyed or being a 422.
#[tokio::test]
async fn method_in_any_case_is_keyed_as_that_method() {
    let (svc, runs) = method_echo(|l| l);
    let (status, replayed, body) = call_method(&svc, "post", Some("k-case")).await;
    assert_eq!((status, replayed), (201, false));
    assert_eq!(body, "post #1", "the handler gets the method as sent");
    for spelling in ["PoSt", "POST", "post"] {
        let (status, replayed, again) = call_method(&svc, spelling, Some("k-case")).await;
        assert_eq!((status, replayed), (201, true), "{spelling}");
        assert_eq!(again, body, "{spelling}");
    }
    let (status, replayed, _) = call_method(&svc, "patch", Some("k-patch")).await;
    assert_eq!((status, replayed), (201, false));
    let (status, replayed, _) = call_method(&svc, "PATCH", Some("k-patch")).await;
    assert_eq!((status, replayed), (201, true), "patch is keyed as PATCH");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A required key cannot be sidestepped by spelling the method in lower case.
#[tokio::test]
async fn required_key_holds_for_a_method_in_any_case() {
    let (svc, runs) = method_echo(|l| l.require_key(true));
    for spelling in ["post", "PoSt", "patch"] {
        let (status, _, body) = call_method(&svc, spelling, None).await;
        assert_eq!(status, 400, "{spelling}");
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["type"], "https://idem.dev/problems/missing-key");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Unkeyed methods still pass through, in any case.
    let (status, _, _) = call_method(&svc, "get", None).await;
    assert_eq!(status, 201);
}

/// A keyed method configured in lower case keys every spelling of it too.
#[tokio::test]
async fn keyed_method_configured_in_any_case_keys_every_spelling() {
    let (svc, runs) = method_echo(|l| l.keyed_methods([Method::from_bytes(b"charge").unwrap()]));
    let (_, replayed, first) = call_method(&svc, "CHARGE", Some("k-ext")).await;
    assert!(!replayed);
    let (_, replayed, again) = call_method(&svc, "charge", Some("k-ext")).await;
    assert!(replayed);
    assert_eq!(again, first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
