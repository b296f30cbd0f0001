//! A master of a Redis Cluster killed under load, its replica promoted: with `wait=1`
//! no key executes twice; without it, the test prints how many did (a figure, not an
//! assertion: Redis replicates asynchronously, so a reservation the dead master took
//! but had not yet passed on is lost, and its retry executes again).
//!
//! Each run starts its own cluster (three masters, two replicas each, failure detected
//! after one second), two gateways on it, and sends every key twice at once, once to
//! each gateway, retrying each until it has an answer. A master is killed once a
//! quarter of the keys are answered; one of its replicas takes over and the other
//! follows the new master, so that `wait=1` can be met again without waiting for the
//! dead node (which is started again afterwards and rejoins as a replica).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_test_support::{RedisCluster, service_unavailable};

use crate::cluster::with;
use crate::common::{Gateway, Http, Upstream, new_key};
use crate::shared::on_shared;

const KEYS: usize = 300;
/// Requests in flight at once.
const IN_FLIGHT: usize = 48;
/// Replicas per master: two, so that the promoted one still has one to `WAIT` for.
const REPLICAS: usize = 2;
/// `--cluster-node-timeout`: how long a master may be silent before it is failed.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// The most a key may take to be answered, failover included.
const KEY_DEADLINE: Duration = Duration::from_secs(90);

/// What one run saw.
struct Outcome {
    /// Keys the upstream executed more than once.
    executed_twice: usize,
    /// Answers 503 (store unavailable) that clients retried through.
    unavailable: usize,
}

async fn fail_a_master_over(wait: bool) -> Option<Outcome> {
    let cluster =
        match tokio::task::spawn_blocking(|| RedisCluster::start(3, REPLICAS, NODE_TIMEOUT))
            .await
            .unwrap()
        {
            Ok(cluster) => cluster,
            Err(e) => return service_unavailable("Redis Cluster", "127.0.0.1", &e),
        };
    let url = if wait {
        with(&cluster.url(), "wait=1&wait_timeout=1s")
    } else {
        cluster.url()
    };
    let cluster = Arc::new(Mutex::new(cluster));
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A reservation the failover cut off from its gateway (written and replicated, its
    // answer lost with the dead master) stays in progress until its lease lapses, then
    // is taken over: a lease well inside KEY_DEADLINE lets such a key be answered. It
    // must outlast the promotion (a few seconds), during which running attempts cannot
    // renew theirs: a shorter one lets a running attempt be taken over and execute twice.
    let args = on_shared(&url, &["--lease", "20s"]);
    let a = Gateway::start(&up.url(), dir.path(), &args).await;
    let b = Gateway::start(&up.url(), dir.path(), &args).await;
    let urls = Arc::new([a.url("/v1/charges"), b.url("/v1/charges")]);
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|_| new_key()).collect());
    let http = Http::new();
    let answered = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let sem = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));

    let killer = {
        let (cluster, answered) = (cluster.clone(), answered.clone());
        tokio::spawn(async move {
            while answered.load(Ordering::Relaxed) < KEYS * 2 / 4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::task::spawn_blocking(move || {
                let mut cluster = cluster.lock().unwrap();
                let victim = cluster.master_ports()[0];
                let start = std::time::Instant::now();
                cluster.kill(victim);
                // Until the replica is promoted, the dead master is still counted
                // among the three (its peers have not failed it yet).
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while cluster.master_ports().len() < 3 {
                    assert!(std::time::Instant::now() < deadline, "no failover in 30s");
                    std::thread::sleep(Duration::from_millis(50));
                }
                cluster.wait_ok(Duration::from_secs(30)).unwrap();
                let promoted = start.elapsed();
                // The other replica follows the promoted one: WAIT 1 can be met again.
                cluster.wait_replicated(1, Duration::from_secs(30)).unwrap();
                let followed = start.elapsed();
                cluster.restart(victim, NODE_TIMEOUT).unwrap();
                eprintln!(
                    "killed the master on {victim}: replica promoted after {promoted:?}, \
                     replicated again after {followed:?}"
                );
                victim
            })
            .await
            .unwrap()
        })
    };

    let mut tasks = Vec::with_capacity(KEYS * 2);
    for i in 0..KEYS {
        for g in 0..2 {
            let (http, urls, keys, sem) = (http.clone(), urls.clone(), keys.clone(), sem.clone());
            let (answered, unavailable) = (answered.clone(), unavailable.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = sem.acquire().await.unwrap();
                let body = format!(r#"{{"order":{i}}}"#);
                let deadline = tokio::time::Instant::now() + KEY_DEADLINE;
                let mut last = Vec::new();
                loop {
                    let a = http
                        .post(
                            &urls[(i + g) % 2],
                            &keys[i],
                            &body,
                            &[("x-test-delay-ms", "10")],
                        )
                        .await;
                    last.push(a.status);
                    match a.status {
                        201 => break,
                        409 => {}
                        503 => {
                            unavailable.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("key {i}: unexpected {other}: {a:?}"),
                    }
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "key {i} got no answer within {KEY_DEADLINE:?} ({} tries, the last ones {:?}): {a:?}",
                        last.len(),
                        &last[last.len().saturating_sub(10)..]
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let victim = killer.await.unwrap();
    let executed_twice = keys.iter().filter(|k| up.started(k) > 1).count();
    for k in keys.iter() {
        assert!(up.started(k) >= 1, "key {k} never executed");
    }
    eprintln!(
        "failover (wait={}): master on port {victim} killed after {} of {} answers; \
         {executed_twice} of {KEYS} keys executed twice; {} answers 503 retried",
        u8::from(wait),
        KEYS * 2 / 4,
        KEYS * 2,
        unavailable.load(Ordering::Relaxed)
    );
    a.terminate().await;
    b.terminate().await;
    drop(cluster);
    Some(Outcome {
        executed_twice,
        unavailable: unavailable.load(Ordering::Relaxed),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_wait_executes_no_key_twice_and_without_it_says_how_many_did() {
    let Some(without) = fail_a_master_over(false).await else {
        return;
    };
    let Some(waited) = fail_a_master_over(true).await else {
        return;
    };
    assert_eq!(
        waited.executed_twice, 0,
        "with wait=1 a key executed twice across the failover"
    );
    eprintln!(
        "without wait: {} of {KEYS} keys executed twice ({} answers 503); with wait=1: 0 \
         ({} answers 503)",
        without.executed_twice, without.unavailable, waited.unavailable
    );
}
