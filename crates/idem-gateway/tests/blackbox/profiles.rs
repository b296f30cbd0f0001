//! Profiles at the gateway: each client is answered in its protocol's dialect. Stripe's
//! own Python SDK (from `IDEM_TEST_STRIPE_PYTHONPATH`, which `.ci/run` fills; without
//! it the SDK test skips loudly, and fails under `IDEM_REQUIRE_SERVICES=1`) raises its
//! `IdempotencyError` on the `stripe` profile's answer to a reused key; ACP's and UCP's
//! published shapes are asserted as they are written, and a route's profile wins over
//! the gateway's.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Answer, Gateway, Http, Upstream, check_config, new_key};

const JSON: (&str, &str) = ("content-type", "application/json");

async fn post(http: &Http, gw: &Gateway, key: Option<&str>, body: &str) -> Answer {
    let mut headers = vec![JSON];
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    http.send("POST", &gw.url("/v1/orders"), &headers, body.to_owned())
        .await
}

/// A key reused with another payload, a duplicate of a request in progress, a missing
/// key and a malformed one, answered under `profile`.
struct Refusals {
    reused: Answer,
    in_progress: Answer,
    missing: Answer,
    malformed: Answer,
    /// The first request's answer, for its headers.
    first: Answer,
}

async fn refusals(profile: &str) -> (Upstream, Refusals) {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--profile", profile, "--require-key"],
    )
    .await;
    let http = Http::new();
    let key = new_key();
    let first = post(&http, &gw, Some(&key), r#"{"amount": 100}"#).await;
    assert_eq!(first.status, 201, "{profile}: the first request executes");
    let reused = post(&http, &gw, Some(&key), r#"{"amount": 999}"#).await;

    let slow = new_key();
    let holder = {
        let (http, url, slow) = (Http::new(), gw.url("/v1/orders"), slow.clone());
        tokio::spawn(async move {
            let headers = [
                JSON,
                ("idempotency-key", &slow),
                ("x-test-delay-ms", "1500"),
            ];
            http.send("POST", &url, &headers, "{}").await
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
    let in_progress = post(&http, &gw, Some(&slow), "{}").await;
    assert_eq!(holder.await.unwrap().status, 201);

    let missing = post(&http, &gw, None, "{}").await;
    let malformed = post(&http, &gw, Some(&"k".repeat(300)), "{}").await;
    assert_eq!(
        up.started(&key),
        1,
        "{profile}: the reused key never reached the upstream"
    );
    assert_eq!(up.started(&slow), 1, "{profile}: the duplicate never ran");
    let refusals = Refusals {
        reused,
        in_progress,
        missing,
        malformed,
        first,
    };
    (up, refusals)
}

fn content_type(a: &Answer) -> &str {
    a.header("content-type").unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn ietf_is_the_default_and_answers_with_problem_details() {
    let (_up, r) = refusals("ietf").await;
    assert_eq!(r.reused.status, 422);
    assert_eq!(content_type(&r.reused), "application/problem+json");
    assert_eq!(
        r.reused.json()["type"],
        "https://idem.dev/problems/key-reused"
    );
    assert_eq!(r.in_progress.status, 409);
    assert!(r.in_progress.header("retry-after").is_some());
    assert_eq!(r.missing.status, 400);
    assert_eq!(
        r.missing.json()["type"],
        "https://idem.dev/problems/missing-key"
    );
    assert_eq!(r.malformed.status, 400);
    assert_eq!(
        r.malformed.json()["type"],
        "https://idem.dev/problems/invalid-key"
    );
    assert!(
        r.first.header("idempotency-key").is_none(),
        "no echo outside ACP"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stripe_answers_in_stripes_error_envelope() {
    let (_up, r) = refusals("stripe").await;
    assert_eq!(r.reused.status, 400);
    assert_eq!(content_type(&r.reused), "application/json");
    let error = &r.reused.json()["error"];
    assert_eq!(error["type"], "idempotency_error");
    assert!(
        error["message"].as_str().unwrap().contains("different"),
        "{error}"
    );
    assert_eq!(error["doc_url"], "https://idem.dev/problems/key-reused");
    assert_eq!(r.in_progress.status, 409);
    assert!(r.in_progress.header("retry-after").is_some());
    let error = &r.in_progress.json()["error"];
    assert_eq!(error["type"], "idempotency_error");
    assert_eq!(error["code"], "idempotency_key_in_use");
    for a in [&r.missing, &r.malformed] {
        assert_eq!(a.status, 400);
        assert_eq!(a.json()["error"]["type"], "invalid_request_error");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn acp_answers_with_its_codes_and_echoes_the_key() {
    let (_up, r) = refusals("acp").await;
    let expect = [
        (&r.reused, 422, "idempotency_conflict"),
        (&r.in_progress, 409, "idempotency_in_flight"),
        (&r.missing, 400, "idempotency_key_required"),
        (&r.malformed, 400, "idempotency_key_invalid"),
    ];
    for (answer, status, code) in expect {
        assert_eq!(answer.status, status, "{code}");
        assert_eq!(content_type(answer), "application/json");
        let body = answer.json();
        assert_eq!(body["type"], "invalid_request", "{body}");
        assert_eq!(body["code"], code, "{body}");
        assert!(body["message"].is_string());
    }
    assert!(r.in_progress.header("retry-after").is_some());
    let key = r
        .first
        .header("idempotency-key")
        .expect("ACP echoes the key");
    assert_eq!(
        r.reused.header("idempotency-key"),
        Some(key),
        "on refusals too"
    );
    assert!(r.missing.header("idempotency-key").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn ucp_answers_a_reused_key_with_409() {
    let (_up, r) = refusals("ucp").await;
    assert_eq!(r.reused.status, 409);
    let body = r.reused.json();
    assert_eq!(body["code"], "idempotency_conflict");
    assert!(body["content"].is_string());
    assert_eq!(r.in_progress.status, 409);
    assert_eq!(r.in_progress.json()["code"], "idempotency_in_flight");
    assert_eq!(r.missing.status, 400);
    assert_eq!(r.missing.json()["code"], "idempotency_key_required");
}

/// A route's profile wins over the gateway's; the gateway's own answers outside the
/// layer (an invalid path, an unreachable upstream) are written in the gateway's.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_names_its_own_profile_and_the_gateways_own_answers_follow_the_global_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "profile = \"stripe\"\n\n[[route]]\npath = \"/ucp/{*rest}\"\nprofile = \"ucp\"\n",
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
    for (path, status) in [("/ucp/checkout-sessions", 409), ("/v1/charges", 400)] {
        let key = new_key();
        let headers = [JSON, ("idempotency-key", key.as_str())];
        let url = gw.url(path);
        assert_eq!(
            http.send("POST", &url, &headers, "{\"a\":1}").await.status,
            201
        );
        let reused = http.send("POST", &url, &headers, "{\"a\":2}").await;
        assert_eq!(reused.status, status, "{path}");
    }

    let invalid = http.send("POST", &gw.url("/v1/%zz"), &[JSON], "{}").await;
    assert_eq!(invalid.status, 400);
    assert_eq!(content_type(&invalid), "application/json");
    assert_eq!(invalid.json()["error"]["type"], "invalid_request_error");
    assert_eq!(
        invalid.json()["error"]["doc_url"],
        "https://idem.dev/problems/invalid-path"
    );

    // No upstream: a keyed request's 502 comes from the layer, an unkeyed one's from
    // the proxy outside it; both in Stripe's envelope.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("http://127.0.0.1:{port}");
    let gw = Gateway::start(&dead, dir.path(), &["--profile", "stripe"]).await;
    let key = new_key();
    for headers in [vec![JSON, ("idempotency-key", key.as_str())], vec![JSON]] {
        let a = http
            .send("POST", &gw.url("/v1/charges"), &headers, "{}")
            .await;
        assert_eq!(a.status, 502, "{:?}", String::from_utf8_lossy(&a.body));
        let error = &a.json()["error"];
        assert_eq!(error["type"], "api_error");
        assert_eq!(
            error["doc_url"],
            "https://idem.dev/problems/upstream-unreachable"
        );
    }
}

/// An expired key whose tombstone remains, under each profile's status.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_key_is_refused_in_each_dialect() {
    for (profile, status) in [("stripe", 400), ("acp", 422), ("ucp", 409), ("ietf", 410)] {
        let dir = tempfile::tempdir().unwrap();
        let up = Upstream::start().await;
        let args = [
            "--profile",
            profile,
            "--store",
            "sqlite://idem.db",
            "--ttl",
            "1s",
            "--tombstone-ttl",
            "1h",
        ];
        let gw = Gateway::start(&up.url(), dir.path(), &args).await;
        let http = Http::new();
        let key = new_key();
        assert_eq!(post(&http, &gw, Some(&key), "{}").await.status, 201);
        let started = Instant::now();
        let expired = loop {
            let a = post(&http, &gw, Some(&key), "{}").await;
            if a.status != 201 {
                break a;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{profile}: the record expires"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(expired.status, status, "{profile}");
        let body: Value = expired.json();
        let completed = match profile {
            "stripe" => {
                assert_eq!(body["error"]["type"], "idempotency_error");
                &body["error"]["completed_status"]
            }
            "acp" | "ucp" => {
                assert_eq!(body["code"], "idempotency_key_expired");
                &body["completed_status"]
            }
            _ => &body["completed_status"],
        };
        assert_eq!(completed, 201, "{profile}: {body}");
        assert_eq!(up.started(&key), 1, "{profile}: never executed again");
    }
}

/// Stripe's Python SDK, pointed at the gateway: a retry replays (one execution), and a
/// key reused with other parameters raises the SDK's own `IdempotencyError`.
#[tokio::test(flavor = "multi_thread")]
async fn stripes_python_sdk_raises_its_idempotency_error() {
    let path = std::env::var("IDEM_TEST_STRIPE_PYTHONPATH").unwrap_or_default();
    let probe = tokio::process::Command::new("python3")
        .env("PYTHONPATH", &path)
        .args(["-c", "import stripe"])
        .output()
        .await;
    match probe {
        Ok(out) if out.status.success() => {}
        other => {
            let error = match other {
                Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                Err(e) => e.to_string(),
            };
            idem_test_support::service_unavailable::<()>(
                "python3 with the stripe SDK",
                &format!("IDEM_TEST_STRIPE_PYTHONPATH={path}"),
                &error,
            );
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), dir.path(), &["--profile", "stripe"]).await;
    let key = new_key();
    let script = r#"
import json, sys
import stripe
stripe.api_key = "sk_test_idem"
stripe.api_base = sys.argv[1]
stripe.max_network_retries = 0
key = sys.argv[2]
first = stripe.Customer.create(description="first", idempotency_key=key)
again = stripe.Customer.create(description="first", idempotency_key=key)
out = {"first": first["n"], "again": again["n"]}
try:
    stripe.Customer.create(description="changed", idempotency_key=key)
    out["reused"] = "no error"
except stripe.IdempotencyError as e:
    out["reused"] = {"error": "IdempotencyError", "status": e.http_status}
except stripe.StripeError as e:
    out["reused"] = {"error": type(e).__name__, "status": e.http_status}
print(json.dumps(out))
"#;
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .env("PYTHONPATH", &path)
            .args(["-c", script, &gw.url(""), &key])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK script ends within 60 s")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["first"], result["again"],
        "the retry replayed: {result}"
    );
    assert_eq!(
        result["reused"],
        serde_json::json!({"error": "IdempotencyError", "status": 400}),
        "{result}"
    );
    assert_eq!(up.started(&key), 1, "one execution for three calls");
}

/// Profiles and scope modes are spelt as the settings page lists them, on the command
/// line and in the file (a route's too), and anything else is refused with the choices.
#[test]
fn profiles_and_scopes_are_spelt_exactly_and_refused_with_the_choices() {
    let text = |out: &std::process::Output| {
        let stdout = String::from_utf8_lossy(&out.stdout);
        format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))
    };
    let ok = check_config(&["--profile", "ucp", "--scope", "internal"]);
    let printed = text(&ok);
    assert!(ok.status.success(), "{printed}");
    assert!(printed.contains("profile = \"ucp\"\n"), "{printed}");
    assert!(printed.contains("scope = \"internal\"\n"), "{printed}");

    let bad = check_config(&["--profile", "Stripe"]);
    let said = text(&bad);
    assert_eq!(bad.status.code(), Some(2), "{said}");
    assert!(
        said.contains("invalid value 'Stripe' for '--profile <PROFILE>'"),
        "{said}"
    );
    assert!(
        said.contains("[possible values: ietf, stripe, acp, ucp, mcp]"),
        "{said}"
    );
    let bad = check_config(&["--scope", "everywhere"]);
    assert!(text(&bad).contains("[possible values: public, internal]"));

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(&config, "[[route]]\npath = \"/a\"\nprofile = \"paypal\"\n").unwrap();
    let bad = check_config(&["--config", config.to_str().unwrap()]);
    let said = text(&bad);
    assert_eq!(bad.status.code(), Some(2), "{said}");
    let refusal = "unknown variant `paypal`, expected one of `ietf`, `stripe`, `acp`, `ucp`, `mcp`";
    assert!(said.contains(refusal), "{said}");
}
