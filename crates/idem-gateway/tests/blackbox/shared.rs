//! The shared stores: two gateways on one PostgreSQL or Redis store receive duplicates
//! of the same keys split between them, and each key executes exactly once upstream;
//! records survive a gateway's kill -9.

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{service_unavailable, service_url};

use crate::common::{Gateway, Http, Upstream, new_key};

const KEYS: usize = 500;

async fn reachable(kind: &str, url: &str) -> bool {
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

async fn duplicates_split_between_two_gateways_execute_once(store_url: &str) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Started one after the other: each migrates the schema on start.
    let a = Gateway::start(&up.url(), dir.path(), &["--store", store_url]).await;
    let b = Gateway::start(&up.url(), dir.path(), &["--store", store_url]).await;
    let urls = Arc::new([a.url("/v1/charges"), b.url("/v1/charges")]);
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|_| new_key()).collect());
    let http = Http::new();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_postgres_execute_each_key_once() {
    let url = service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    if !reachable("PostgreSQL", &url).await {
        return;
    }
    duplicates_split_between_two_gateways_execute_once(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_redis_execute_each_key_once() {
    let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    if !reachable("Redis", &url).await {
        return;
    }
    duplicates_split_between_two_gateways_execute_once(&url).await;
}

async fn records_survive_kill_9(store_url: &str) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = Http::new();
    let key = new_key();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", store_url]).await;
    let first = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(first.status, 201);
    gw.kill9().await;
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", store_url]).await;
    let retry = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(up.started(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_kill_9_on_postgres() {
    let url = service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    if reachable("PostgreSQL", &url).await {
        records_survive_kill_9(&url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_kill_9_on_redis() {
    let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    if reachable("Redis", &url).await {
        records_survive_kill_9(&url).await;
    }
}
