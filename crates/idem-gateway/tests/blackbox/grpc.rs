//! SPEC S18 with real gRPC peers from outside the project: a Python `grpcio` server
//! (generic byte handlers, no code generation) as the upstream, over h2c, and `grpcio`
//! clients through the gateway. `grpcio` comes from `IDEM_TEST_PYTHONPATH` (`.ci/run`
//! installs it there); without it the tests skip loudly, and fail under
//! `IDEM_REQUIRE_SERVICES=1`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{Gateway, new_key};

/// The peers' script, beside this file.
fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/blackbox/grpc_peer.py")
}

fn python() -> Command {
    let mut cmd = Command::new("python3");
    if let Ok(path) = std::env::var("IDEM_TEST_PYTHONPATH") {
        cmd.env("PYTHONPATH", path);
    }
    cmd.arg(script()).kill_on_drop(true);
    cmd
}

/// Whether `grpcio` imports; if not, skips loudly (or fails under
/// `IDEM_REQUIRE_SERVICES=1`).
async fn grpcio() -> bool {
    let mut cmd = Command::new("python3");
    if let Ok(path) = std::env::var("IDEM_TEST_PYTHONPATH") {
        cmd.env("PYTHONPATH", path);
    }
    let out = cmd.args(["-c", "import grpc"]).output().await;
    let error = match out {
        Ok(out) if out.status.success() => return true,
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        Err(e) => e.to_string(),
    };
    let path = std::env::var("IDEM_TEST_PYTHONPATH").unwrap_or_else(|_| "(unset)".into());
    idem_test_support::service_unavailable::<()>(
        "python3 with grpcio",
        &format!("IDEM_TEST_PYTHONPATH={path}"),
        &error,
    );
    false
}

/// The `grpcio` upstream, stopped when its standard input closes on drop.
struct Server {
    _child: Child,
    addr: String,
}

impl Server {
    async fn start() -> Server {
        let mut child = python()
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 starts");
        let stdout = child.stdout.take().unwrap();
        let port = tokio::time::timeout(Duration::from_secs(30), async {
            BufReader::new(stdout).lines().next_line().await
        })
        .await
        .expect("the grpcio server prints its port in time")
        .unwrap()
        .expect("the grpcio server prints its port");
        Server {
            _child: child,
            addr: format!("127.0.0.1:{}", port.trim()),
        }
    }

