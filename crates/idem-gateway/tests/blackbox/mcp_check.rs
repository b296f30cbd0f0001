//! `idem check --profile mcp` (issue 64): every request carries a fresh JSON-RPC id, and
//! two probes of its own judge a tool call's replay (it answers the retry's own id, in
//! a JSON answer and an event stream) and its envelope (a new id and progressToken are
//! the same call; changed arguments are refused). Through the gateway every probe
//! passes; straight against a hand-written JSON-RPC server that keeps its own record
//! and replays it byte for byte, with the FIRST request's id, the replay-id probe fails
//! and says why, while the other probes pass.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::common::{Gateway, binary};

/// What the server does with a keyed call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Runs every call: the gateway in front of it keeps the record.
    Plain,
    /// Keeps a record by `Idempotency-Key` and replays the recorded answer's bytes as
    /// they are, the first request's id with them.
    StaleIds,
}

/// A JSON-RPC server counting its tool runs; on a path ending in `/sse` every answer is
/// one event of an event stream.
struct Server {
    mode: Mode,
    runs: AtomicU64,
    /// Key → (the call's method, tool and arguments, the answer's body). The lock is
    /// held through a call, so a duplicate waits for the first and gets its replay.
    record: Mutex<HashMap<String, (Value, String)>>,
}

fn rpc_error(id: &Value, code: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id,
        "error": {"code": -32600, "message": code, "data": {"code": code}}})
    .to_string()
}

async fn serve(State(s): State<Arc<Server>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let sse = parts.uri.path().ends_with("/sse");
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = message["id"].clone();
    let call = json!([
        message["method"],
        message["params"]["name"],
        message["params"]["arguments"]
    ]);
    let keys: Vec<String> = parts
        .headers
        .get_all("idempotency-key")
        .iter()
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .trim()
                .trim_matches('"')
                .to_owned()
        })
        .collect();
    let mut record = s.record.lock().await;
    let answer = match keys.as_slice() {
        [key]
            if s.mode == Mode::StaleIds && key.len() <= 255 && !key.contains(char::is_control) =>
        {
            match record.get(key) {
                Some((seen, _)) if *seen != call => rpc_error(&id, "idempotency_conflict"),
                Some((_, answer)) => answer.clone(),
                None => {
                    let answer = run(&s, &message, &id).await;
                    record.insert(key.clone(), (call, answer.clone()));
                    answer
                }
            }
        }
        [] => run(&s, &message, &id).await,
        _ if s.mode == Mode::StaleIds => rpc_error(&id, "idempotency_key_invalid"),
        _ => run(&s, &message, &id).await,
    };
    drop(record);
    let (content_type, body) = if sse {
        (
            "text/event-stream",
            format!("event: message\ndata: {answer}\n\n"),
        )
    } else {
        ("application/json", answer)
    };
    Response::builder()
        .status(200)
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap()
}

