//! The shared stores: two gateways on one PostgreSQL, Redis or MySQL store receive
//! duplicates of the same keys split between them, and each key executes exactly once
//! upstream; records survive a gateway's kill -9.

use std::sync::Arc;
use std::time::Duration;

use idem_test_support::services::{mysql_url, postgres_url, redis_url};
use idem_test_support::{Relay, service_addr, service_unavailable, url_via};

use crate::common::{Gateway, Http, Proto, Upstream, binary, new_key, over_both_protocols};

const KEYS: usize = 500;

/// The namespace these tests keep their records in, apart from any gateway a developer
/// runs on the same server.
const NAMESPACE: &str = "idem_blackbox";

/// A gateway's arguments for the shared store `url`: this file's namespace, and a short
/// TTL, so that what a run leaves behind goes (Redis deletes it by itself, a later
/// run's sweeper purges the PostgreSQL rows) instead of piling up run after run.
pub fn on_shared<'a>(url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--store",
        url,
        "--store-namespace",
        NAMESPACE,
        "--ttl",
        "2m",
    ];
    args.extend_from_slice(extra);
    args
}

/// The PostgreSQL server's URL (`IDEM_TEST_POSTGRES_URL`, or the local one) when it
/// answers; `None`, said loudly, when it does not (a panic under
/// `IDEM_REQUIRE_SERVICES=1`).
pub async fn postgres() -> Option<String> {
    let url = postgres_url();
    reachable("PostgreSQL", &url).await.then_some(url)
}

/// The Redis server's URL (`IDEM_TEST_REDIS_URL`, or the local one), as [`postgres`].
pub async fn redis() -> Option<String> {
    let url = redis_url();
    reachable("Redis", &url).await.then_some(url)
}

/// The MySQL or MariaDB server's URL (`IDEM_TEST_MYSQL_URL`, or the local one), as
/// [`postgres`].
pub async fn mysql() -> Option<String> {
    let url = mysql_url();
    reachable("MySQL", &url).await.then_some(url)
}

/// Whether the store at `url` answers; says so loudly when it does not (and panics
/// under `IDEM_REQUIRE_SERVICES=1`).
pub async fn reachable(kind: &str, url: &str) -> bool {
    let opened =
        tokio::time::timeout(Duration::from_secs(10), idem_gateway::store::open(url)).await;
    match opened {
        Ok(Ok(store)) => match store.ping().await {
            Ok(()) => true,
            Err(e) => service_unavailable::<()>(kind, url, &e).is_some(),
        },
        Ok(Err(e)) => service_unavailable::<()>(kind, url, &e).is_some(),
        Err(e) => service_unavailable::<()>(kind, url, &e).is_some(),
    }
}

/// Two gateways on the store at `store_url`, every key sent to both at once by a client
/// speaking `proto`: each key executes once, and every duplicate is answered from the
/// record.
pub async fn duplicates_split_between_two_gateways_execute_once(store_url: &str, proto: Proto) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Started one after the other: each migrates the schema on start.
    let a = Gateway::start(&up.url(), dir.path(), &on_shared(store_url, &[])).await;
    let b = Gateway::start(&up.url(), dir.path(), &on_shared(store_url, &[])).await;
    let urls = Arc::new([a.url("/v1/charges"), b.url("/v1/charges")]);
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|_| new_key()).collect());
    let http = Http::speaking(proto);
    // Every key is sent twice at once, once to each gateway, 32 keys at a time.
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::with_capacity(KEYS * 2);
    for i in 0..KEYS {
        for g in 0..2 {
            let (http, urls, keys, sem) = (http.clone(), urls.clone(), keys.clone(), sem.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = sem.acquire().await.unwrap();
                let body = format!(r#"{{"order":{i}}}"#);
                let a = http
                    .post(
                        &urls[(i + g) % 2],
                        &keys[i],
                        &body,
                        &[("x-test-delay-ms", "5")],
                    )
                    .await;
                (a.status, a.replayed())
            }));
        }
    }
    let (mut executed, mut conflicts, mut replays) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (201, false) => executed += 1,
            (201, true) => replays += 1,
            (409, _) => conflicts += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(executed, KEYS, "one execution per key");
    assert_eq!(
        conflicts + replays,
        KEYS,
        "every duplicate was answered from the record"
    );
    eprintln!("{KEYS} keys: {conflicts} duplicates got 409, {replays} got a replay");
    for k in keys.iter() {
        assert_eq!(up.started(k), 1, "key {k} executed once");
    }
    assert_eq!(up.total(), KEYS);
    // Every retry, through either gateway, now replays.
    for (i, k) in keys.iter().enumerate().step_by(25) {
        let body = format!(r#"{{"order":{i}}}"#);
        for url in urls.iter() {
            let r = http.post(url, k, &body, &[]).await;
            assert!(r.replayed(), "{r:?}");
        }
    }
    assert_eq!(up.total(), KEYS);
}

over_both_protocols! {
async fn two_gateways_sharing_postgres_execute_each_key_once(proto: Proto) {
    let Some(url) = postgres().await else {
        return;
    };
    duplicates_split_between_two_gateways_execute_once(&url, proto).await;
}
}

