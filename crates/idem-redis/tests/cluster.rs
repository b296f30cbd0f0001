//! The store on a real Redis Cluster (three masters, a replica each, started by
//! idem-test-support or named by `IDEM_TEST_REDIS_CLUSTER_URL`): the whole store
//! contract, shared secrets, records spread over every master, `wait`, and a master
//! that goes silent and is failed over.

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{
    ManualClock, Reservation, ReserveRequest, Store, StoreError, StoredResponse, Tenant,
};
use idem_redis::RedisStore;
use idem_test_support::scope;
use idem_test_support::{RedisCluster, redis_cluster_url, service_unavailable};

/// The shared cluster's URL, or `None` said loudly (a panic under
/// `IDEM_REQUIRE_SERVICES=1`).
fn cluster() -> Option<String> {
    match redis_cluster_url() {
        Ok(url) => Some(url),
        Err(e) => service_unavailable("Redis Cluster", "127.0.0.1", &e),
    }
}

/// `url` with one more query parameter.
fn with(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

async fn connect(url: &str, clock: ManualClock, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .clock(Arc::new(clock))
        .key_prefix(prefix)
        .timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("the cluster at {url}: {e}"))
}

async fn store(clock: ManualClock, ns: String) -> Option<RedisStore> {
    let url = cluster()?;
    Some(connect(&url, clock, &format!("idem-test:{ns}:")).await)
}

idem_core::store_contract_tests!(store);

/// Records land on every master (their hash tags spread over the slots), and each
/// one's reserve, complete and replay works wherever it lands.
#[tokio::test]
async fn records_spread_over_every_master_and_each_completes_where_it_lands() {
    let Some(url) = cluster() else { return };
    let ns = unique_namespace("spread");
    let s = connect(
        &url,
        ManualClock::starting_now(),
        &format!("idem-test:{ns}:"),
    )
    .await;
    for i in 0..64 {
        let req = ReserveRequest::new(
            scope(
                Tenant::new("cluster-tenant"),
                "/v1/cluster",
                &format!("cluster-{}", i),
            ),
            test_fingerprint("spread"),
        );
        let Reservation::Acquired(lease) = s.reserve(&req).await.unwrap() else {
            panic!("key {i} was fresh");
        };
        s.complete(&lease, &StoredResponse::new(201, format!("answer {i}")))
            .await
            .unwrap();
        match s.reserve(&req).await.unwrap() {
            Reservation::Replay(r) => assert_eq!(&r.body[..], format!("answer {i}").as_bytes()),
            other => panic!("key {i}: {other:?}"),
        }
    }
    // On each master, some of them: 64 random slots miss one of three masters with
    // odds of about 3 (2/3)^64, never in practice.
    let masters = masters_holding(&url, &format!("idem-test:{ns}:*")).await;
    assert_eq!(masters, 3, "records on {masters} masters");
}

/// How many masters hold a key matching `pattern`.
async fn masters_holding(url: &str, pattern: &str) -> usize {
    let ports: Vec<u16> = url
        .split(['/', '?', '=', ','])
        .filter_map(|part| part.rsplit_once(':')?.1.parse().ok())
        .collect();
    let mut holding = 0;
    for port in ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
        let master = matches!(&role[0], redis::Value::BulkString(b) if b == b"master");
        // The whole iteration: a node that holds other keys too may answer the first
        // calls with none of these.
        let (mut cursor, mut found) = (0u64, false);
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut conn)
                .await
                .unwrap();
            found |= !keys.is_empty();
            cursor = next;
            if cursor == 0 || found {
                break;
            }
        }
        holding += usize::from(master && found);
    }
    holding
}

/// `wait=1` on a cluster whose masters have a replica each: reservations and
/// completions go through, held by the replica before the store answers.
#[tokio::test]
async fn wait_for_one_replica_succeeds_on_the_cluster() {
    let Some(url) = cluster() else { return };
    let ns = unique_namespace("wait1");
    let url = with(&url, "wait=1&wait_timeout=2s");
    let s = connect(
        &url,
        ManualClock::starting_now(),
        &format!("idem-test:{ns}:"),
    )
    .await;
    assert_eq!(s.replication().map(|r| r.replicas), Some(1));
    for i in 0..16 {
        let req = ReserveRequest::new(
            scope(
                Tenant::new("cluster-tenant"),
                "/v1/cluster",
                &format!("cluster-{}", i),
            ),
            test_fingerprint("wait1"),
        );
        let Reservation::Acquired(lease) = s.reserve(&req).await.unwrap() else {
            panic!("key {i} was fresh");
        };
        s.complete(&lease, &StoredResponse::new(200, "ok"))
            .await
            .unwrap();
    }
}

