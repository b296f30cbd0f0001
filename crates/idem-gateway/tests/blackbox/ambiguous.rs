//! The ambiguous-outcome feed (issue 26 §3): outcomes the gateway could not know are
//! counted by reason, logged by the scope's digest, and listed by the admin listener
//! (`GET /keys?…`) and `idem keys list`, a page at a time.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, binary, metric, metrics, new_key};

/// The JSON lines of a listing's body.
fn lines(body: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// The value of the series `idem_ambiguous_outcomes_total{reason="…"}` in a `/metrics`
/// text.
fn ambiguous_count(metrics: &str, reason: &str) -> Option<u64> {
    metric(
        metrics,
        &format!("idem_ambiguous_outcomes_total{{reason=\"{reason}\"}}"),
    )
}

/// An upstream that times out after it got the request: 504, counted as
/// `upstream_timeout` and logged by the digest the listing names the record by, never
/// by its key or credential; the record is listed as in progress once older than the
/// age asked, and as ambiguous (`orphaned`) once its lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeout_is_counted_logged_by_digest_and_listed() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--upstream-timeout",
            "300ms",
            "--lease",
            "1s",
            "--admin",
            "0",
            // The listing is what this test reads; no token on a test bench.
            "--admin-open",
        ],
    )
    .await;
    let http = Http::new();
    let text = metrics(&http, &gw).await;
    for reason in [
        "takeover",
        "orphaned",
        "upstream_timeout",
        "answer_too_large",
    ] {
        assert_eq!(
            ambiguous_count(&text, reason),
            Some(0),
            "{reason} listed at 0"
        );
    }

    let key = new_key();
    let a = http
        .post(
            &gw.url("/v1/charges"),
            &key,
            "{}",
            &[
                ("x-test-delay-ms", "5000"),
                ("authorization", "Bearer sk_secret_1"),
            ],
        )
        .await;
    assert_eq!(a.status, 504);
    let text = metrics(&http, &gw).await;
    assert_eq!(
        ambiguous_count(&text, "upstream_timeout"),
        Some(1),
        "{text}"
    );

    let listed = http
        .send("GET", &gw.admin_url("/keys?state=in_progress"), &[], "")
        .await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.header("content-type"), Some("application/x-ndjson"));
    let records = lines(&listed.body);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["key"], key.as_str());
    assert_eq!(records[0]["state"], "in_progress");
    assert_eq!(records[0]["endpoint"], "POST /v1/charges");
    let digest = records[0]["scope"].as_str().unwrap().to_owned();
    assert_eq!(digest.len(), 64);
    let logs = gw.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("ambiguous outcome"))
        .unwrap_or_else(|| panic!("no log line of the ambiguous outcome:\n{logs}"));
    assert!(line.contains(&digest), "{line}");
    assert!(line.contains("upstream_timeout"), "{line}");
    for l in logs.lines().filter(|l| l.contains(&key)) {
        assert!(l.contains(" DEBUG "), "the key only at debug level: {l}");
    }
    assert!(!logs.contains("sk_secret_1"), "nor the credential");

    // Older than an age: not yet, then once it is.
    let young = http
        .send(
            "GET",
            &gw.admin_url("/keys?state=in_progress&older_than=1h"),
            &[],
            "",
        )
        .await;
    assert_eq!(lines(&young.body).len(), 0);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let old = http
        .send(
            "GET",
            &gw.admin_url("/keys?state=in_progress&older_than=1s"),
            &[],
            "",
        )
        .await;
    let old = lines(&old.body);
    assert_eq!(old.len(), 1, "{old:?}");
    assert_eq!(old[0]["scope"], digest.as_str());
    // The lease has lapsed: nobody finished it, nobody retried. The record kept why it
    // was left in progress, and is listed with that reason, not as merely orphaned.
    let ambiguous = http
        .send("GET", &gw.admin_url("/keys?ambiguous=true"), &[], "")
        .await;
    let ambiguous = lines(&ambiguous.body);
    assert_eq!(ambiguous.len(), 1, "{ambiguous:?}");
    assert_eq!(ambiguous[0]["ambiguous"], "upstream_timeout");

    // The retry takes it over as attempt 2: counted as a takeover, and listed so.
    let b = http
        .post(
            &gw.url("/v1/charges"),
            &key,
            "{}",
            &[("authorization", "Bearer sk_secret_1")],
        )
        .await;
    assert_eq!(b.status, 201, "{b:?}");
    let ambiguous = http
        .send(
            "GET",
            &gw.admin_url("/keys?ambiguous=true&state=completed"),
            &[],
            "",
        )
        .await;
    let ambiguous = lines(&ambiguous.body);
    assert_eq!(ambiguous.len(), 1, "{ambiguous:?}");
    assert_eq!(ambiguous[0]["ambiguous"], "takeover");
    assert_eq!(ambiguous[0]["attempt"], 2);
    assert_eq!(ambiguous[0]["status"], 201);
    let text = metrics(&http, &gw).await;
    assert_eq!(ambiguous_count(&text, "takeover"), Some(1), "{text}");
}

