//! Reserve + complete per second through `RedisStore`, at 1 and 64 concurrent callers,
//! next to the same client doing the raw equivalent (`SET NX` + `SET`) against the same
//! server in the same run, and the ratio.
//!
//! `cargo bench -p idem-redis --bench reserve_complete`. Reads `IDEM_TEST_REDIS_URL`
//! (default `redis://127.0.0.1:6379`). Rounds alternate between the two workloads so
//! drift in the machine's load hits both alike; the medians are printed. Every key it
//! writes is under a fresh prefix, carries a short TTL, and is deleted at the end.
//! It also prints the server's own time per operation (from `INFO commandstats`): on a
//! small shared machine the rates mostly measure CPU contention, the server time does
//! not.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{
    Endpoint, Fingerprint, Key, Reservation, ReserveRequest, Scope, ScopeMode, Store,
    StoredResponse, Tenant,
};
use idem_redis::RedisStore;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

const CONCURRENCY: [usize; 2] = [1, 64];
const ROUNDS: usize = 5;
const ROUND: Duration = Duration::from_secs(1);
/// Long enough to outlive the run, short enough that an interrupted run cleans itself.
const TTL: Duration = Duration::from_secs(600);
const BODY: &str = r#"{"id":"ch_3MmlLrLkdIwHu7ix0snN0B15","object":"charge","amount":1099,"currency":"usd","status":"succeeded"}"#;

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Idem,
    Raw,
}

#[derive(Clone)]
struct Target {
    store: Arc<RedisStore>,
    raw: ConnectionManager,
    prefix: String,
    /// Numbers every operation, so each one works on a key no other has touched.
    seq: Arc<AtomicU64>,
    /// Fingerprinting is the middleware's work, not the store's: done once.
    fingerprint: Fingerprint,
}

impl Target {
    async fn one(&self, workload: Workload) {
        let i = self.seq.fetch_add(1, Ordering::Relaxed);
        match workload {
            Workload::Idem => {
                let scope = Scope::new(
                    ScopeMode::Public,
                    Tenant::new("bench"),
                    Endpoint::new("POST", "/v1/charges"),
                    Key::new(format!("op-{i}")).expect("key"),
                );
                let req = ReserveRequest::new(scope, self.fingerprint).ttl(TTL);
                let Reservation::Acquired(lease) = self.store.reserve(&req).await.expect("reserve")
                else {
                    panic!("a fresh key was not acquired");
                };
                let response =
                    StoredResponse::new(201, BODY).with_header("content-type", "application/json");
                self.store
                    .complete(&lease, &response)
                    .await
                    .expect("complete");
            }
            Workload::Raw => {
                // The same two round trips without the protocol: claim the key if absent,
                // then store the answer, both with an expiry.
                let key = format!("{}raw:{i}", self.prefix);
                let ttl = TTL.as_millis() as u64;
                let mut conn = self.raw.clone();
                let claimed: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("in_progress")
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl)
                    .query_async(&mut conn)
                    .await
                    .expect("SET NX");
                assert!(claimed.is_some(), "a fresh key was not claimed");
                let () = redis::cmd("SET")
                    .arg(&key)
                    .arg(BODY)
                    .arg("PX")
                    .arg(ttl)
                    .query_async(&mut conn)
                    .await
                    .expect("SET");
            }
        }
    }

    /// Microseconds the server has spent in the command this workload sends (`evalsha`
    /// or `set`), from `INFO commandstats`; other clients of a shared server add to it.
    async fn server_usec(&self, workload: Workload) -> u64 {
        let name = match workload {
            Workload::Idem => "cmdstat_evalsha:",
            Workload::Raw => "cmdstat_set:",
        };
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.raw.clone())
            .await
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// One round with `callers` concurrent callers.
    async fn round(&self, workload: Workload, callers: usize) -> Round {
        let usec_before = self.server_usec(workload).await;
        let started = Instant::now();
        let deadline = started + ROUND;
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let target = self.clone();
                tokio::spawn(async move {
                    let mut done = 0u64;
                    while Instant::now() < deadline {
                        target.one(workload).await;
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.expect("caller");
        }
        let per_second = total as f64 / started.elapsed().as_secs_f64();
        let usec = self.server_usec(workload).await.saturating_sub(usec_before);
        Round {
            per_second,
            server_usec_per_op: usec as f64 / total.max(1) as f64,
        }
    }

    async fn clean_up(&self) -> usize {
        let mut conn = self.raw.clone();
        let pattern = format!("{}*", self.prefix);
        let mut cursor = 0u64;
        let mut deleted = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1_000)
                .query_async(&mut conn)
                .await
                .expect("SCAN");
            if !keys.is_empty() {
                let n: usize = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .expect("UNLINK");
                deleted += n;
            }
            cursor = next;
            if cursor == 0 {
                return deleted;
            }
        }
    }
}

struct Round {
    per_second: f64,
    server_usec_per_op: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let url = std::env::var("IDEM_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let prefix = format!("idem-bench:{}:", unique_namespace("reserve_complete"));
        let store = match RedisStore::builder(url.as_str())
            .key_prefix(&prefix)
            .connect()
            .await
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("Redis at {url} is unreachable ({e}); nothing measured");
                return;
            }
        };
        let raw = ConnectionManager::new_with_config(
            redis::Client::open(url.as_str()).expect("URL"),
            ConnectionManagerConfig::new().set_response_timeout(Some(Duration::from_secs(1))),
        )
        .await
        .expect("raw connection");
        let target = Target {
            store: Arc::new(store),
            raw,
            prefix,
            seq: Arc::default(),
            fingerprint: test_fingerprint(BODY),
        };

        println!(
            "reserve+complete through RedisStore vs raw SET NX + SET through the same client \
             (one multiplexed connection each), {ROUNDS} rounds of {ROUND:?}, medians:"
        );
        println!(
            "{:>8} {:>12} {:>12} {:>6}   {:>22} {:>22}",
            "callers", "idem ops/s", "raw ops/s", "ratio", "server us/op idem", "server us/op raw"
        );
        for callers in CONCURRENCY {
            // Warm up: connections, script cache, allocator.
            target.round(Workload::Idem, callers).await;
            target.round(Workload::Raw, callers).await;
            let (mut idem, mut raw) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                idem.push(target.round(Workload::Idem, callers).await);
                raw.push(target.round(Workload::Raw, callers).await);
            }
            let rate = |v: &[Round]| median(v.iter().map(|r| r.per_second).collect());
            let cost = |v: &[Round]| median(v.iter().map(|r| r.server_usec_per_op).collect());
            let (idem_rate, raw_rate) = (rate(&idem), rate(&raw));
            println!(
                "{callers:>8} {idem_rate:>12.0} {raw_rate:>12.0} {:>6.2}   {:>22.1} {:>22.1}",
                idem_rate / raw_rate,
                cost(&idem),
                cost(&raw)
            );
        }
        let deleted = target.clean_up().await;
        println!("deleted the {deleted} keys the run wrote");
    });
}
