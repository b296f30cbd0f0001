//! Waiting duplicates across two gateways sharing MySQL (SPEC S15), which has no
//! `LISTEN/NOTIFY`: the store's poller looks once per tick for every scope the
//! gateway's waiters watch, and wakes them when another gateway's attempt ends.

use std::time::{Duration, Instant};

use crate::common::{Gateway, Http, Upstream, metric, metrics, new_key};
use crate::shared::{mysql, on_shared};
use crate::wait::{BODY, first_and_duplicate, release_wakes_the_waiter_whose_retry_executes};

/// Gateway B's reserves, as its store-call metrics count them.
const RESERVES: &str = "idem_store_call_duration_seconds_count{op=\"reserve\",ok=\"true\"}";

/// The statements the MySQL store's poller sent.
const POLLS: &str = "idem_mysql_wait_polls_total";

/// The statements a reserve that finds the attempt in progress sends: the insert the
/// primary key refuses, and the read of the record (counted by the server in
/// `crates/idem-mysql/tests/cost.rs`).
const STATEMENTS_PER_BUSY_RESERVE: u64 = 2;

/// `url` with `param` added to its query.
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// A duplicate with `Prefer: wait` on gateway B gets the answer gateway A's upstream
/// produced, which ran once. B's poller woke the waiter, which reserved twice in the
/// first attempt's 2.5 s: once before waiting, once when woken; on a backoff of its own
/// it would reserve about ten times, and with a fallback reserve every second four
/// times. A release on A wakes B's waiter too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicate_on_another_gateway_sharing_mysql_gets_the_first_answer() {
    let Some(url) = mysql().await else {
        return;
    };
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
    let admin = ["--admin", "127.0.0.1:0"];
    let b = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &admin)).await;
    let http = Http::new();
    let before = metrics(&http, &b).await;
    let key = new_key();
    let (first, dup) = first_and_duplicate(
        &up,
        a.url("/v1/charges"),
        b.url("/v1/charges"),
        &key,
        "2500",
        "201",
        &[("prefer", "wait=10")],
    )
    .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(dup.status, 201, "{dup:?}");
    assert!(dup.replayed(), "{dup:?}");
    assert_eq!(dup.body, first.body, "the first attempt's exact answer");
    assert_eq!(dup.header("preference-applied"), Some("wait=10"));
    assert_eq!(up.started(&key), 1, "the upstream ran once");
    let after = metrics(&http, &b).await;
    let reserves = metric(&after, RESERVES).unwrap() - metric(&before, RESERVES).unwrap_or(0);
    assert!(
        reserves <= 3,
        "the waiter reserved {reserves} times in 2.5 s: it polled rather than being woken"
    );
    assert!(metric(&after, POLLS).unwrap() > 0, "{after}");
    release_wakes_the_waiter_whose_retry_executes(&a, &b, &up).await;
    assert_eq!(
        metric(&metrics(&http, &b).await, "idem_mysql_watches"),
        Some(0)
    );
}

/// What waiting costs the MySQL server, with the poller (100 ms) and without it
/// (`wait-poll-ms=0`: each waiter reserves again on its own backoff, 20 ms doubling to
/// 500 ms): `WAITERS` duplicates on gateway B wait for first attempts held
/// `HELD_MS` on gateway A, all on one key, then each on a key of its own. Prints the
/// statements per waiter per second, counted by the gateway (B's reserves, two
/// statements each, and the poller's statements) over the waiters' summed wait.
///
/// `cargo test -p idem-gateway --test blackbox -- --ignored what_a_waiter_costs_mysql --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints figures; run by hand"]
async fn what_a_waiter_costs_mysql() {
    const WAITERS: usize = 40;
    const HELD_MS: &str = "5000";
    let Some(url) = mysql().await else {
        return;
    };
    let http = Http::new();
    for (label, b_url) in [
        ("poller every 100 ms", url.clone()),
        ("no poller, backoff", with_param(&url, "wait-poll-ms=0")),
    ] {
        for keys in [1, WAITERS] {
            let up = Upstream::start().await;
            let dir = tempfile::tempdir().unwrap();
            let a = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
            let admin = ["--admin", "127.0.0.1:0"];
            let b = Gateway::start(&up.url(), dir.path(), &on_shared(&b_url, &admin)).await;
            let keys: Vec<String> = (0..keys).map(|_| new_key()).collect();
            let firsts: Vec<_> = keys
                .iter()
                .map(|key| {
                    let (http, url, key) = (http.clone(), a.url("/v1/charges"), key.clone());
                    tokio::spawn(async move {
                        http.post(&url, &key, BODY, &[("x-test-delay-ms", HELD_MS)])
                            .await
                    })
                })
                .collect();
            for key in &keys {
                while up.started(key) == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            let before = metrics(&http, &b).await;
            let waiters: Vec<_> = (0..WAITERS)
                .map(|i| {
                    let key = keys[i % keys.len()].clone();
                    let (http, url) = (http.clone(), b.url("/v1/charges"));
                    tokio::spawn(async move {
                        let start = Instant::now();
                        let answer = http.post(&url, &key, BODY, &[("prefer", "wait=30")]).await;
                        (answer, start.elapsed())
                    })
                })
                .collect();
            let mut waited = Duration::ZERO;
            for w in waiters {
                let (answer, took) = w.await.unwrap();
                assert!(answer.replayed(), "{answer:?}");
                waited += took;
            }
            for f in firsts {
                assert_eq!(f.await.unwrap().status, 201);
            }
            let after = metrics(&http, &b).await;
            let delta =
                |series| metric(&after, series).unwrap_or(0) - metric(&before, series).unwrap_or(0);
            let (reserves, polls) = (delta(RESERVES), delta(POLLS));
            let statements = reserves * STATEMENTS_PER_BUSY_RESERVE + polls;
            let per = statements as f64 / waited.as_secs_f64();
            eprintln!(
                "{label}: {WAITERS} waiters on {} key(s), {:.1} waiter-seconds: {reserves} \
                 reserves, {polls} poller statements = {per:.2} statements per waiter per \
                 second",
                keys.len(),
                waited.as_secs_f64()
            );
            for key in &keys {
                assert_eq!(up.started(key), 1);
            }
        }
    }
}
