//! What `wait=1` costs: the latency of one reserve + complete through `RedisStore`,
//! one caller at a time, with and without `WAIT 1` behind each write, on one server
//! with a replica and on a Redis Cluster of three masters with a replica each, all
//! `redis-server`s on this machine started by the bench (idem-test-support) and
//! stopped after.
//!
//! `cargo bench -p idem-redis --bench wait_latency`. Rounds alternate between the two
//! settings so drift in the machine's load hits both alike; it prints the p50 and p99
//! of every operation of the rounds, per setting.

use std::time::{Duration, Instant};

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{
    Endpoint, Key, Reservation, ReserveRequest, Scope, ScopeMode, Store, StoredResponse, Tenant,
};
use idem_redis::RedisStore;
use idem_test_support::RedisCluster;

const ROUNDS: usize = 6;
const PER_ROUND: usize = 500;

async fn connect(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .key_prefix(prefix)
        .timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// `url` with one more query parameter.
fn with(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// One reserve + complete of a fresh key, timed.
async fn one(store: &RedisStore, i: usize) -> Duration {
    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::new("bench"),
        Endpoint::new("POST", "/v1/charges"),
        Key::new(format!("k{i}")).unwrap(),
    );
    let req = ReserveRequest::new(scope, test_fingerprint("bench")).ttl(Duration::from_secs(60));
    let start = Instant::now();
    let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
        panic!("a fresh key");
    };
    store
        .complete(&lease, &StoredResponse::new(201, "charged"))
        .await
        .unwrap();
    start.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

async fn measure(name: &str, url: &str) {
    let prefix = format!("idem-bench:{}:", unique_namespace("wait"));
    let plain = connect(url, &prefix).await;
    let waiting = connect(&with(url, "wait=1&wait_timeout=1s"), &prefix).await;
    let (mut without, mut waited) = (Vec::new(), Vec::new());
    let mut i = 0;
    for round in 0..ROUNDS {
        for _ in 0..PER_ROUND {
            i += 1;
            if round % 2 == 0 {
                without.push(one(&plain, i).await);
            } else {
                waited.push(one(&waiting, i).await);
            }
        }
    }
    for (setting, times) in [("no wait", &mut without), ("wait=1 ", &mut waited)] {
        times.sort();
        println!(
            "{name:<28} {setting}  reserve+complete p50 {:>7.1} us  p99 {:>7.1} us  ({} ops)",
            percentile(times, 0.50).as_secs_f64() * 1e6,
            percentile(times, 0.99).as_secs_f64() * 1e6,
            times.len()
        );
    }
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    match RedisCluster::start_replicated(1) {
        Ok(servers) => rt.block_on(measure("one server + 1 replica", &servers.url())),
        Err(e) => eprintln!("*** SKIPPED one server with a replica: {e}"),
    }
    match RedisCluster::start(3, 1, Duration::from_secs(5)) {
        Ok(cluster) => rt.block_on(measure("cluster, 3 masters + 3 replicas", &cluster.url())),
        Err(e) => eprintln!("*** SKIPPED cluster: {e}"),
    }
}
