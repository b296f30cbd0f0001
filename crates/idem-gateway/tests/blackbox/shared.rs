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

/// A TCP relay to a service that can be cut, to make a store unreachable mid-run.
struct Relay {
    addr: std::net::SocketAddr,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Relay {
    async fn start(target: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks = Arc::new(std::sync::Mutex::new(Vec::new()));
        let t = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                t.lock().unwrap().push(conn);
            }
        });
        tasks.lock().unwrap().push(accept);
        Relay { addr, tasks }
    }

    /// Drops every relayed connection and stops accepting new ones.
    fn cut(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_fails_closed_with_503_and_unkeyed_traffic_flows() {
    let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    if !reachable("Redis", &url).await {
        return;
    }
    let target = {
        let hostport = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .unwrap();
        let hostport = hostport.rsplit('@').next().unwrap();
        tokio::net::lookup_host(hostport)
            .await
            .unwrap()
            .next()
            .unwrap()
    };
    let relay = Relay::start(target).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("redis://{}", relay.addr);
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", &store, "--admin", "0"]).await;
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
    let key = new_key();
    let a = http.post(&url, &key, "{}", &[]).await;
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
    assert_eq!(
        http.send("GET", &gw.admin_url("/readyz"), &[], "")
            .await
            .status,
        503
    );
    let get = http.send("GET", &url, &[], "").await;
    assert_eq!(get.status, 201, "unkeyed traffic does not need the store");
}
