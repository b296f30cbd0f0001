//! `idem check URL`, run as a user runs it: against `idem serve` in front of the naive
//! demo payments API every probe passes; against the demo API itself the replay,
//! concurrency, lost-answer and mismatch probes fail with their evidence, the probes
//! that presuppose a replay do not apply, and the bottom line says the key is ignored;
//! parallel requests are made to overlap (or the probe says nothing was tested), even
//! against an API that answers at once; a form body, `https://` with a private CA; the
//! budget, the output formats and the exit codes hold.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

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

/// The detail of a probe's check named `name`.
fn check_detail<'a>(probe: &'a Value, name: &str) -> &'a str {
    probe["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {probe:#}"))["detail"]
        .as_str()
        .unwrap()
}

/// How many of the concurrency probe's requests were in flight together, as its
/// "one execution" check reports it ("… 7 of 10 in flight together …").
fn overlapped(probe: &Value) -> u64 {
    let detail = check_detail(probe, "one execution");
    let before = detail
        .split(" of ")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no overlap count in {detail:?}"));
    before
        .parse()
        .unwrap_or_else(|_| panic!("no overlap count in {detail:?}"))
}

/// An API that answers at once and creates a resource per request, keys or not: its
/// `POST /v1/things` answers 201 `{"id": "t_N", "request": …}`, reading the body as a
/// form when its `Content-Type` says so (a form answered 415 otherwise) and as JSON
/// otherwise. `count` is how many resources it made.
async fn instant_api(form: bool) -> (String, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let made = Arc::new(AtomicU64::new(0));
    let counter = made.clone();
    let app = Router::new().route(
        "/v1/things",
        post(move |headers: HeaderMap, body: Bytes| {
            let counter = counter.clone();
            async move {
                let typed_form = headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
                let request = if form {
                    if !typed_form {
                        return StatusCode::UNSUPPORTED_MEDIA_TYPE.into_response();
                    }
                    let params: serde_json::Map<String, Value> = form_urlencoded::parse(&body)
                        .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
                        .collect();
                    Value::Object(params)
                } else {
                    serde_json::from_slice(&body).unwrap_or(Value::Null)
                };
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let thing = json!({ "id": format!("t_{n}"), "request": request });
                (StatusCode::CREATED, axum::Json(thing)).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}"), made, task)
}

/// Both sides of a profile agree: `idem check --profile P` passes every probe against
/// the gateway serving `--profile P`, and fails the payload-mismatch probe against one
/// that answers in another dialect.
#[tokio::test(flavor = "multi_thread")]
async fn check_judges_each_profile_by_the_answers_the_gateway_gives_in_it() {
    let (demo, _task) = demo_api().await;
    for profile in ["stripe", "acp", "ucp"] {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "--store",
            "memory://",
            "--require-key",
            "--profile",
            profile,
        ];
        let gw = Gateway::start(&demo, dir.path(), &args).await;
        let url = gw.url("/v1/charges");
        let mut args = full_args(&url);
        args.extend(["--profile".to_owned(), profile.to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = check(&args).await;
        let report = run.json();
        assert_eq!(run.code, 0, "{profile}: {report:#}");
        for id in PROBE_IDS {
            assert_eq!(
                probe(&report, id)["status"],
                "pass",
                "{profile} {id}: {report:#}"
            );
        }
        assert_eq!(report["profile"], profile);
    }
    // The default dialect judged as Stripe's: the reused key's 422 is not Stripe's 400.
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&demo, dir.path(), &["--store", "memory://"]).await;
    let url = gw.url("/v1/charges");
    let run = check(&[&url, "--profile", "stripe", "--format", "json"]).await;
    let report = run.json();
    assert_eq!(run.code, 1, "{report:#}");
    assert_eq!(
        probe(&report, "payload_mismatch")["status"],
        "fail",
        "{report:#}"
    );
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
    assert_eq!(
        report["bottom_line"],
        "idempotency holds for every probe that applied"
    );
    // The concurrent duplicates were in flight together, and made one charge between
    // them.
    let concurrent = probe(&report, "concurrent_duplicates");
    assert!(overlapped(concurrent) >= 2, "{concurrent:#}");
    let ids = answered_ids(concurrent);
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
    // The parallel requests were made to overlap before they were judged.
    assert!(overlapped(probe(&report, "concurrent_duplicates")) >= 2);
    assert!(
        check_detail(probe(&report, "concurrent_duplicates"), "one execution")
            .contains("5 distinct resource ids"),
    );
    // A naive API replays nothing, so what presupposes a replay cannot be judged.
    for id in ["tenants", "replayed_headers", "equivalent_json"] {
        let p = probe(&report, id);
        assert_eq!(p["status"], "not_applicable", "{id}: {p:#}");
        assert!(
            p["summary"]
                .as_str()
                .unwrap()
                .starts_with("replay does not hold, so "),
            "{id}: {p:#}"
        );
    }
    // Nothing that executed every time reads as a pass, not even a matching status.
    for p in report["probes"].as_array().unwrap() {
        for c in p["checks"].as_array().unwrap() {
            assert_ne!(c["status"], "pass", "{}: {c:#}", p["id"]);
        }
    }
    assert_eq!(
        report["bottom_line"],
        "this API ignores `Idempotency-Key`: every retry creates a new resource"
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
async fn check_text_report_starts_with_the_bottom_line() {
    let (demo, _task) = demo_api().await;
    let url = format!("{demo}/v1/charges");
    let run = check(&[&url, "--concurrency", "4", "--id-pointer", "/id"]).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let first = run.stdout.lines().next().unwrap();
    assert_eq!(
        first,
        "Bottom line: this API ignores `Idempotency-Key`: every retry creates a new resource."
    );
    assert!(
        run.stdout
            .contains("[fail]            Replay — the same request with the same key is answered from the record"),
        "{}",
        run.stdout
    );
    let lines = run.stdout.lines().count();
    assert!(
        (20..80).contains(&lines),
        "tens of lines, not {lines}:\n{}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("> idempotency-key"),
        "no exchanges by default"
    );
    let verbose = check(&[&url, "--concurrency", "4", "--verbose"]).await;
    assert!(
        verbose.stdout.contains("> idempotency-key: idem-check-"),
        "{}",
        verbose.stdout
    );
    assert!(
        verbose.stdout.contains("# parallel request 4 (in flight"),
        "{}",
        verbose.stdout
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn check_never_passes_concurrency_against_an_instant_api() {
    let (api, made, _task) = instant_api(false).await;
    let url = format!("{api}/v1/things");
    let run = check(&[
        &url,
        "--concurrency",
        "10",
        "--id-pointer",
        "/id",
        "--format",
        "json",
    ])
    .await;
    let report = run.json();
    assert_eq!(run.code, 1, "{report:#}");
    let p = probe(&report, "concurrent_duplicates");
    match p["status"].as_str().unwrap() {
        // The held last bytes made them overlap: each one made its own resource.
        "fail" => {
            assert!(overlapped(p) >= 2, "{p:#}");
            let ids = answered_ids(p);
            let mut distinct = ids.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), ids.len(), "{ids:?}");
            assert!(distinct.len() >= 2, "{ids:?}");
        }
        "not_applicable" => assert_eq!(
            p["summary"],
            "not tested: no two requests were in flight together"
        ),
        other => panic!("concurrency was reported {other}: {p:#}"),
    }
    assert!(made.load(Ordering::SeqCst) >= 10);

    // Behind the gateway, the same instant API: the overlap is counted and one
    // execution holds.
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&api, dir.path(), &["--store", "memory://"]).await;
    let before = made.load(Ordering::SeqCst);
    let run = check(&[
        &gw.url("/v1/things"),
        "--concurrency",
        "10",
        "--id-pointer",
        "/id",
        "--format",
        "json",
    ])
    .await;
    let report = run.json();
    let p = probe(&report, "concurrent_duplicates");
    assert_eq!(p["status"], "pass", "{p:#}\n{}", gw.logs());
    assert!(overlapped(p) >= 2, "{p:#}");
    let ids = answered_ids(p);
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(run.code, 0, "{report:#}");
    // replay, concurrency, lost answer, mismatch (refused), quoted/bare, equivalent
    // JSON, replayed headers: one resource each.
    assert_eq!(made.load(Ordering::SeqCst) - before, 7, "{report:#}");
}

#[tokio::test(flavor = "multi_thread")]
async fn check_passes_a_form_api_behind_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (api, made, _task) = instant_api(true).await;
    let gw = Gateway::start(&api, dir.path(), &["--store", "memory://", "--require-key"]).await;
    let url = gw.url("/v1/things");
    let run = check(&[
        &url,
        "--body",
        "amount=500&currency=eur",
        "-H",
        "Content-Type: application/x-www-form-urlencoded",
        "--id-pointer",
        "/id",
        "--header",
        &format!("Authorization: {TENANT_A}"),
        "--other-tenant-header",
        &format!("Authorization: {TENANT_B}"),
        "--require-key",
        "--concurrency",
        "8",
        "--format",
        "json",
    ])
    .await;
    let report = run.json();
    assert_eq!(run.code, 0, "{report:#}\n{}", gw.logs());
    for id in PROBE_IDS {
        assert_eq!(probe(&report, id)["status"], "pass", "{id}: {report:#}");
    }
    // The changed body stayed a form; the equivalent one was a form in other bytes.
    let mismatch = probe(&report, "payload_mismatch");
    let changed = &mismatch["exchanges"][1]["request"];
    assert_eq!(
        changed["body"],
        "amount=500&currency=eur&idem_check_changed=1"
    );
    let equivalent = &probe(&report, "equivalent_json")["exchanges"][1]["request"];
    assert_eq!(equivalent["body"], "currency=%65ur&amount=500");
    // What the API made was read as a form.
    let first = &probe(&report, "replay")["exchanges"][0]["response"]["body"];
    let first: Value = serde_json::from_str(first.as_str().unwrap()).unwrap();
    assert_eq!(
        first["request"],
        json!({"amount": "500", "currency": "eur"})
    );
    // The form detected without a Content-Type is sent with one.
    let made_before = made.load(Ordering::SeqCst);
    let run = check(&[
        &url,
        "--body",
        "amount=1",
        "--concurrency",
        "2",
        "--format",
        "json",
    ])
    .await;
    let report = run.json();
    assert_eq!(probe(&report, "replay")["status"], "pass", "{report:#}");
    assert!(made.load(Ordering::SeqCst) > made_before);
}

/// A private CA and a certificate it signs for 127.0.0.1 and localhost: the CA's PEM,
/// the leaf's PEM chain and key.
fn private_ca() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (
        ca.pem(),
        format!("{}{}", leaf.pem(), ca.pem()),
        key.serialize_pem(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn check_speaks_https_trusting_the_ca_given() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, chain, key) = private_ca();
    std::fs::write(dir.path().join("ca.pem"), ca).unwrap();
    std::fs::write(dir.path().join("cert.pem"), chain).unwrap();
    std::fs::write(dir.path().join("key.pem"), key).unwrap();
    let (demo, _task) = demo_api().await;
    let gw = Gateway::start(
        &demo,
        dir.path(),
        &[
            "--store",
            "memory://",
            "--tls-cert",
            "cert.pem",
            "--tls-key",
            "key.pem",
        ],
    )
    .await;
    let url = format!("https://{}/v1/charges", gw.addr);
    let ca_path = dir.path().join("ca.pem");
    let run = check(&[
        &url,
        "--ca",
        ca_path.to_str().unwrap(),
        "--id-pointer",
        "/id",
        "--concurrency",
        "6",
        "--format",
        "json",
    ])
    .await;
    let report = run.json();
    assert_eq!(run.code, 0, "{report:#}\n{}", gw.logs());
    for id in [
        "replay",
        "concurrent_duplicates",
        "lost_answer",
        "payload_mismatch",
        "keys",
    ] {
        assert_eq!(probe(&report, id)["status"], "pass", "{id}: {report:#}");
    }
    assert!(overlapped(probe(&report, "concurrent_duplicates")) >= 2);

    // Without --ca the private CA is not trusted: either no system roots (a usage error
    // saying --ca) or a failed handshake in every probe, never a pass.
    let untrusted = check(&[&url, "--concurrency", "2", "--format", "json"]).await;
    match untrusted.code {
        2 => assert!(
            untrusted.stderr.contains("--ca FILE"),
            "{}",
            untrusted.stderr
        ),
        1 => {
            let report = untrusted.json();
            assert_eq!(report["summary"]["pass"], 0, "{report:#}");
            assert!(untrusted.stdout.contains("TLS handshake"), "{report:#}");
        }
        other => panic!("exit {other}: {}", untrusted.stderr),
    }
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
    let ftp = check(&["ftp://127.0.0.1:1/v1/charges"]).await;
    assert_eq!(ftp.code, 2, "{}", ftp.stderr);
    assert!(
        ftp.stderr.contains("is no http:// or https:// URL"),
        "{}",
        ftp.stderr
    );
    assert!(ftp.stdout.is_empty());
    let no_ca = check(&["https://127.0.0.1:1/", "--ca", "/nonexistent/ca.pem"]).await;
    assert_eq!(no_ca.code, 2, "{}", no_ca.stderr);
    let profile = check(&["http://127.0.0.1:1/", "--profile", "paypal"]).await;
    assert_eq!(profile.code, 2, "{}", profile.stderr);

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
