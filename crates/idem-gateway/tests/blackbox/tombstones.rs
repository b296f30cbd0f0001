//! SPEC S16 at the gateway: with `--tombstone-ttl`, a retry after the record's TTL gets
//! 410 `key-expired` and never reaches the upstream, another payload still 422; the
//! sweeper compacts the record into its tombstone; a route may turn them off.

use std::time::{Duration, Instant};

use crate::common::{Gateway, Http, Proto, Upstream, new_key, over_both_protocols};

/// A gateway on the SQLite store whose records live one second and whose tombstones an
/// hour, swept every 100 ms, with `extra` arguments; its upstream; a client speaking
/// `proto`.
async fn start(proto: Proto, dir: &tempfile::TempDir, extra: &[&str]) -> (Upstream, Gateway, Http) {
    let up = Upstream::start().await;
    let mut args = vec![
        "--store",
        "sqlite://idem.db",
        "--ttl",
        "1s",
        "--tombstone-ttl",
        "1h",
        "--sweep-interval",
        "100ms",
        "--admin",
        "0",
        // The record is read from /keys; no token on a test bench.
        "--admin-open",
    ];
    args.extend_from_slice(extra);
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    (up, gw, Http::speaking(proto))
}

/// The admin listener's view of `key`'s record on `path`, once `ready` holds of it
/// (within ten seconds).
async fn record_once(
    http: &Http,
    gw: &Gateway,
    key: &str,
    path: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let show = gw.admin_url(&format!("/keys?key={key}&endpoint=POST%20{path}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = http.send("GET", &show, &[], "").await;
        if answer.status == 200 {
            let record = answer.json();
            if ready(&record) {
                return record;
            }
            assert!(Instant::now() < deadline, "never ready: {record}");
        } else {
            assert!(Instant::now() < deadline, "{answer:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

over_both_protocols! {
async fn a_retry_after_expiry_is_410_and_never_executes_again(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let (up, gw, http) = start(proto, &dir, &[]).await;
    let key = new_key();
    let url = gw.url("/v1/charges");
    let first = http.post(&url, &key, r#"{"amount":100}"#, &[]).await;
    assert_eq!(first.status, 201, "{first:?}");

    // The sweeper compacts the expired record into its tombstone: no answer is kept.
    let record = record_once(&http, &gw, &key, "/v1/charges", |r| {
        r["record"]["state"] == "tombstone"
    })
    .await;
    assert_eq!(record["record"]["status"], 201, "{record}");
    assert!(record["record"].get("response").is_none(), "{record}");

    let retry = http.post(&url, &key, r#"{"amount":100}"#, &[]).await;
    assert_eq!(retry.status, 410, "{retry:?}");
    assert_eq!(
        retry.problem_type(),
        "https://idem.dev/problems/key-expired"
    );
    assert_eq!(retry.header("content-type"), Some("application/problem+json"));
    let problem = retry.json();
    assert_eq!(problem["completed_status"], 201);
    assert_eq!(problem["completed_at"], record["record"]["completed_at"]["utc"]);
    assert!(!retry.replayed());
    // Another payload with the key is still a client bug, not a retry.
    let other = http.post(&url, &key, r#"{"amount":999}"#, &[]).await;
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(up.started(&key), 1, "the upstream ran once, and never again");
}
}

/// A route's `tombstone_ttl = "0s"` keeps none: there a retry after the TTL executes
/// again, as without the option, while other routes keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_may_keep_no_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("idem.toml"),
        "[[route]]\npath = \"/v1/carts/{*rest}\"\ntombstone_ttl = \"0s\"\n",
    )
    .unwrap();
    let (up, gw, http) = start(Proto::Http1, &dir, &["--config", "idem.toml"]).await;
    let (cart, charge) = (new_key(), new_key());
    let cart_url = gw.url("/v1/carts/1/items");
    assert_eq!(http.post(&cart_url, &cart, "{}", &[]).await.status, 201);
    assert_eq!(
        http.post(&gw.url("/v1/charges"), &charge, "{}", &[])
            .await
            .status,
        201
    );
    record_once(&http, &gw, &charge, "/v1/charges", |r| {
        r["record"]["state"] == "tombstone"
    })
    .await;
    // The cart's expired record was purged, not kept.
    let show = gw.admin_url(&format!(
        "/keys?key={cart}&endpoint=POST%20/v1/carts/%7B*rest%7D"
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while http.send("GET", &show, &[], "").await.status != 404 {
        assert!(
            Instant::now() < deadline,
            "the cart's record was never purged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = http.post(&cart_url, &cart, "{}", &[]).await;
    assert_eq!(again.status, 201, "{again:?}");
    assert!(!again.replayed());
    assert_eq!(
        up.started(&cart),
        2,
        "no tombstone on this route: it executed again"
    );
    assert_eq!(
        http.post(&gw.url("/v1/charges"), &charge, "{}", &[])
            .await
            .status,
        410
    );
    assert_eq!(up.started(&charge), 1);
}
