//! Reserve + complete per second through `RedisStore`, at 1 and 64 concurrent callers,
//! next to the same client doing the raw equivalent (`SET NX` + `SET`) against the same
//! server in the same run, and the ratio.
//!
//! `cargo bench -p idem-redis --bench reserve_complete`. Reads `IDEM_TEST_REDIS_URL`
//! (default `redis://127.0.0.1:6379`). Rounds alternate between the two workloads so
//! drift in the machine's load hits both alike; the medians are printed. Every key it
//! writes is under a fresh prefix, carries a short TTL, and is deleted at the end.
//! It also prints the CPU time per operation of the Redis server (the change of
//! `used_cpu_user + used_cpu_sys` in `INFO cpu` over the round) and of this client
//! process (`/proc/self/stat`, Linux only): on a small shared machine the rates mostly
//! measure CPU contention, the CPU times do not. They count every command a workload
//! sends, top-level or inside a script, and the server's network work, which
//! `INFO commandstats` leaves out; other clients of a shared server add to the server's.

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

    /// The server's CPU time so far, in microseconds (`INFO cpu`).
    async fn server_cpu_usec(&self) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut self.raw.clone())
            .await
            .expect("INFO");
        let seconds = |name: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        (seconds("used_cpu_user:") + seconds("used_cpu_sys:")) * 1e6
    }

    /// One round with `callers` concurrent callers.
    async fn round(&self, workload: Workload, callers: usize) -> Round {
        let server_before = self.server_cpu_usec().await;
        let client_before = client_cpu_usec();
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
        let client = client_cpu_usec().zip(client_before).map(|(a, b)| a - b);
        let server = self.server_cpu_usec().await - server_before;
        let ops = total.max(1) as f64;
        Round {
            ops: total,
            per_second,
            server_usec_per_op: server / ops,
            client_usec_per_op: client.map_or(f64::NAN, |c| c / ops),
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
    ops: u64,
    per_second: f64,
    server_usec_per_op: f64,
    client_usec_per_op: f64,
}

/// This process's CPU time so far (user + system, every thread), in microseconds, or
/// `None` where `/proc/self/stat` is not there. The kernel counts it in ticks of 10 ms,
/// fine enough over a round of a second.
fn client_cpu_usec() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name, which may itself hold spaces:
    // utime and stime are the 14th and 15th fields of the line, in clock ticks.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let utime: f64 = rest.nth(11)?.parse().ok()?;
    let stime: f64 = rest.next()?.parse().ok()?;
    const TICKS_PER_SECOND: f64 = 100.0;
    Some((utime + stime) / TICKS_PER_SECOND * 1e6)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let url = idem_test_support::services::redis_url();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let prefix = format!("idem-bench:{}:", unique_namespace("reserve_complete"));
        let store = match RedisStore::builder()
            .key_prefix(&prefix)
            .connect(&url)
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
            "{:>8} {:>11} {:>11} {:>6}   {:>13} {:>13}   {:>13} {:>13}",
            "callers",
            "idem ops/s",
            "raw ops/s",
            "ratio",
            "server us/op",
            "",
            "client us/op",
            ""
        );
        println!(
            "{:>8} {:>11} {:>11} {:>6}   {:>13} {:>13}   {:>13} {:>13}",
            "", "", "", "", "idem", "raw", "idem", "raw"
        );
        let mut ops = [0u64; 2];
        for callers in CONCURRENCY {
            // Warm up: connections, script cache, allocator.
            target.round(Workload::Idem, callers).await;
            target.round(Workload::Raw, callers).await;
            let (mut idem, mut raw) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                idem.push(target.round(Workload::Idem, callers).await);
                raw.push(target.round(Workload::Raw, callers).await);
            }
            ops[0] += idem.iter().map(|r| r.ops).sum::<u64>();
            ops[1] += raw.iter().map(|r| r.ops).sum::<u64>();
            let med = |v: &[Round], f: fn(&Round) -> f64| median(v.iter().map(f).collect());
            let (idem_rate, raw_rate) = (med(&idem, |r| r.per_second), med(&raw, |r| r.per_second));
            println!(
                "{callers:>8} {idem_rate:>11.0} {raw_rate:>11.0} {:>6.2}   {:>13.1} {:>13.1}   {:>13.1} {:>13.1}",
                idem_rate / raw_rate,
                med(&idem, |r| r.server_usec_per_op),
                med(&raw, |r| r.server_usec_per_op),
                med(&idem, |r| r.client_usec_per_op),
                med(&raw, |r| r.client_usec_per_op),
            );
        }
        println!(
            "measured operations (warm-up rounds not counted): idem {}, raw {}",
            ops[0], ops[1]
        );
        let deleted = target.clean_up().await;
        println!("deleted the {deleted} keys the run wrote");
    });
}