/// An answer over the response limit is recorded as a 502 marked `answer_too_large`:
/// listed as ambiguous with its status, counted once; its replay shows no mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_too_large_is_recorded_as_ambiguous() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--response-limit",
            "1KiB",
            "--admin",
            "0",
            "--admin-open",
        ],
    )
    .await;
    let http = Http::new();
    let key = new_key();
    let url = gw.url("/v1/exports");
    let a = http
        .post(&url, &key, "{}", &[("x-test-body-bytes", "4096")])
        .await;
    assert_eq!(a.status, 502);
    let replay = http.post(&url, &key, "{}", &[]).await;
    assert!(replay.replayed());
    assert!(
        replay
            .headers
            .keys()
            .all(|n| !n.as_str().contains("ambiguous"))
    );
    http.post(&url, &new_key(), "{}", &[]).await;

    let listed = http
        .send("GET", &gw.admin_url("/keys?ambiguous=true"), &[], "")
        .await;
    let records = lines(&listed.body);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["ambiguous"], "answer_too_large");
    assert_eq!(records[0]["status"], 502);
    let text = metrics(&http, &gw).await;
    assert_eq!(
        ambiguous_count(&text, "answer_too_large"),
        Some(1),
        "{text}"
    );
}

/// A listing pages: every record once across pages of `limit`, each page naming the
/// next in `Idem-Next-Cursor`, the last none. Parameters it cannot use are 400
/// problems that say which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_and_refuses_bad_parameters() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "0", "--admin-open"],
    )
    .await;
    let http = Http::new();
    let keys: HashSet<String> = (0..5).map(|_| new_key()).collect();
    for key in &keys {
        http.post(&gw.url("/v1/charges"), key, "{}", &[]).await;
    }
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(c) => format!("/keys?limit=2&after={c}"),
            None => "/keys?limit=2".to_owned(),
        };
        let page = http.send("GET", &gw.admin_url(&path), &[], "").await;
        assert_eq!(page.status, 200, "{page:?}");
        let records = lines(&page.body);
        assert!(records.len() <= 2);
        seen.extend(
            records
                .iter()
                .map(|r| r["key"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        match page.header("idem-next-cursor") {
            Some(c) => after = Some(c.to_owned()),
            None => break,
        }
        assert!(pages < 10);
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 5);
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), keys);

    for (query, says) in [
        ("state=done", "in_progress or completed"),
        ("older_than=soon", "older_than"),
        ("limit=0", "from 1 to 1000"),
        ("limit=5000", "from 1 to 1000"),
        ("after=zz", "cursor"),
        ("ambiguous=maybe", "true or false"),
        ("olderthan=5m", "unknown parameter"),
    ] {
        let a = http
            .send("GET", &gw.admin_url(&format!("/keys?{query}")), &[], "")
            .await;
        assert_eq!(a.status, 400, "{query}");
        assert_eq!(
            a.problem_type(),
            "https://idem.dev/problems/bad-listing",
            "{query}"
        );
        let detail = a.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(says), "{query}: {detail}");
    }
    // One key's record is still shown as before.
    let key = keys.iter().next().unwrap();
    let show = http
        .send(
            "GET",
            &gw.admin_url(&format!("/keys?key={key}&endpoint=POST%20/v1/charges")),
            &[],
            "",
        )
        .await;
    assert_eq!(show.status, 200);
    assert_eq!(show.json()["record"]["state"], "completed");
}

/// `idem keys list` reads the store and prints JSON lines, as many as `--limit`, and
/// says where to resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_list_prints_json_lines() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "sqlite://idem.db"]).await;
    let http = Http::new();
    let keys: HashSet<String> = (0..3).map(|_| new_key()).collect();
    for key in &keys {
        http.post(&gw.url("/v1/charges"), key, "{}", &[]).await;
    }
    gw.terminate().await;

    let run = |args: &[&str]| {
        std::process::Command::new(binary())
            .args(["keys", "list", "--store", "sqlite://idem.db"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let all = run(&["--state", "completed"]);
    assert!(all.status.success(), "{all:?}");
    let printed = lines(&all.stdout);
    let listed: HashSet<String> = printed
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, keys, "{printed:?}");
    assert!(
        printed
            .iter()
            .all(|r| r["status"] == 201 && r["ambiguous"].is_null())
    );

    let one = run(&["--state", "completed", "--limit", "1"]);
    assert!(one.status.success(), "{one:?}");
    assert_eq!(lines(&one.stdout).len(), 1);
    assert!(
        String::from_utf8_lossy(&one.stderr).contains("--after"),
        "{one:?}"
    );

    let bad = run(&["--older-than", "soon"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}
