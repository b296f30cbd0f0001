//! MCP tool calls over JSON-RPC (issue 64, SPEC S24): a route of the `mcp` profile keys
//! `tools/call` by `params._meta["idempotency-key"]`, replays it with the retry's own
//! request id (JSON and event-stream answers alike), answers with JSON-RPC errors, lets
//! every other message pass, and refuses what it cannot read rather than forward a
//! keyed call unkeyed. The upstream is a small JSON-RPC server that counts its runs.
//! `mcp_sdk.rs` drives the official MCP Python SDK through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use crate::common::{Answer, Gateway, Http, new_key};

/// A JSON-RPC server on `/mcp` (JSON answers) and `/mcp/sse` (each answer one SSE
/// event), counting what it ran by method (`tools/call` by its tool's name).
#[derive(Default)]
struct Runs {
    by: Mutex<HashMap<String, u64>>,
    bodies: Mutex<Vec<String>>,
}

impl Runs {
    fn of(&self, what: &str) -> u64 {
        *self.by.lock().unwrap().get(what).unwrap_or(&0)
    }

    fn total(&self) -> usize {
        self.bodies.lock().unwrap().len()
    }
}

async fn serve(State(runs): State<Arc<Runs>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let text = String::from_utf8_lossy(&body).into_owned();
    runs.bodies.lock().unwrap().push(text);
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let method = message["method"].as_str().unwrap_or_default().to_owned();
    let what = match method.as_str() {
        "tools/call" => message["params"]["name"].as_str().unwrap_or("?").to_owned(),
        "" => parts.method.to_string(),
        other => other.to_owned(),
    };
    let n = {
        let mut by = runs.by.lock().unwrap();
        let n = by.entry(what).or_default();
        *n += 1;
        *n
    };
    if parts.method != "POST" {
        return Response::builder().status(405).body(Body::empty()).unwrap();
    }
    if message.get("id").is_none() {
        return Response::builder().status(202).body(Body::empty()).unwrap();
    }
    if let Some(ms) = message["params"]["arguments"]["delay_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let answer = json!({
        "jsonrpc": "2.0",
        "id": message["id"],
        "result": {
            "content": [{"type": "text", "text": format!("run {n} of {method}")}],
            "isError": false,
        },
    })
    .to_string();
    let (content_type, body) = if parts.uri.path().ends_with("/sse") {
        let progress = json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "info", "data": {"id": message["id"]}}});
        let events =
            format!("event: message\ndata: {progress}\n\nevent: message\ndata: {answer}\n\n");
        ("text/event-stream", events)
    } else {
        ("application/json", answer)
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", content_type)
        .header("mcp-session-id", "upstream-session")
        .body(Body::from(body))
        .unwrap()
}

struct Rig {
    runs: Arc<Runs>,
    gw: Gateway,
    http: Http,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const ROUTES: &str = r#"
[[route]]
path = "/mcp"
profile = "mcp"

[[route]]
path = "/mcp/sse"
profile = "mcp"

[[route]]
path = "/strict/mcp"
profile = "mcp"
require_key = true
key_pointer = "/params/arguments/idempotency_key"
ignore = ["/sent_at"]
rpc_methods = ["tools/call", "payments/refund"]
"#;

async fn rig() -> Rig {
    rig_with(&[]).await
}

/// A rig whose gateway gets `extra` flags too.
async fn rig_with(extra: &[&str]) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("idem.toml"), ROUTES).unwrap();
    let runs = Arc::new(Runs::default());
    let app = axum::Router::new().fallback(serve).with_state(runs.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut args = vec!["--store", "memory://", "--config", "idem.toml"];
    args.extend_from_slice(extra);
    let gw = Gateway::start(&url, dir.path(), &args).await;
    Rig {
        runs,
        gw,
        http: Http::new(),
        task,
        _dir: dir,
    }
}

impl Rig {
    async fn send(&self, path: &str, headers: &[(&str, &str)], body: String) -> Answer {
        let mut all = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        all.extend_from_slice(headers);
        self.http.send("POST", &self.gw.url(path), &all, body).await
    }
}

/// A `tools/call` of `tool` with request id `id` (JSON text), its `_meta` key `key`.
fn call(id: &str, tool: &str, key: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments},"_meta":{{"idempotency-key":"{key}","progressToken":{id}}}}}}}"#
    )
}

