//! `idem check URL`, run as a user runs it: against `idem serve` in front of the naive
//! demo payments API every probe passes; against the demo API itself the replay,
//! concurrency, lost-answer and mismatch probes fail with their evidence; the budget,
//! the output formats and the exit codes hold.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::{Gateway, Http, binary};

/// Credentials the checker is given; no report may show them.
const TENANT_A: &str = "Bearer tenant-a-s3cret";
const TENANT_B: &str = "Bearer tenant-b-s3cret";

/// The demo payments API (`idem demo-upstream`'s router) on a free port: every POST
/// creates a charge.
async fn demo_api() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, idem_gateway::demo::router())
            .await
            .unwrap();
    });
    (format!("http://{addr}"), task)
}

/// Charges the demo API holds.
async fn charges(base: &str) -> u64 {
    let a = Http::new()
        .send("GET", &format!("{base}/v1/charges"), &[], "")
        .await;
    a.json()["count"].as_u64().unwrap()
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!("not JSON ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr)
        })
    }
}

/// Runs `idem check ARGS…`, bounded.
async fn check(args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(binary());
    cmd.arg("check")
        .args(args)
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
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
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

/// The `--id-pointer` ids of a probe's 2xx answers, in order.
fn answered_ids(probe: &Value) -> Vec<String> {
    probe["exchanges"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            let res = e["response"].as_object()?;
            let status = res["status"].as_u64()?;
            if !(200..300).contains(&status) {
                return None;
            }
            let body: Value = serde_json::from_str(res["body"].as_str()?).ok()?;
            Some(body["id"].as_str()?.to_owned())
        })
        .collect()
}

const PROBE_IDS: [&str; 8] = [
    "replay",
    "concurrent_duplicates",
    "lost_answer",
    "payload_mismatch",
    "keys",
    "equivalent_json",
    "tenants",
    "replayed_headers",
];

