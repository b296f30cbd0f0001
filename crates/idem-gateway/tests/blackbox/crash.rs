//! Crashes and hang-ups (SPEC S7): records survive kill -9 on SQLite, a dead attempt's
//! key is taken over as attempt 2 once its lease lapses, and a client that goes away
//! does not cancel the upstream call.

use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, new_key, over_both_protocols, send_and_hang_up};

const SQLITE: [&str; 2] = ["--store", "sqlite://idem.db"];

over_both_protocols! {
async fn kill_9_after_completion_then_restart_replays(proto: Proto) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = Http::speaking(proto);
    let key = new_key();
    let gw = Gateway::start(&up.url(), dir.path(), &SQLITE).await;
    let first = http
        .post(&gw.url("/v1/charges"), &key, r#"{"amount":1}"#, &[])
        .await;
    assert_eq!(first.status, 201);
    gw.kill9().await;

    let gw = Gateway::start(&up.url(), dir.path(), &SQLITE).await;
    let retry = http
        .post(&gw.url("/v1/charges"), &key, r#"{"amount":1}"#, &[])
        .await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.header("location"), first.header("location"));
    assert_eq!(up.started(&key), 1);
}
}

over_both_protocols! {
async fn kill_9_in_flight_is_409_until_the_lease_lapses_then_attempt_2_takes_over(proto: Proto) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = Http::speaking(proto);
    let key = new_key();
    // The lease outlives a restart of the gateway on a loaded machine, so the first
    // request after it still finds the dead attempt's lease alive.
    let args = ["--store", "sqlite://idem.db", "--lease", "6s"];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let url = gw.url("/v1/charges");
    let doomed = {
        let (http, url, key) = (http.clone(), url.clone(), key.clone());
        tokio::spawn(async move {
            // The gateway dies under this request; the client sees the connection drop.
            let _ = tokio::time::timeout(
                Duration::from_secs(10),
                http.post(&url, &key, "{}", &[("x-test-delay-ms", "1000")]),
            )
            .await;
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while up.started(&key) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.started(&key), 1);
    gw.kill9().await;
    let _ = doomed.await;

    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let url = gw.url("/v1/charges");
    let blocked = http.post(&url, &key, "{}", &[]).await;
    assert_eq!(
        blocked.status, 409,
        "the dead attempt's lease is still alive: {blocked:?}"
    );
    assert!(blocked.header("retry-after").is_some());

    let taken_over = http.post_once_the_lease_lapses(&url, &key).await;
    assert_eq!(taken_over.status, 201, "{taken_over:?}");
    assert!(!taken_over.replayed());
    assert_eq!(taken_over.json()["attempt"], "2");
    let seen = up.seen();
    let attempts: Vec<_> = seen
        .iter()
        .filter(|s| {
            s.headers
                .get("idempotency-key")
                .is_some_and(|k| k == key.as_str())
        })
        .map(|s| {
            s.headers["idempotency-attempt"]
                .to_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(attempts, ["1", "2"]);
    // And attempt 2's answer is the one replayed from now on.
    let replay = http.post(&url, &key, "{}", &[]).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken_over.body);
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_does_not_cancel_the_upstream_call() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &SQLITE).await;
    let http = Http::new();
    let key = new_key();
    let body = r#"{"amount":7}"#;
    let raw = format!(
        "POST /v1/charges HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         idempotency-key: {key}\r\nx-test-delay-ms: 700\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    send_and_hang_up(gw.addr, &raw, Duration::from_millis(150)).await;
    assert!(
        up.wait_finished(&key, 1, Duration::from_secs(10)).await,
        "the upstream call ran to completion"
    );
    // The result is recorded: poll briefly for the record's completion, then replay.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let retry = loop {
        let a = http.post(&gw.url("/v1/charges"), &key, body, &[]).await;
        if a.status != 409 || tokio::time::Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(up.started(&key), 1, "executed exactly once");
}
