//! The access log and the request id (issue 37 §2): one JSON line per request at the
//! default level with the documented fields, and the request id from the client (or
//! made) through to the upstream, the answer, the problem body and the line.

use std::time::Duration;

use serde_json::Value;

use crate::common::{Gateway, Http, Upstream, check_config, new_key};

/// The access log's lines in `logs` (JSON, one object per line), in order.
fn access_lines(logs: &str) -> Vec<Value> {
    logs.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "idem::access")
        .collect()
}

/// Waits (bounded) until the gateway has written `n` access lines: each is written
/// once its answer's body has been sent, which may be just after the client read it.
async fn lines(gw: &Gateway, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let lines = access_lines(&gw.logs());
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("fewer than {n} access lines:\n{}", gw.logs());
}

async fn json_gateway(up: &Upstream, dir: &std::path::Path, extra: &[&str]) -> Gateway {
    // The default level (info), as an operator runs it.
    Gateway::start_with_env(
        &up.url(),
        dir,
        extra,
        &[("IDEM_LOG", "info"), ("IDEM_LOG_FORMAT", "json")],
    )
    .await
}

#[tokio::test]
async fn every_request_has_one_json_line_with_the_documented_fields() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let toml = "[[route]]\nmethod = \"POST\"\npath = \"/v1/charges/{id}/capture\"\n";
    std::fs::write(dir.path().join("idem.toml"), toml).unwrap();
    let gw = json_gateway(&up, dir.path(), &["--config", "idem.toml"]).await;
    let http = Http::new();
    let key = new_key();
    let url = gw.url("/v1/charges/ch_1/capture");
    let first = http
        .post(
            &url,
            &key,
            "{\"amount\":1}",
            &[("x-request-id", "req-abc.1")],
        )
        .await;
    assert_eq!(first.status, 201);
    let replay = http.post(&url, &key, "{\"amount\":1}", &[]).await;
    assert!(replay.replayed());
    let reused = http.post(&url, &key, "{\"amount\":2}", &[]).await;
    assert_eq!(reused.status, 422);
    let read = http.send("GET", &gw.url("/v1/charges"), &[], "").await;
    assert_eq!(read.status, 201);

    let lines = lines(&gw, 4).await;
    assert_eq!(lines.len(), 4, "one line a request: {lines:#?}");
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["executed", "replayed", "mismatch", "passed_through"]
    );
    let executed = &lines[0];
    assert_eq!(executed["level"], "INFO");
    assert!(executed["timestamp"].is_string(), "{executed}");
    assert_eq!(executed["method"], "POST");
    assert_eq!(executed["path"], "/v1/charges/ch_1/capture");
    assert_eq!(executed["route"], "/v1/charges/{id}/capture");
    assert_eq!(executed["status"], 201);
    assert_eq!(executed["attempt"], 1);
    assert_eq!(executed["request_id"], "req-abc.1");
    assert_eq!(executed["completed"], true);
    assert!(
        executed["client"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{executed}"
    );
    assert_eq!(executed["bytes"].as_u64(), Some(first.body.len() as u64));
    let upstream_ms = executed["upstream_ms"].as_f64().expect("upstream time");
    let duration_ms = executed["duration_ms"].as_f64().expect("total time");
    assert!(
        upstream_ms >= 0.0 && upstream_ms <= duration_ms,
        "{executed}"
    );
    // The scope by its digest: the key and the credential never appear.
    let scope = executed["scope"].as_str().unwrap();
    assert_eq!(scope.len(), 64);
    assert_eq!(lines[1]["scope"], scope, "the replay names the same record");
    assert!(
        lines[1]["upstream_ms"].is_null(),
        "a replay never went upstream"
    );
    assert!(lines[1]["attempt"].is_null());
    assert_eq!(lines[3]["route"], Value::Null);
    assert!(lines[3]["scope"].is_null());
    let logs = gw.logs();
    assert!(!logs.contains(&key), "the raw key is never logged");
    // The listen address is in a log line too.
    assert!(
        logs.contains(&gw.addr.to_string()) && logs.contains("\"listening\""),
        "{logs}"
    );
}