over_both_protocols! {
async fn two_gateways_sharing_mysql_execute_each_key_once(proto: Proto) {
    let Some(url) = mysql().await else {
        return;
    };
    duplicates_split_between_two_gateways_execute_once(&url, proto).await;
}
}

over_both_protocols! {
async fn two_gateways_sharing_redis_execute_each_key_once(proto: Proto) {
    let Some(url) = redis().await else {
        return;
    };
    duplicates_split_between_two_gateways_execute_once(&url, proto).await;
}
}

async fn records_survive_kill_9(store_url: &str) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = Http::new();
    let key = new_key();
    let gw = Gateway::start(&up.url(), dir.path(), &on_shared(store_url, &[])).await;
    let first = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(first.status, 201);
    gw.kill9().await;
    let gw = Gateway::start(&up.url(), dir.path(), &on_shared(store_url, &[])).await;
    let retry = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(up.started(&key), 1);
    gw.terminate().await;

    // The record is in the gateway's namespace, and only there.
    let show = |namespace: &str| {
        std::process::Command::new(binary())
            .args(["keys", "show", &key, "--endpoint", "POST /v1/charges"])
            .args(["--store", store_url, "--store-namespace", namespace])
            .output()
            .unwrap()
    };
    let found = show(NAMESPACE);
    assert!(found.status.success(), "{found:?}");
    let v: serde_json::Value = serde_json::from_slice(&found.stdout).unwrap();
    assert_eq!(v["record"]["state"], "completed");
    assert_eq!(
        show("idem").status.code(),
        Some(1),
        "not in the default namespace"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_kill_9_on_postgres() {
    let Some(url) = postgres().await else {
        return;
    };
    records_survive_kill_9(&url).await;
}

/// `idem serve --store mysql://…`: a keyed request executes once, and its retry to a
/// restarted gateway replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_kill_9_on_mysql() {
    let Some(url) = mysql().await else {
        return;
    };
    records_survive_kill_9(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_kill_9_on_redis() {
    let Some(url) = redis().await else {
        return;
    };
    records_survive_kill_9(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_fails_closed_with_503_and_unkeyed_traffic_flows() {
    let Some(url) = redis().await else {
        return;
    };
    let relay = Relay::start(service_addr(&url, 6379).await).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = url_via(&url, relay.addr());
    let gw = Gateway::start(&up.url(), dir.path(), &on_shared(&store, &["--admin", "0"])).await;
    let http = Http::new();
    let url = gw.url("/v1/charges");
    assert_eq!(http.post(&url, &new_key(), "{}", &[]).await.status, 201);
    assert_eq!(
        http.send("GET", &gw.admin_url("/readyz"), &[], "")
            .await
            .status,
        200
    );

    relay.cut();
    refused_without_the_store(&http, &up, &url).await;
    assert_eq!(
        http.send("GET", &gw.admin_url("/readyz"), &[], "")
            .await
            .status,
        503
    );
    let get = http.send("GET", &url, &[], "").await;
    assert_eq!(get.status, 201, "unkeyed traffic does not need the store");
}

/// A keyed request while the store is out of reach: 503 `store-unavailable` with a
/// `Retry-After`, and nothing forwarded. Returns the key it used.
async fn refused_without_the_store(http: &Http, up: &Upstream, url: &str) -> String {
    let key = new_key();
    let a = http.post(url, &key, "{}", &[]).await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(
        a.problem_type(),
        "https://idem.dev/problems/store-unavailable"
    );
    assert!(a.header("retry-after").is_some());
    assert_eq!(
        up.started(&key),
        0,
        "nothing is forwarded without a reservation"
    );
    key
}

/// Starts a gateway on `url`'s store at a loopback port where nothing listens yet:
/// it must start anyway, answer keyed requests 503 and forward nothing, pass unkeyed
/// traffic, report not ready; then, once a relay to the real server opens on that port,
/// reach the store by itself and serve keys exactly once.
async fn store_unreachable_at_start_is_reached_later(url: &str, default_port: u16) {
    let target = service_addr(url, default_port).await;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let store = url_via(url, ([127, 0, 0, 1], port).into());
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &on_shared(&store, &["--admin", "0"])).await;
    let http = Http::new();
    let url = gw.url("/v1/charges");
    let ready = gw.admin_url("/readyz");

    assert_eq!(http.send("GET", &ready, &[], "").await.status, 503);
    let key = refused_without_the_store(&http, &up, &url).await;
    assert_eq!(http.send("GET", &url, &[], "").await.status, 201);
    assert!(
        gw.logs().contains("the store is unreachable"),
        "{}",
        gw.logs()
    );

    let _relay = Relay::start_at(([127, 0, 0, 1], port).into(), target).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while http.send("GET", &ready, &[], "").await.status != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway did not reach the store:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = http.post(&url, &key, r#"{"amount":1}"#, &[]).await;
    assert_eq!(first.status, 201, "{first:?}");
    let retry = http.post(&url, &key, r#"{"amount":1}"#, &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(up.started(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_at_start_is_reached_later() {
    let Some(url) = redis().await else {
        return;
    };
    store_unreachable_at_start_is_reached_later(&url, 6379).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_unreachable_at_start_is_reached_later() {
    let Some(url) = postgres().await else {
        return;
    };
    store_unreachable_at_start_is_reached_later(&url, 5432).await;
}