/// `body` with its first `"id":` value replaced by `id`, as the test expects a replay.
fn with_id(body: &[u8], from: &str, to: &str) -> String {
    String::from_utf8(body.to_vec()).unwrap().replacen(
        &format!(r#""id":{from}"#),
        &format!(r#""id":{to}"#),
        1,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_retried_with_a_new_id_runs_once_and_the_replay_carries_the_retrys_id() {
    let r = rig().await;
    let key = new_key();
    let first = r
        .send("/mcp", &[], call("1", "pay", &key, r#"{"amount":5}"#))
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert!(!first.replayed());
    assert_eq!(first.json()["id"], 1);
    // Each retry has an id of its own, a progress token of its own, and the arguments
    // spelt otherwise; and may come in another session after a reconnect.
    for (id, session) in [("2", "s-1"), (r#""retry-3""#, "s-2"), ("4.0", "s-3")] {
        let body = call(id, "pay", &key, r#"{ "amount" : 5 }"#);
        let retry = r.send("/mcp", &[("mcp-session-id", session)], body).await;
        assert_eq!(retry.status, 200, "{retry:?}");
        assert!(retry.replayed(), "{retry:?}");
        assert_eq!(
            String::from_utf8(retry.body.to_vec()).unwrap(),
            with_id(&first.body, "1", id),
            "the recorded answer, byte for byte, but for the retry's own id"
        );
        assert_eq!(
            retry.header("content-length"),
            Some(&*retry.body.len().to_string())
        );
    }
    assert_eq!(r.runs.of("pay"), 1, "the tool ran once for four calls");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_stream_answer_is_replayed_with_the_retrys_id_in_its_data_line() {
    let r = rig().await;
    let key = new_key();
    let first = r.send("/mcp/sse", &[], call("7", "ship", &key, "{}")).await;
    assert_eq!(first.header("content-type"), Some("text/event-stream"));
    let first_text = String::from_utf8(first.body.to_vec()).unwrap();
    assert!(first_text.contains(r#""id":7,"jsonrpc""#), "{first_text}");
    let retry = r
        .send("/mcp/sse", &[], call(r#""eight""#, "ship", &key, "{}"))
        .await;
    assert!(retry.replayed(), "{retry:?}");
    let text = String::from_utf8(retry.body.to_vec()).unwrap();
    // The notification's own `id` member (inside its params) is no response id.
    assert_eq!(
        text,
        first_text.replacen(r#""id":7,"jsonrpc""#, r#""id":"eight","jsonrpc""#, 1),
    );
    assert_eq!(r.runs.of("ship"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn other_messages_pass_untouched_key_or_not() {
    let r = rig().await;
    let key = new_key();
    let header = [("idempotency-key", key.as_str())];
    let messages = [
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"idempotency-key":"k"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":5,"result":{}}"#,
    ];
    for _ in 0..2 {
        for m in messages {
            let a = r.send("/mcp", &header, m.to_owned()).await;
            assert!(!a.replayed(), "{a:?}");
            assert!(a.status == 200 || a.status == 202, "{a:?}");
        }
        // A key header that is no key at all is none of their business either.
        let a = r
            .send(
                "/mcp",
                &[("idempotency-key", &"k".repeat(300))],
                messages[1].to_owned(),
            )
            .await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    assert_eq!(r.runs.of("initialize"), 2);
    assert_eq!(r.runs.of("tools/list"), 4);
    assert_eq!(r.runs.of("notifications/initialized"), 2);
    for method in ["GET", "DELETE"] {
        let a = r.http.send(method, &r.gw.url("/mcp"), &header, "").await;
        assert_eq!(a.status, 405, "{a:?}");
    }
    assert_eq!((r.runs.of("GET"), r.runs.of("DELETE")), (1, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reused_key_with_other_arguments_is_a_json_rpc_error_with_the_requests_id() {
    let r = rig().await;
    let key = new_key();
    let first = r
        .send("/mcp", &[], call("1", "pay", &key, r#"{"amount":5}"#))
        .await;
    assert!(!first.replayed());
    for (body, what) in [
        (call("2", "pay", &key, r#"{"amount":6}"#), "other arguments"),
        (call("2", "refund", &key, r#"{"amount":5}"#), "another tool"),
    ] {
        let a = r.send("/mcp", &[], body).await;
        assert_eq!(a.status, 200, "{what}: {a:?}");
        assert_eq!(a.header("content-type"), Some("application/json"));
        let error = a.json();
        assert_eq!(error["jsonrpc"], "2.0");
        assert_eq!(error["id"], 2, "{what}: the request's own id");
        assert_eq!(
            error["error"]["code"], -32000,
            "UCP's binding: its 409 is -32000"
        );
        assert_eq!(error["error"]["data"]["code"], "idempotency_conflict");
        assert_eq!(
            error["error"]["data"]["type"],
            "https://idem.dev/problems/key-reused"
        );
        assert_eq!(error["error"]["data"]["status"], 422);
        // The key's first call completed: a new key would run the tool again.
        assert_eq!(error["error"]["data"]["operation_state"], "completed");
        assert_eq!(a.header("idempotency-operation-state"), Some("completed"));
    }
    assert_eq!((r.runs.of("pay"), r.runs.of("refund")), (1, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_that_disagree_are_missing_or_malformed_are_json_rpc_errors_and_reach_nobody() {
    let r = rig().await;
    let (a, b) = (new_key(), new_key());
    let disagree = r
        .send(
            "/mcp",
            &[("idempotency-key", &a)],
            call("3", "pay", &b, "{}"),
        )
        .await;
    assert_eq!(disagree.status, 200, "{disagree:?}");
    let e = disagree.json();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!(3), json!(-32602))
    );
    assert_eq!(e["error"]["data"]["code"], "idempotency_key_invalid");
    assert!(
        e["error"]["data"]["detail"]
            .as_str()
            .unwrap()
            .contains("different keys")
    );

    // The strict route requires a key, and takes it from the arguments too.
    let bare = r#"{"jsonrpc":"2.0","id":"m","method":"tools/call","params":{"name":"pay","arguments":{}}}"#;
    let missing = r.send("/strict/mcp", &[], bare.to_owned()).await;
    let e = missing.json();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!("m"), json!(-32602))
    );
    assert_eq!(e["error"]["data"]["code"], "idempotency_key_required");
    let malformed = call("4", "pay", &"k".repeat(300), "{}");
    let e = r.send("/mcp", &[], malformed).await.json();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!(4), json!(-32602))
    );
    let in_arguments = |id: u32, arg_key: &str, sent_at: u32| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"payments/refund","params":{{"name":"r","arguments":{{"idempotency_key":"{arg_key}","sent_at":{sent_at}}}}}}}"#
        )
    };
    let first = r.send("/strict/mcp", &[], in_arguments(5, &a, 1)).await;
    assert!(!first.replayed(), "{first:?}");
    // The key's own field and the ignored one never make two attempts differ.
    let retry = r.send("/strict/mcp", &[], in_arguments(6, &a, 2)).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.json()["id"], 6);
    assert_eq!(r.runs.of("pay"), 0, "no refused call reached the upstream");
    assert_eq!(r.runs.of("payments/refund"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_or_a_body_that_does_not_parse_is_refused_never_forwarded_unkeyed() {
    let r = rig().await;
    let key = new_key();
    let cases = [
        (format!("[{}]", call("1", "pay", &key, "{}")), -32600),
        (format!("[{}", call("1", "pay", &key, "{}")), -32700),
        (r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{}}"#.to_owned(), -32600),
        (r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"pay"}}"#.to_owned(), -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","name":"x"}}"#.to_owned(), -32600),
        (r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","note":"\ud800"}}"#.to_owned(), -32700),
        (String::new(), -32600),
    ];
    for (body, code) in cases {
        let a = r.send("/mcp", &[], body.clone()).await;
        assert_eq!(a.status, 400, "{body}: {a:?}");
        assert_eq!(a.json()["error"]["code"], code, "{body}");
        assert!(!a.replayed());
    }
    // A batch of messages that are not keyed passes.
    let list = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#;
    let passed = r.send("/mcp", &[], list.to_owned()).await;
    assert_eq!(passed.status, 202, "the upstream's own answer: {passed:?}");
    assert_eq!(
        r.runs.total(),
        1,
        "only the unkeyed batch reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_in_progress_is_a_json_rpc_error_with_a_retry_hint_or_waits_for_its_replay() {
    let r = rig().await;
    let key = new_key();
    let slow = r#"{"delay_ms":1500}"#;
    let first = {
        let (http, url, body) = (
            r.http.clone(),
            r.gw.url("/mcp"),
            call("1", "slow", &key, slow),
        );
        tokio::spawn(async move {
            let headers = [("content-type", "application/json")];
            http.send("POST", &url, &headers, body).await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let busy = r.send("/mcp", &[], call("2", "slow", &key, slow)).await;
    assert_eq!(busy.status, 200, "{busy:?}");
    assert!(busy.header("retry-after").is_some(), "{busy:?}");
    let e = busy.json();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!(2), json!(-32000))
    );
    assert_eq!(e["error"]["data"]["code"], "idempotency_in_flight");
    assert!(e["error"]["data"]["retry_after"].as_u64().unwrap() >= 1);
    assert_eq!(e["error"]["data"]["operation_state"], "in_progress");
    let waited = r
        .send(
            "/mcp",
            &[("prefer", "wait=5")],
            call("3", "slow", &key, slow),
        )
        .await;
    assert!(waited.replayed(), "{waited:?}");
    assert_eq!(waited.json()["id"], 3);
    let first = first.await.unwrap();
    assert_eq!(first.json()["id"], 1);
    assert_eq!(r.runs.of("slow"), 1);
}

/// `idem check-config` (and so `idem config print`) shows an `mcp` route's keyed methods,
/// its ignored pointers as written, and the JSON-RPC codes its answers carry; the global
/// profile's too. `rpc_methods` on a route of another profile is refused.
#[test]
fn check_config_prints_the_keyed_methods_and_the_json_rpc_error_codes() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(&config, ROUTES).unwrap();
    let out = crate::common::check_config(&["--config", config.to_str().unwrap()]);
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("rpc_methods = [\"tools/call\"]\n"),
        "{printed}"
    );
    assert!(
        printed.contains("rpc_methods = [\"tools/call\", \"payments/refund\"]\n"),
        "{printed}"
    );
    assert!(printed.contains("ignore = [\"/sent_at\"]\n"), "{printed}");
    let codes = "# json_rpc_errors: -32700 body not JSON (HTTP 400); -32600";
    assert_eq!(
        printed.matches(codes).count(),
        3,
        "one per mcp route: {printed}"
    );
    assert!(
        printed.contains("-32602 key missing or malformed"),
        "{printed}"
    );
    assert!(
        printed.contains("-32000 key reused with other arguments"),
        "{printed}"
    );

    let global = crate::common::check_config(&["--profile", "mcp"]);
    let printed = String::from_utf8_lossy(&global.stdout);
    assert!(printed.contains("profile = \"mcp\"\n"), "{printed}");
    assert!(printed.contains(codes), "{printed}");

    std::fs::write(&config, "[[route]]\npath = \"/a\"\nrpc_methods = [\"x\"]\n").unwrap();
    let bad = crate::common::check_config(&["--config", config.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("rpc_methods applies to routes of the mcp profile only"),
        "{bad:?}"
    );
}

/// Tombstones and tenant limits hold for tool calls as for any keyed request: a key
/// past its record's life, its tombstone kept, is refused rather than run again; a
/// tenant at its most calls in progress is refused with a retry hint; both as JSON-RPC
/// errors with the call's id.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_key_and_an_overloaded_tenant_are_json_rpc_errors_and_run_nothing() {
    let r = rig_with(&[
        "--ttl",
        "1s",
        "--tombstone-ttl",
        "1h",
        "--tenant-max-in-flight",
        "1",
    ])
    .await;
    let key = new_key();
    let first = r.send("/mcp", &[], call("1", "pay", &key, "{}")).await;
    assert!(!first.replayed(), "{first:?}");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let late = r.send("/mcp", &[], call("2", "pay", &key, "{}")).await;
    assert_eq!(late.status, 200, "{late:?}");
    let e = late.json();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!(2), json!(-32000))
    );
    assert_eq!(e["error"]["data"]["code"], "idempotency_key_expired");
    assert_eq!(e["error"]["data"]["operation_state"], "completed");
    assert_eq!(e["error"]["data"]["completed_status"], 200);
    assert_eq!(r.runs.of("pay"), 1, "not run again");

    let slow = {
        let (http, url) = (r.http.clone(), r.gw.url("/mcp"));
        let body = call("3", "slow", &new_key(), r#"{"delay_ms":1000}"#);
        tokio::spawn(async move {
            let headers = [("content-type", "application/json")];
            http.send("POST", &url, &headers, body).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let busy = r
        .send("/mcp", &[], call("\"b\"", "pay", &new_key(), "{}"))
        .await;
    assert_eq!(busy.status, 200, "{busy:?}");
    assert!(busy.header("retry-after").is_some(), "{busy:?}");
    let e = busy.json();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!("b"), json!(-32000))
    );
    assert_eq!(e["error"]["data"]["code"], "too_many_in_flight");
    assert_eq!(e["error"]["data"]["operation_state"], "not_started");
    assert!(slow.await.unwrap().json()["result"].is_object());
    assert_eq!((r.runs.of("pay"), r.runs.of("slow")), (1, 1));
}

/// `idem check --profile mcp`, given a tool call as its body, finds idempotency holding
/// through the gateway: one execution for parallel duplicates (the JSON-RPC errors of a
/// call in progress counted as such), a reused key with other arguments refused.
#[tokio::test(flavor = "multi_thread")]
async fn idem_check_with_the_mcp_profile_finds_idempotency_holding() {
    let r = rig().await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{"amount":5,"delay_ms":200}}}"#;
    let url = r.gw.url("/mcp");
    let out = tokio::task::spawn_blocking({
        let dir = r._dir.path().to_owned();
        move || {
            let args = ["check", url.as_str(), "--profile", "mcp", "--body", body];
            crate::common::idem_in(&dir, &args)
        }
    })
    .await
    .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("idempotency holds for every probe"),
        "{printed}"
    );
    assert!(
        printed.contains("[pass]            Payload mismatch"),
        "{printed}"
    );
    assert!(
        printed.contains("[pass]            Concurrent duplicates"),
        "{printed}"
    );
}
