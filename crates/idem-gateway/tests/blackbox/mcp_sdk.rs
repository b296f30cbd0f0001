//! The official MCP Python SDK (from `IDEM_TEST_MCP_PYTHONPATH`, which `.ci/run` fills;
//! without it the test skips loudly, and fails under `IDEM_REQUIRE_SERVICES=1`) on both
//! ends of the gateway (issue 64): a stateless `MCPServer` whose tool counts its
//! executions, and an unmodified `Client` calling it with `meta={"idempotency-key": k}`
//! whose first answer is lost (its call times out while the tool is slow) and that calls
//! again. Straight to the server the tool runs twice; through the gateway once, and the
//! SDK accepts the replay (which carries its second call's request id), with JSON
//! answers and with event-stream answers alike.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{Gateway, new_key};

const SERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/blackbox/mcp_server.py");
const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/blackbox/mcp_client.py");

/// The SDK's path, or `None` (reported) when python3 cannot import it.
async fn sdk() -> Option<String> {
    let path = std::env::var("IDEM_TEST_MCP_PYTHONPATH").unwrap_or_default();
    let probe = tokio::process::Command::new("python3")
        .env("PYTHONPATH", &path)
        .args(["-c", "import mcp.server.mcpserver, mcp.client"])
        .output()
        .await;
    match probe {
        Ok(out) if out.status.success() => Some(path),
        other => {
            let error = match other {
                Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                Err(e) => e.to_string(),
            };
            idem_test_support::service_unavailable(
                "python3 with the MCP SDK",
                &format!("IDEM_TEST_MCP_PYTHONPATH={path}"),
                &error,
            )
        }
    }
}

/// The SDK's server on a port of its own, answering in `answers` (`json` or `sse`),
/// once it accepts connections. Its imports take seconds on a busy machine: it is given
/// a minute, and a server that exits first is reported with what it said.
async fn server(sdk: &str, answers: &str) -> (tokio::process::Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = tokio::process::Command::new("python3")
        .env("PYTHONPATH", sdk)
        .args([SERVER, &port.to_string(), answers])
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return (child, port);
        }
        if let Some(status) = child.try_wait().unwrap() {
            let said = std::fs::read_to_string(log.path()).unwrap_or_default();
            panic!("the MCP server exited ({status}) before it listened on {port}:\n{said}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let said = std::fs::read_to_string(log.path()).unwrap_or_default();
    panic!("the MCP server did not listen on {port} within 60 s:\n{said}");
}

/// The SDK client's run against `url`, as the JSON line it prints.
async fn client(sdk: &str, url: &str, dir: &Path) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .env("PYTHONPATH", sdk)
            .current_dir(dir)
            .args([CLIENT, url, &new_key()])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK client ends within 60 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mcp_python_sdk_runs_a_tool_once_and_accepts_the_replay_of_a_lost_answer() {
    let Some(sdk) = sdk().await else { return };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("idem.toml"),
        "[[route]]\npath = \"/mcp\"\nprofile = \"mcp\"\n",
    )
    .unwrap();

    // Straight to the server: the SDK's retry runs the tool again.
    let (_direct, port) = server(&sdk, "json").await;
    let direct = client(&sdk, &format!("http://127.0.0.1:{port}/mcp"), dir.path()).await;
    assert_eq!(
        direct["first"], "MCPError",
        "the first answer is lost: {direct}"
    );
    assert_eq!(direct["executions"], json!(["2"]), "{direct}");

    for answers in ["json", "sse"] {
        let (_server, port) = server(&sdk, answers).await;
        let args = ["--store", "memory://", "--config", "idem.toml"];
        let gw = Gateway::start(&format!("http://127.0.0.1:{port}"), dir.path(), &args).await;
        let out = client(&sdk, &gw.url("/mcp"), dir.path()).await;
        assert_eq!(
            out["first"], "MCPError",
            "{answers}: the first answer is lost: {out}"
        );
        assert_eq!(
            out["retry"],
            json!(["paid 5 (execution 1)"]),
            "{answers}: the SDK took the replay of the first execution: {out}"
        );
        assert_eq!(out["retry_error"], false, "{answers}: {out}");
        assert_eq!(
            out["executions"],
            json!(["1"]),
            "{answers}: the tool ran once: {out}"
        );
        assert!(gw.logs().contains("outcome=\"replayed\""), "{answers}");
    }
}