fn full_args(url: &str) -> Vec<String> {
    [
        url,
        "--body",
        r#"{"amount": 500, "currency": "eur"}"#,
        "--id-pointer",
        "/id",
        "--header",
        &format!("Authorization: {TENANT_A}"),
        "--other-tenant-header",
        &format!("Authorization: {TENANT_B}"),
        "--require-key",
        "--format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn check_passes_every_probe_behind_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, _task) = demo_api().await;
    let gw = Gateway::start(
        &demo,
        dir.path(),
        &["--store", "memory://", "--require-key"],
    )
    .await;
    let url = gw.url("/v1/charges");
    let args = full_args(&url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = check(&args).await;
    let report = run.json();
    assert_eq!(run.code, 0, "{report:#}\n{}", gw.logs());
    assert_eq!(report["format"], "idem-check/1");
    assert_eq!(report["passed"], true);
    for id in PROBE_IDS {
        assert_eq!(probe(&report, id)["status"], "pass", "{id}: {report:#}");
    }
    assert!(
        run.stderr
            .starts_with("warning: idem check sends real requests"),
        "the warning comes first: {}",
        run.stderr
    );
    // The concurrent duplicates made one charge between them.
    let ids = answered_ids(probe(&report, "concurrent_duplicates"));
    assert!(!ids.is_empty());
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    // One charge per execution the probes asked for: replay, concurrency, lost answer,
    // mismatch (its changed body is refused), the quoted/bare key, equivalent JSON,
    // both tenants, replayed headers. No retry charged again.
    assert_eq!(charges(&demo).await, 9, "{report:#}");
    let sent = report["requests_sent"].as_u64().unwrap();
    assert!(sent > 9 && sent <= 200, "{sent}");
    for secret in ["tenant-a-s3cret", "tenant-b-s3cret"] {
        assert!(!run.stdout.contains(secret), "{secret} in the report");
        assert!(!run.stderr.contains(secret), "{secret} on stderr");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn check_fails_against_the_naive_api_directly() {
    let (demo, _task) = demo_api().await;
    let url = format!("{demo}/v1/charges");
    let mut args = full_args(&url);
    args.extend(["--concurrency".to_owned(), "5".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = check(&args).await;
    let report = run.json();
    assert_eq!(run.code, 1, "{report:#}");
    assert_eq!(report["passed"], false);
    for id in [
        "replay",
        "concurrent_duplicates",
        "lost_answer",
        "payload_mismatch",
    ] {
        let p = probe(&report, id);
        assert_eq!(p["status"], "fail", "{id}: {p:#}");
        assert!(
            !p["exchanges"].as_array().unwrap().is_empty(),
            "{id} shows its requests"
        );
        let summary = p["summary"].as_str().unwrap();
        assert!(
            summary.contains("ch_"),
            "{id}'s summary names the ids: {summary}"
        );
    }
    // The evidence: every parallel request made a charge of its own.
    let ids = answered_ids(probe(&report, "concurrent_duplicates"));
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "{ids:?}");
    assert!(
        probe(&report, "payload_mismatch")["summary"]
            .as_str()
            .unwrap()
            .contains("answered 201 instead of 422"),
    );
    // A naive API replays nothing, so there are no replayed headers to judge.
    assert_eq!(
        probe(&report, "replayed_headers")["status"],
        "not_applicable"
    );
    assert!(!run.stdout.contains("tenant-a-s3cret") && !run.stdout.contains("tenant-b-s3cret"));
    assert_eq!(
        report["summary"]["fail"].as_u64().unwrap()
            + report["summary"]["pass"].as_u64().unwrap()
            + report["summary"]["not_applicable"].as_u64().unwrap(),
        8
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn check_stays_within_max_requests() {
    let (demo, _task) = demo_api().await;
    let url = format!("{demo}/v1/charges");
    let run = check(&[
        &url,
        "--concurrency",
        "4",
        "--max-requests",
        "12",
        "--format",
        "json",
    ])
    .await;
    let report = run.json();
    assert_eq!(run.code, 1, "{report:#}");
    assert!(
        report["requests_sent"].as_u64().unwrap() <= 12,
        "{report:#}"
    );
    // Every POST the demo received made a charge: it received at most 12.
    assert!(charges(&demo).await <= 12);
    let stopped = report["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["summary"]
                .as_str()
                .unwrap()
                .contains("--max-requests 12 is spent")
        })
        .count();
    assert!(stopped >= 1, "the probes that ran out say so: {report:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn check_exit_codes_tell_usage_errors_and_unreachable_urls_apart() {
    let https = check(&["https://127.0.0.1:1/v1/charges"]).await;
    assert_eq!(https.code, 2, "{}", https.stderr);
    assert!(
        https.stderr.contains("https:// is not supported yet"),
        "{}",
        https.stderr
    );
    assert!(https.stdout.is_empty());

    let bad = check(&["http://127.0.0.1:1/", "--concurrency", "1"]).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);

    let unknown = check(&["http://127.0.0.1:1/", "--format", "yaml"]).await;
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);

    // A port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gone = check(&[&format!("http://127.0.0.1:{port}/v1/charges")]).await;
    assert_eq!(gone.code, 3, "{}", gone.stderr);
    assert!(
        gone.stderr.contains("cannot reach 127.0.0.1"),
        "{}",
        gone.stderr
    );
    assert!(gone.stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn check_writes_junit_and_markdown_reports() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, _task) = demo_api().await;
    let url = format!("{demo}/v1/charges");
    let file = dir.path().join("check.xml");
    let junit = check(&[
        &url,
        "--concurrency",
        "3",
        "--body",
        r#"{"amount":5}"#,
        "--header",
        &format!("Authorization: {TENANT_A}"),
        "--format",
        "junit",
        "--output",
        file.to_str().unwrap(),
    ])
    .await;
    assert_eq!(junit.code, 1, "{}", junit.stderr);
    assert!(junit.stdout.is_empty(), "the report went to the file");
    assert!(junit.stderr.contains("report in"), "{}", junit.stderr);
    let xml = std::fs::read_to_string(&file).unwrap();
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), 8, "{xml}");
    for id in PROBE_IDS {
        assert!(xml.contains(&format!("name=\"{id}\"")), "{id}: {xml}");
    }
    assert!(xml.contains("<failure message="), "{xml}");
    // Without --other-tenant-header the tenants probe is skipped, saying why.
    assert!(
        xml.contains("<skipped message=\"not checked: pass --other-tenant-header"),
        "{xml}"
    );
    // The evidence is inside the failures, escaped; the credential is not.
    assert!(xml.contains("{&quot;amount&quot;:5}"), "{xml}");
    assert!(!xml.contains("tenant-a-s3cret"));

    let md = check(&[&url, "--concurrency", "3", "--format", "markdown"]).await;
    assert_eq!(md.code, 1, "{}", md.stderr);
    assert!(
        md.stdout.contains("| Probe | Result | Summary |"),
        "{}",
        md.stdout
    );
    assert!(md.stdout.contains("| Replay | ❌ fail |"), "{}", md.stdout);
    assert_eq!(md.stdout.matches("<details>").count(), 8);
}
