//! SPEC S23: what each profile does with a key. Under `acp` an
//! upstream 5xx is released, so its retry reaches the upstream afresh, while an outcome
//! the gateway could not observe (a timeout) keeps its lease; `ietf`, `stripe` and `ucp`
//! record the 5xx; a `release_statuses` of the route's or the gateway's wins over the
//! profile, `check-config` prints each route's effective list and warns where one
//! contradicts its profile. Every answer to a keyed request says where the operation
//! stands, in the `Idempotency-Operation-State` header and, in a problem, in the
//! dialect's error object. Each row of the guide's table "What each profile does with a
//! key" is asserted here.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Answer, Gateway, Http, Upstream, check_config, new_key};

const STATE: &str = "idempotency-operation-state";

/// The answer's `Idempotency-Operation-State`.
fn state(a: &Answer) -> &str {
    a.header(STATE)
        .unwrap_or_else(|| panic!("no {STATE}: {a:?}"))
}

/// The member `operation_state` of a problem in `profile`'s dialect.
fn state_member(profile: &str, a: &Answer) -> Value {
    let body = a.json();
    match profile {
        "stripe" => body["error"]["operation_state"].clone(),
        _ => body["operation_state"].clone(),
    }
}

async fn post(http: &Http, gw: &Gateway, key: &str, extra: &[(&str, &str)]) -> Answer {
    http.post(&gw.url("/v1/orders"), key, "{\"amount\":100}", extra)
        .await
}

/// Under `acp` an upstream 500 is passed on unrecorded: the retry with the same key
/// reaches the upstream again (as attempt 1: the record was deleted) and its answer is
/// the one recorded. The 500 says `unknown`, since the upstream may have acted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_releases_an_upstream_500_and_its_retry_reaches_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), dir.path(), &["--profile", "acp"]).await;
    let http = Http::new();
    let key = new_key();
    let failed = post(&http, &gw, &key, &[("x-test-status", "500")]).await;
    assert_eq!(failed.status, 500);
    assert!(!failed.replayed());
    assert_eq!(state(&failed), "unknown");
    let retried = post(&http, &gw, &key, &[]).await;
    assert_eq!(retried.status, 201, "the retry executed afresh");
    assert!(!retried.replayed());
    assert_eq!(state(&retried), "completed");
    assert_eq!(
        up.started(&key),
        2,
        "two executions: the 500 was not replayed"
    );
    let attempts: Vec<String> = up.executions(&key).into_iter().map(|e| e.attempt).collect();
    assert_eq!(
        attempts,
        ["1", "1"],
        "the upstream sees the same key, attempt 1"
    );
    let again = post(&http, &gw, &key, &[("x-test-status", "500")]).await;
    assert_eq!(again.status, 201);
    assert!(again.replayed(), "the 201 is recorded and replayed");
    assert_eq!(state(&again), "completed");
    assert_eq!(up.started(&key), 2);
}

/// `ietf` (the default), `stripe` and `ucp` record an upstream 500 (SPEC S6) and replay
/// it: one execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ietf_stripe_and_ucp_record_an_upstream_500() {
    for profile in ["ietf", "stripe", "ucp"] {
        let dir = tempfile::tempdir().unwrap();
        let up = Upstream::start().await;
        let gw = Gateway::start(&up.url(), dir.path(), &["--profile", profile]).await;
        let http = Http::new();
        let key = new_key();
        let failed = post(&http, &gw, &key, &[("x-test-status", "500")]).await;
        assert_eq!(failed.status, 500, "{profile}");
        assert_eq!(state(&failed), "completed", "{profile}");
        let retried = post(&http, &gw, &key, &[]).await;
        assert_eq!(retried.status, 500, "{profile}: replayed");
        assert!(retried.replayed(), "{profile}");
        assert_eq!(state(&retried), "completed", "{profile}");
        assert_eq!(up.started(&key), 1, "{profile}: one execution");
    }
}

/// POSTs under `key` with `extra` every 200 ms until the answer is not 409.
async fn once_the_lease_lapses(
    http: &Http,
    gw: &Gateway,
    key: &str,
    extra: &[(&str, &str)],
) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let a = post(http, gw, key, extra).await;
        if a.status != 409 {
            return a;
        }
        assert!(Instant::now() < deadline, "the lease never lapsed");
    }
}