/// Runs the tool: a new result every time.
async fn run(s: &Server, message: &Value, id: &Value) -> String {
    if let Some(ms) = message["params"]["arguments"]["delay_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let n = s.runs.fetch_add(1, Ordering::SeqCst) + 1;
    json!({"jsonrpc": "2.0", "id": id,
        "result": {"content": [{"type": "text", "text": format!("run {n}")}], "isError": false}})
    .to_string()
}

/// The server on a free port: its base URL, and it.
async fn server(mode: Mode) -> (String, Arc<Server>, tokio::task::JoinHandle<()>) {
    let s = Arc::new(Server {
        mode,
        runs: AtomicU64::new(0),
        record: Mutex::new(HashMap::new()),
    });
    let app = axum::Router::new().fallback(serve).with_state(s.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, s, task)
}

const CALL: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay","arguments":{"amount":5,"delay_ms":100},"_meta":{"progressToken":1}}}"#;

struct Run {
    code: i32,
    stdout: String,
}

/// `idem check URL --profile mcp` with the tool call, bounded, and `extra` arguments.
async fn check(url: &str, extra: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(binary());
    cmd.args(["check", url, "--profile", "mcp", "--body", CALL])
        .args(["--concurrency", "4"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEM_") {
            cmd.env_remove(k);
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("idem check ends within 120 s")
        .unwrap();
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

fn probe<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap_or_else(|| panic!("no probe {id} in {report:#}"))
}

/// The JSON-RPC ids of a probe's requests, in order.
fn sent_ids(probe: &Value) -> Vec<u64> {
    probe["exchanges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let body: Value = serde_json::from_str(e["request"]["body"].as_str().unwrap()).unwrap();
            body["id"].as_u64().unwrap()
        })
        .collect()
}

const ENVELOPE_LINE: &str = "[pass]            Envelope (MCP) — a new id and progressToken are the same call; changed arguments are refused";
const REPLAY_ID_LINE: &str = "[fail]            Replay id (MCP) — a tool call's replay answers with the retry's own JSON-RPC id (JSON or event stream)";

#[tokio::test(flavor = "multi_thread")]
async fn check_mcp_finds_a_replay_that_answers_the_first_requests_id() {
    let (base, _server, _task) = server(Mode::StaleIds).await;
    for (path, framing) in [
        ("/rpc", "a JSON answer"),
        ("/rpc/sse", "an event-stream answer"),
    ] {
        let url = format!("{base}{path}");
        let run = check(&url, &["--format", "json"]).await;
        let report: Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(run.code, 1, "{report:#}");
        let p = probe(&report, "mcp_replay_id");
        assert_eq!(p["status"], "fail", "{p:#}");
        let ids = sent_ids(p);
        assert_eq!(ids.len(), 2, "{p:#}");
        assert!(ids[0] < ids[1], "{ids:?}");
        let expected = format!(
            "the replay answered id {} to a request with id {}: an MCP client waits for its \
             own id and hangs ({framing})",
            ids[0], ids[1]
        );
        let check = p["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "the replay carries the retry's own id")
            .unwrap();
        assert_eq!(check["status"], "fail");
        assert_eq!(check["detail"], expected.as_str(), "{p:#}");
        // The replay is one, bodies with their ids aside.
        for c in p["checks"].as_array().unwrap() {
            if c["name"] != "the replay carries the retry's own id" {
                assert_eq!(c["status"], "pass", "{c:#}");
            }
        }
        // Every request carried its own id, and every other probe passed or did not apply.
        let mut all: Vec<u64> = report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(sent_ids)
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "ids reused: {all:?}");
        for p in report["probes"].as_array().unwrap() {
            if p["id"] != "mcp_replay_id" {
                assert_ne!(p["status"], "fail", "{p:#}");
            }
        }
        assert_eq!(probe(&report, "mcp_envelope")["status"], "pass");
        assert_eq!(probe(&report, "payload_mismatch")["status"], "pass");
    }
    let run = check(&format!("{base}/rpc"), &[]).await;
    assert_eq!(run.code, 1, "{}", run.stdout);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "Bottom line: a tool call's replay answers with another request's id, so the client \
         waits for its own."
    );
    assert!(lines.contains(&REPLAY_ID_LINE), "{}", run.stdout);
    let summary = lines[lines.iter().position(|l| *l == REPLAY_ID_LINE).unwrap() + 1];
    assert!(
        summary.starts_with(
            "                  the replay carries the retry's own id: the replay answered id "
        ),
        "{summary}"
    );
    let at = lines
        .iter()
        .position(|l| *l == "--- Replay id (MCP) (fail)")
        .unwrap_or_else(|| panic!("{}", run.stdout));
    // The section lists the replay's checks, then the verdict on its id.
    assert_eq!(lines[at + 1], "  [pass] replay: same status: 200 then 200");
    // Byte for byte: the server replays the first answer, id and all.
    assert!(
        lines[at + 2].starts_with("  [pass] replay: same body: ")
            && lines[at + 2].ends_with(" identical bytes"),
        "{}",
        lines[at + 2]
    );
    let check = lines[at + 3];
    assert!(
        check
            .starts_with("  [fail] the replay carries the retry's own id: the replay answered id ")
            && check.ends_with(": an MCP client waits for its own id and hangs (a JSON answer)"),
        "{check}"
    );
    assert!(lines.contains(&ENVELOPE_LINE), "{}", run.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn check_mcp_passes_every_probe_through_the_gateway_json_and_event_stream() {
    let (base, _server, _task) = server(Mode::Plain).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("idem.toml"),
        "[[route]]\npath = \"/rpc\"\nprofile = \"mcp\"\n\n[[route]]\npath = \"/rpc/sse\"\nprofile = \"mcp\"\n",
    )
    .unwrap();
    let gw = Gateway::start(
        &base,
        dir.path(),
        &["--store", "memory://", "--config", "idem.toml"],
    )
    .await;
    for (path, framing) in [
        ("/rpc", "a JSON answer"),
        ("/rpc/sse", "an event-stream answer"),
    ] {
        let run = check(&gw.url(path), &["--format", "json"]).await;
        let report: Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(run.code, 0, "{report:#}\n{}", gw.logs());
        for p in report["probes"].as_array().unwrap() {
            assert_ne!(p["status"], "fail", "{p:#}");
        }
        let p = probe(&report, "mcp_replay_id");
        assert_eq!(p["status"], "pass", "{p:#}");
        let ids = sent_ids(p);
        let replay_check = p["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "the replay carries the retry's own id")
            .unwrap();
        assert_eq!(
            replay_check["detail"],
            format!(
                "the replay answered id {} to a request with id {} ({framing})",
                ids[1], ids[1]
            )
            .as_str()
        );
        let envelope = probe(&report, "mcp_envelope");
        assert_eq!(envelope["status"], "pass", "{envelope:#}");
        let names: Vec<(&str, &str)> = envelope["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), c["status"].as_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                (
                    "a new id and progressToken are the same call: same status",
                    "pass"
                ),
                (
                    "a new id and progressToken are the same call: same body",
                    "pass"
                ),
                ("changed arguments are refused", "pass"),
            ]
        );
        // The envelope probe's second call carried another progressToken, the same
        // arguments.
        let bodies: Vec<Value> = envelope["exchanges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| serde_json::from_str(e["request"]["body"].as_str().unwrap()).unwrap())
            .collect();
        assert_ne!(bodies[0]["params"]["_meta"], bodies[1]["params"]["_meta"]);
        assert_eq!(
            bodies[0]["params"]["arguments"],
            bodies[1]["params"]["arguments"]
        );
        assert_ne!(
            bodies[0]["params"]["arguments"],
            bodies[2]["params"]["arguments"]
        );
    }
    let run = check(&gw.url("/rpc/sse"), &[]).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "Bottom line: idempotency holds for every probe that applied."
    );
    let passed = REPLAY_ID_LINE.replace("[fail]", "[pass]");
    assert!(lines.contains(&passed.as_str()), "{}", run.stdout);
    assert!(lines.contains(&ENVELOPE_LINE), "{}", run.stdout);
    // Ten probes: tenants alone does not apply (no --other-tenant-header).
    assert!(
        lines.contains(&"[not applicable]  Tenants — the same key under another tenant never gets this tenant's answer"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("\nPASSED: 10 probes: 9 passed, 0 failed, 1 not applicable; "),
        "{}",
        run.stdout
    );
}