#[tokio::test]
async fn the_request_id_reaches_the_upstream_the_answer_and_the_problem() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = json_gateway(&up, dir.path(), &[]).await;
    let http = Http::new();
    let key = new_key();
    let url = gw.url("/v1/charges");

    // A well-formed id of the client's is kept, upstream and back.
    let given = http
        .post(&url, &key, "{}", &[("x-request-id", "client-id-1")])
        .await;
    assert_eq!(given.header("x-request-id"), Some("client-id-1"));
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0]
            .headers
            .get_all("x-request-id")
            .iter()
            .collect::<Vec<_>>(),
        ["client-id-1"]
    );

    // A malformed one is replaced by one of the gateway's, everywhere.
    let other = new_key();
    let made = http
        .post(
            &url,
            &other,
            "{}",
            &[("x-request-id", "bad id; with spaces")],
        )
        .await;
    let id = made.header("x-request-id").expect("an id").to_owned();
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        up.seen()[1].headers.get("x-request-id").unwrap(),
        id.as_str()
    );

    // The gateway's own problem carries it too.
    let reused = http.post(&url, &key, "{\"other\":1}", &[]).await;
    assert_eq!(reused.status, 422);
    let problem_id = reused.header("x-request-id").expect("an id").to_owned();
    assert_eq!(reused.json()["request_id"], problem_id.as_str());
    assert_eq!(up.total(), 2, "the 422 never went upstream");

    let lines = lines(&gw, 3).await;
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["client-id-1", id.as_str(), problem_id.as_str()]);
}

#[tokio::test]
async fn the_access_log_can_be_turned_off_and_its_header_renamed() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = json_gateway(
        &up,
        dir.path(),
        &[
            "--access-log",
            "off",
            "--request-id-header",
            "X-Correlation-Id",
        ],
    )
    .await;
    let http = Http::new();
    let answer = http
        .post(
            &gw.url("/v1/charges"),
            &new_key(),
            "{}",
            &[("x-correlation-id", "corr-9")],
        )
        .await;
    assert_eq!(answer.header("x-correlation-id"), Some("corr-9"));
    assert_eq!(
        up.seen()[0].headers.get("x-correlation-id").unwrap(),
        "corr-9"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(access_lines(&gw.logs()).is_empty(), "{}", gw.logs());
}

#[tokio::test]
async fn a_bad_access_log_setting_stops_the_start() {
    let out = check_config(&["--access-log", "sometimes"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("access_log"), "{err}");
    let out = check_config(&["--request-id-header", "authorization"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("request_id_header"));
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_client_is_the_address_it_forwarded_for() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = Http::new();
    // What the client claims (6.6.6.6), then what the ingress saw (198.51.100.7).
    let claims = [("x-forwarded-for", "6.6.6.6, 198.51.100.7")];

    // The test's connections come from 127.0.0.1: trusted.
    let trusting = json_gateway(
        &up,
        dir.path(),
        &["--trusted-proxies", "10.0.0.0/8, 127.0.0.1"],
    )
    .await;
    let answer = http
        .post(&trusting.url("/v1/charges"), &new_key(), "{}", &claims)
        .await;
    assert_eq!(answer.status, 201);
    let line = &lines(&trusting, 1).await[0];
    assert_eq!(line["client"], "198.51.100.7", "{line}");
    let peer = line["peer"].as_str().unwrap();
    assert!(peer.starts_with("127.0.0.1:"), "{line}");
    // The header is forwarded as before, with the gateway's hop appended.
    assert_eq!(
        up.seen()[0].headers["x-forwarded-for"],
        "6.6.6.6, 198.51.100.7, 127.0.0.1"
    );

    // Trusting another network only, the same request's client is its peer.
    let dir = tempfile::tempdir().unwrap();
    let other = json_gateway(&up, dir.path(), &["--trusted-proxies", "10.0.0.0/8"]).await;
    let answer = http
        .post(&other.url("/v1/charges"), &new_key(), "{}", &claims)
        .await;
    assert_eq!(answer.status, 201);
    let line = &lines(&other, 1).await[0];
    assert_eq!(line["client"], line["peer"], "{line}");
    assert!(line["client"].as_str().unwrap().starts_with("127.0.0.1:"));
}

#[tokio::test]
async fn a_trusted_proxies_typo_stops_the_start_and_check_config_prints_the_list() {
    let check = |list: &str| check_config(&["--trusted-proxies", list]);
    let out = check("10.0.0.1/8");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trusted_proxies") && err.contains("10.0.0.0/8"),
        "{err}"
    );
    let out = check("ingress.internal");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trusted_proxies"));
    let out = check("10.0.0.0/8,::1");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(r#"trusted_proxies = ["10.0.0.0/8", "::1/128"]"#),
        "{text}"
    );
}
