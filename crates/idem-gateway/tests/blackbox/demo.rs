//! `idem demo`: the real binary runs its own demo payments API, a gateway in front of it
//! and the faulty client, and its JSON numbers are checked here.

use std::process::Stdio;
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::Value;

use crate::common::binary;

/// Runs `idem demo ARGS… --format json` (bounded) and returns its exit status and report.
async fn demo(args: &[&str]) -> (std::process::ExitStatus, Value) {
    let mut cmd = tokio::process::Command::new(binary());
    cmd.arg("demo")
        .args(args)
        .args(["--format", "json"])
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
        .expect("idem demo finishes within 2 minutes")
        .expect("idem demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not a JSON report ({e}):\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status, report)
}

async fn reachable(url: &str) -> bool {
    let addr = url.trim_start_matches("http://");
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

#[tokio::test]
async fn demo_shows_double_charges_without_idem_and_none_with_it() {
    let (status, r) = demo(&["--operations", "30"]).await;
    assert!(status.success(), "{status}: {r}");
    assert_eq!(r["operations"], 30);
    let without = &r["without_idem"];
    let with = &r["with_idem"];
    // Every operation was answered in the end, and charged at least once, on both sides.
    for side in [without, with] {
        assert_eq!(side["answered"], 30, "{r}");
        assert_eq!(side["uncharged"], 0, "{r}");
    }
    // Without idem, the faults charge some operations twice or more.
    assert!(without["charges"].as_u64().unwrap() > 30, "{r}");
    assert!(without["double_charged"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(without["replays"], 0, "{r}");
    // With idem: one charge per operation, the retries answered from the records.
    assert_eq!(with["charges"], 30, "{r}");
    assert_eq!(with["double_charged"], 0, "{r}");
    assert!(with["replays"].as_u64().unwrap() > 0, "{r}");
    // The faults all happened: lost answers, timeouts, duplicates and the kill.
    let faults = &r["faults"];
    for f in ["answers_lost", "client_timeouts", "duplicated_sends"] {
        assert!(faults[f].as_u64().unwrap() > 0, "{f}: {r}");
    }
    assert_eq!(faults["gateway_kills"], 1, "{r}");
    // It cleaned up: both children are gone and so is its directory.
    for p in ["api", "gateway"] {
        let url = r[p]["url"].as_str().unwrap();
        assert!(!reachable(url).await, "{p} still answers at {url}");
    }
    let dir = r["dir"].as_str().unwrap();
    assert!(!std::path::Path::new(dir).exists(), "{dir} left behind");
}

#[tokio::test]
async fn demo_keep_leaves_the_api_and_the_gateway_running() {
    let (status, r) = demo(&["--operations", "4", "--keep"]).await;
    let pids: Vec<u64> = ["api", "gateway"]
        .iter()
        .filter_map(|p| r[p]["pid"].as_u64())
        .collect();
    let stop = || {
        for pid in &pids {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    };
    let outcome = async {
        assert!(status.success(), "{status}: {r}");
        assert_eq!(pids.len(), 2, "{r}");
        for p in ["api", "gateway"] {
            let url = r[p]["url"].as_str().unwrap();
            assert!(reachable(url).await, "{p} is not running at {url}");
        }
        // The API still holds the run's charges, for curl to look at.
        let answer = crate::common::Http::new()
            .send(
                "GET",
                &format!("{}/v1/charges", r["api"]["url"].as_str().unwrap()),
                &[],
                "",
            )
            .await;
        assert_eq!(answer.status, 200);
        assert!(answer.json()["count"].as_u64().unwrap() > 8, "{r}");
        let dir = r["dir"].as_str().unwrap();
        assert!(std::path::Path::new(dir).join("idem.db").exists(), "{r}");
    };
    // Stop them whatever the assertions said.
    let result = std::panic::AssertUnwindSafe(outcome).catch_unwind().await;
    stop();
    if let Some(dir) = r["dir"].as_str() {
        let _ = std::fs::remove_dir_all(dir);
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