/// Under every profile, `acp` too, an upstream that timed out after it got the request
/// is not executed again before the lease lapses: 504 `unknown`, then 409 `in_progress`;
/// once the lease lapses an attempt takes over as attempt 2, and, released again (a
/// 503), says `unknown`, since the first attempt may have acted. The states are in the
/// header and in each dialect's error object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_attempt_keeps_its_lease_under_every_profile() {
    for profile in ["acp", "ietf", "stripe", "ucp"] {
        let dir = tempfile::tempdir().unwrap();
        let up = Upstream::start().await;
        let args = [
            "--profile",
            profile,
            "--upstream-timeout",
            "300ms",
            "--lease",
            "1s",
        ];
        let gw = Gateway::start(&up.url(), dir.path(), &args).await;
        let http = Http::new();
        let key = new_key();
        let timed_out = post(&http, &gw, &key, &[("x-test-delay-ms", "3000")]).await;
        assert_eq!(timed_out.status, 504, "{profile}");
        assert_eq!(state(&timed_out), "unknown", "{profile}");
        assert_eq!(state_member(profile, &timed_out), "unknown", "{profile}");
        let busy = post(&http, &gw, &key, &[]).await;
        assert_eq!(busy.status, 409, "{profile}: not executed again yet");
        assert_eq!(state(&busy), "in_progress", "{profile}");
        assert_eq!(state_member(profile, &busy), "in_progress", "{profile}");
        assert_eq!(up.started(&key), 1, "{profile}");

        let took_over = once_the_lease_lapses(&http, &gw, &key, &[("x-test-status", "503")]).await;
        assert_eq!(took_over.status, 503, "{profile}");
        assert_eq!(
            state(&took_over),
            "unknown",
            "{profile}: the first attempt may have acted"
        );
        assert_eq!(up.started(&key), 2, "{profile}");
        let attempts: Vec<String> = up.executions(&key).into_iter().map(|e| e.attempt).collect();
        assert!(
            attempts.contains(&"2".to_owned()),
            "{profile}: {attempts:?}"
        );
    }
}

/// A `release_statuses` of the route's, or the gateway's, replaces the profile's: under
/// `acp` a route that lists only 409 records a 500, and so does every route where the
/// gateway's own list is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_list_given_wins_over_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "profile = \"acp\"\n\n[[route]]\npath = \"/v1/recorded\"\nrelease_statuses = [409]\n",
    )
    .unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let http = Http::new();
    for (path, executions) in [("/v1/recorded", 1), ("/v1/orders", 2)] {
        let key = new_key();
        let url = gw.url(path);
        let failed = http
            .post(&url, &key, "{}", &[("x-test-status", "500")])
            .await;
        assert_eq!(failed.status, 500, "{path}");
        let retried = http.post(&url, &key, "{}", &[]).await;
        assert_eq!(retried.replayed(), executions == 1, "{path}");
        assert_eq!(up.started(&key), executions, "{path}");
    }

    let args = ["--profile", "acp", "--release-statuses", "409,503"];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let key = new_key();
    let failed = post(&http, &gw, &key, &[("x-test-status", "500")]).await;
    assert_eq!(failed.status, 500);
    let retried = post(&http, &gw, &key, &[]).await;
    assert!(retried.replayed(), "the gateway's list wins over acp's");
    assert_eq!(up.started(&key), 1);
}

fn printed(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))
}

/// `check-config` prints each route's effective list (its own, else its profile's) and
/// warns where a route's list contradicts its profile: an `acp` route that records
/// 5xx, a `stripe` route that releases a 500.
#[test]
fn check_config_prints_each_routes_effective_list_and_warns_where_it_contradicts_its_profile() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        r#"
profile = "acp"

[[route]]
path = "/acp/default"

[[route]]
path = "/acp/none"
release_statuses = []

[[route]]
path = "/stripe/releases-500"
profile = "stripe"
release_statuses = [409, 500]