/// `wait=2` where each master has one replica: the reservation is refused as
/// unavailable, and released, so the key is free again.
#[tokio::test]
async fn too_few_replicas_refuse_the_reservation_and_release_it() {
    let Some(url) = cluster() else { return };
    let ns = unique_namespace("wait2");
    let prefix = format!("idem-test:{ns}:");
    let waiting = connect(
        &with(&url, "wait=2&wait_timeout=100ms"),
        ManualClock::starting_now(),
        &prefix,
    )
    .await;
    let req = ReserveRequest::new(
        scope(
            Tenant::new("cluster-tenant"),
            "/v1/cluster",
            &format!("cluster-{}", 0),
        ),
        test_fingerprint("wait2"),
    );
    match waiting.reserve(&req).await {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("1 of the 2 replicas"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(waiting.get(&req.scope).await.unwrap(), None, "released");
    // A completion too few replicas hold fails too (the middleware retries it).
    let plain = connect(&url, ManualClock::starting_now(), &prefix).await;
    let Reservation::Acquired(lease) = plain.reserve(&req).await.unwrap() else {
        panic!("the key was free again");
    };
    assert!(matches!(
        waiting
            .complete(&lease, &StoredResponse::new(200, "ok"))
            .await,
        Err(StoreError::Unavailable(_))
    ));
}

/// A master that stops answering without closing its connections (paused here; a
/// frozen machine, or a link cut mid-connection, does the same) is failed over by the
/// cluster. Its commands time out; the timeout has the store connect afresh from the
/// seeds, which finds the promoted replica, and every key is served again, not only
/// after the process restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_failed_over_is_found_again() {
    const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
    let mut cluster = match tokio::task::spawn_blocking(|| RedisCluster::start(3, 1, NODE_TIMEOUT))
        .await
        .unwrap()
    {
        Ok(cluster) => cluster,
        Err(e) => {
            service_unavailable::<()>("Redis Cluster", "127.0.0.1", &e);
            return;
        }
    };
    let s = RedisStore::builder()
        .clock(Arc::new(ManualClock::starting_now()))
        .key_prefix("idem-test:silent:")
        .timeout(Duration::from_millis(300))
        .connect(&cluster.url())
        .await
        .unwrap();
    // Records on every master first: the store holds a connection to each.
    for i in 0..32 {
        let req = ReserveRequest::new(
            scope(
                Tenant::new("cluster-tenant"),
                "/v1/cluster",
                &format!("cluster-{}", i),
            ),
            test_fingerprint("silent"),
        );
        assert!(matches!(
            s.reserve(&req).await.unwrap(),
            Reservation::Acquired(_)
        ));
    }
    let victim = cluster.master_ports()[0];
    cluster.pause(victim).unwrap();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster
            .wait_failed_over(victim, 3, Duration::from_secs(30))
            .map(|()| cluster)
    })
    .await
    .unwrap()
    .unwrap();
    // Every key, the failed master's included, is served within a bound: a few
    // timeouts of 300 ms and one fresh connection, not forever.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for i in 32..96 {
        let req = ReserveRequest::new(
            scope(
                Tenant::new("cluster-tenant"),
                "/v1/cluster",
                &format!("cluster-{}", i),
            ),
            test_fingerprint("silent"),
        );
        loop {
            match s.reserve(&req).await {
                Ok(Reservation::Acquired(_)) => break,
                Ok(other) => panic!("key {i} was fresh: {other:?}"),
                Err(StoreError::Unavailable(e)) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "key {i} still unavailable 30 s after the failover: {e}"
                ),
                Err(e) => panic!("key {i}: {e}"),
            }
        }
    }
    let reconnects = s
        .metrics()
        .into_iter()
        .find(|m| m.name == "idem_redis_cluster_reconnects_total")
        .expect("the metric is listed")
        .value;
    assert!(reconnects >= 1, "connected afresh {reconnects} times");
    drop(cluster);
}

/// On a cluster as on one server: inspecting a namespace no gateway opened is "never
/// opened" and writes nothing; a store connected for serving marks it (one key, on its
/// own slot's master), and inspecting it then opens and lists nothing.
#[tokio::test]
async fn a_namespace_never_opened_is_told_from_an_empty_one_on_a_cluster() {
    use idem_core::open::checks::namespaced;
    use idem_core::{ListQuery, OpenError, OpenStore, Schema, StoreOptions};
    let Some(url) = cluster() else { return };
    let ns = unique_namespace("cluster_marker");
    let inspecting = StoreOptions {
        schema: Schema::Existing,
        ..namespaced(&ns)
    };
    let e = RedisStore::open(&url, &inspecting)
        .await
        .expect_err("a namespace never opened was opened");
    assert!(matches!(e, OpenError::NoSchema { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains(&format!("namespace {ns} was never opened by idem")),
        "{e}"
    );
    // Opening to inspect wrote no marker: a second look finds none either.
    let again = RedisStore::open(&url, &inspecting)
        .await
        .expect_err("still none");
    assert!(matches!(again, OpenError::NoSchema { .. }), "{again:?}");

    let serving = RedisStore::open(&url, &namespaced(&ns)).await.unwrap();
    serving.close().await;
    let inspected = RedisStore::open(&url, &inspecting).await.unwrap();
    let page = inspected.list(&ListQuery::new()).await.unwrap();
    assert!(page.records.is_empty(), "{page:?}");
    inspected.close().await;
}