    /// How many times the server's handler ran for `key`.
    async fn runs(&self, key: &str) -> u64 {
        let out = python()
            .args(["runs", &self.addr, key])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

/// What a `grpcio` client got back.
#[derive(Debug)]
struct Got {
    code: String,
    message: Option<String>,
    details: Option<String>,
    initial: Vec<(String, String)>,
    trailing: Vec<(String, String)>,
}

impl Got {
    /// Whether the answer is marked a replay: in the initial metadata, which for a
    /// trailers-only answer `grpcio` hands over as trailing metadata.
    fn replayed(&self) -> bool {
        self.initial
            .iter()
            .chain(&self.trailing)
            .any(|(k, v)| k == "idempotent-replayed" && v == "true")
    }

    fn metadata(&self, name: &str) -> Option<&str> {
        self.initial
            .iter()
            .chain(&self.trailing)
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn pairs(v: &serde_json::Value) -> Vec<(String, String)> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_owned(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn run_client(args: &[&str]) -> serde_json::Value {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        python().arg("call").args(args).output(),
    )
    .await
    .expect("the grpcio client finishes in time")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

/// One unary call through the gateway `gw` with `key` ("-" for none).
async fn call(gw: &Gateway, key: &str, message: &str) -> Got {
    let v = run_client(&[&gw.addr.to_string(), key, message]).await;
    Got {
        code: v["code"].as_str().unwrap().to_owned(),
        message: v["message"].as_str().map(str::to_owned),
        details: v["details"].as_str().map(str::to_owned),
        initial: pairs(&v["initial"]),
        trailing: pairs(&v["trailing"]),
    }
}

/// One call through `gw` whose answer is lost: the client resets the stream once
/// `server` runs it.
async fn call_and_lose_the_answer(gw: &Gateway, server: &Server, key: &str, message: &str) {
    let v = run_client(&[
        &gw.addr.to_string(),
        key,
        message,
        "--cancel-when-running",
        &server.addr,
    ])
    .await;
    assert_eq!(v["cancelled"], true, "{v}");
    assert_eq!(v["ran"], 1, "{v}");
}

/// Calls through `gw` until the answer is no longer `ABORTED` (another attempt in
/// progress), waiting as its `grpc-retry-pushback-ms` says; a bounded number of times.
async fn call_until_settled(gw: &Gateway, key: &str, message: &str) -> Got {
    for _ in 0..40 {
        let got = call(gw, key, message).await;
        if got.code != "ABORTED" {
            return got;
        }
        let wait = got
            .metadata("grpc-retry-pushback-ms")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(250);
        tokio::time::sleep(Duration::from_millis(wait.min(1000))).await;
    }
    panic!("{key} stayed in progress");
}

struct Setup {
    server: Server,
    gw: Gateway,
    _dir: tempfile::TempDir,
}

async fn setup(extra: &[&str]) -> Option<Setup> {
    if !grpcio().await {
        return None;
    }
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--store", "memory://", "--upstream-protocol", "http2"];
    args.extend_from_slice(extra);
    let upstream = format!("http://{}", server.addr);
    let gw = Gateway::start(&upstream, dir.path(), &args).await;
    Some(Setup {
        server,
        gw,
        _dir: dir,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_a_retry_after_a_lost_answer_replays_its_message_and_status() {
    let Some(s) = setup(&[]).await else { return };
    let key = new_key();
    call_and_lose_the_answer(&s.gw, &s.server, &key, "slow|tea").await;
    let retry = call_until_settled(&s.gw, &key, "slow|tea").await;
    assert_eq!(retry.code, "OK", "{retry:?}\n{}", s.gw.logs());
    assert_eq!(retry.message.as_deref(), Some("order 1 for tea"));
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(s.server.runs(&key).await, 1, "the server ran once");

    // A recorded error replays its status and message the same way.
    let key = new_key();
    let first = call(&s.gw, &key, "not-found|tea").await;
    assert_eq!(first.code, "NOT_FOUND", "{first:?}");
    assert_eq!(first.details.as_deref(), Some("no order 1"));
    assert!(!first.replayed());
    let retry = call(&s.gw, &key, "not-found|tea").await;
    assert_eq!(retry.code, "NOT_FOUND", "{retry:?}");
    assert_eq!(retry.details.as_deref(), Some("no order 1"));
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(s.server.runs(&key).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_a_key_reused_with_another_message_is_failed_precondition() {
    let Some(s) = setup(&[]).await else { return };
    let key = new_key();
    assert_eq!(call(&s.gw, &key, "ok|tea").await.code, "OK");
    let reused = call(&s.gw, &key, "ok|coffee").await;
    assert_eq!(reused.code, "FAILED_PRECONDITION", "{reused:?}");
    assert!(
        reused
            .details
            .as_deref()
            .is_some_and(|d| d.contains("reused")),
        "{reused:?}"
    );
    assert_eq!(s.server.runs(&key).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_a_release_status_lets_the_second_attempt_execute() {
    let Some(s) = setup(&[]).await else { return };
    let key = new_key();
    let first = call(&s.gw, &key, "unavailable-once|tea").await;
    assert_eq!(first.code, "UNAVAILABLE", "{first:?}");
    let second = call(&s.gw, &key, "unavailable-once|tea").await;
    assert_eq!(second.code, "OK", "{second:?}");
    assert_eq!(second.message.as_deref(), Some("order 2 for tea"));
    assert!(!second.replayed());
    assert_eq!(s.server.runs(&key).await, 2);

    // Configured otherwise, UNAVAILABLE is recorded.
    let Some(s) = setup(&["--grpc-release-codes", "ABORTED"]).await else {
        return;
    };
    let key = new_key();
    assert_eq!(
        call(&s.gw, &key, "unavailable-once|tea").await.code,
        "UNAVAILABLE"
    );
    let replay = call(&s.gw, &key, "unavailable-once|tea").await;
    assert_eq!(replay.code, "UNAVAILABLE", "{replay:?}");
    assert!(replay.replayed());
    assert_eq!(s.server.runs(&key).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_a_call_without_a_key_passes_through_and_a_bad_key_is_invalid_argument() {
    let Some(s) = setup(&[]).await else { return };
    for n in 1..=2 {
        let got = call(&s.gw, "-", "ok|tea").await;
        assert_eq!(got.code, "OK");
        assert_eq!(got.message, Some(format!("order {n} for tea")));
    }
    let bad = call(&s.gw, &"k".repeat(300), "ok|tea").await;
    assert_eq!(bad.code, "INVALID_ARGUMENT", "{bad:?}");
}