[[route]]
path = "/ietf/default"
profile = "ietf"
"#,
    )
    .unwrap();
    let out = check_config(&["--config", config.to_str().unwrap()]);
    let text = printed(&out);
    assert!(out.status.success(), "{text}");
    let acp: Vec<String> = [400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429]
        .into_iter()
        .chain(500..=599)
        .map(|c: u16| c.to_string())
        .collect();
    let acp = format!("release_statuses = [{}]\n", acp.join(", "));
    let ietf = "release_statuses = [400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429, 503]\n";
    let table = |path: &str| -> String {
        let start = text
            .find(&format!("path = \"{path}\""))
            .unwrap_or_else(|| panic!("no route {path}: {text}"));
        let end = text[start..].find("\n\n").map_or(text.len(), |e| start + e);
        text[start..end].to_owned()
    };
    assert!(table("/acp/default").contains(&acp), "{text}");
    assert!(
        table("/acp/none").contains("release_statuses = []\n"),
        "{text}"
    );
    assert!(
        table("/stripe/releases-500").contains("release_statuses = [409, 500]\n"),
        "{text}"
    );
    assert!(table("/ietf/default").contains(ietf), "{text}");
    assert!(
        text.contains("# release_statuses: each route's profile's"),
        "the global list is left to the profiles: {text}"
    );
    let warned = |path: &str, says: &str| {
        text.lines().any(|l| {
            l.contains(&format!("the route {path}'s release_statuses")) && l.contains(says)
        })
    };
    assert!(
        warned("/acp/none", "under the acp profile records an upstream 500"),
        "{text}"
    );
    assert!(
        warned(
            "/stripe/releases-500",
            "under the stripe profile releases an upstream 500"
        ),
        "{text}"
    );
    assert!(!text.contains("the route /acp/default'"), "{text}");
    assert!(!text.contains("the route /ietf/default'"), "{text}");
}

/// Where the operation stands, in each dialect: a missing key `not_started`, a first
/// answer and its replay `completed`, a key reused with another payload the state of the
/// operation it holds (`completed`), a duplicate of a request in progress `in_progress`;
/// in the header on every answer, and in the error object of every problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_says_where_the_operation_stands_in_each_dialect() {
    for profile in ["ietf", "stripe", "acp", "ucp"] {
        let dir = tempfile::tempdir().unwrap();
        let up = Upstream::start().await;
        let args = ["--profile", profile, "--require-key"];
        let gw = Gateway::start(&up.url(), dir.path(), &args).await;
        let http = Http::new();
        let url = gw.url("/v1/orders");

        let missing = http
            .send("POST", &url, &[("content-type", "application/json")], "{}")
            .await;
        assert_eq!(missing.status, 400, "{profile}");
        assert_eq!(state(&missing), "not_started", "{profile}");
        assert_eq!(state_member(profile, &missing), "not_started", "{profile}");

        let key = new_key();
        let first = http.post(&url, &key, "{\"a\":1}", &[]).await;
        assert_eq!(first.status, 201, "{profile}");
        assert_eq!(state(&first), "completed", "{profile}");
        let replay = http.post(&url, &key, "{\"a\":1}", &[]).await;
        assert!(replay.replayed(), "{profile}");
        assert_eq!(state(&replay), "completed", "{profile}");
        let reused = http.post(&url, &key, "{\"a\":2}", &[]).await;
        assert!(reused.status == 422 || reused.status == 400 || reused.status == 409);
        assert_eq!(state(&reused), "completed", "{profile}");
        assert_eq!(
            state_member(profile, &reused),
            "completed",
            "{profile}: {:?}",
            reused.json()
        );
        assert_eq!(up.started(&key), 1, "{profile}");

        let slow = new_key();
        let holder = {
            let (http, url, slow) = (http.clone(), url.clone(), slow.clone());
            tokio::spawn(async move {
                http.post(&url, &slow, "{}", &[("x-test-delay-ms", "1500")])
                    .await
            })
        };
        let started = Instant::now();
        while up.started(&slow) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the slow request arrives"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let busy = http.post(&url, &slow, "{}", &[]).await;
        assert_eq!(busy.status, 409, "{profile}");
        assert_eq!(state(&busy), "in_progress", "{profile}");
        assert_eq!(state_member(profile, &busy), "in_progress", "{profile}");
        let reused_busy = http.post(&url, &slow, "{\"other\":1}", &[]).await;
        assert_eq!(
            state(&reused_busy),
            "in_progress",
            "{profile}: the operation it holds runs"
        );
        let done = holder.await.unwrap();
        assert_eq!(done.status, 201);
        assert_eq!(state(&done), "completed");
    }
}
