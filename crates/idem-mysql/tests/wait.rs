//! Waiting duplicates across instances (SPEC S15) without `LISTEN/NOTIFY`: two stores,
//! each its own pool as two gateways have, on one table. A watch on the second fires
//! when the first completes, releases, or lets the lease lapse, within a tick of the
//! second's poller; the poller sends one statement per tick for all its watched scopes,
//! and none while nobody waits.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{Lease, ManualClock, Reservation, ReserveRequest, Store, StoredResponse, Watch};
use idem_mysql::{MOST_PER_STATEMENT, MySqlStore};
use tokio::time::Instant;

/// The second store's poller interval in these tests.
const TICK: Duration = Duration::from_millis(50);

/// How late past one tick a wake may come on a loaded machine: the poller's statement
/// and the scheduler's delays, not further ticks.
const SLACK: Duration = Duration::from_secs(2);

/// The first store (`a`, whose table is dropped with it) and a second on the same table
/// with a pool of its own and a poller looking every [`TICK`], both on `clock`.
async fn two_instances(ns: &str, clock: &ManualClock) -> Option<(common::TempStore, MySqlStore)> {
    let a = common::store_with_clock(clock, ns).await?;
    let b = MySqlStore::builder()
        .table(a.table())
        .clock(Arc::new(clock.clone()))
        .wait_poll(TICK)
        .acquire_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(30))
        .connect(&common::mysql_url())
        .await
        .expect("a second store on the same table");
    Some((a, b))
}

fn request(key: &str) -> ReserveRequest {
    ReserveRequest::new(
        test_scope("/v1/charges", key),
        test_fingerprint("{\"amount\":100}"),
    )
}

async fn acquire(store: &impl Store, req: &ReserveRequest) -> Lease {
    match store.reserve(req).await.expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// What the waiter does before it waits: watch, then reserve and find the attempt in
/// progress.
async fn wait_on(store: &MySqlStore, req: &ReserveRequest) -> Watch {
    let watch = store.watch(&req.scope);
    assert!(
        watch.notifies(),
        "a MySQL store's watch fires when another instance ends the attempt"
    );
    let found = store.reserve(req).await.expect("reserve");
    assert!(matches!(found, Reservation::InProgress { .. }), "{found:?}");
    watch
}

/// Awaits `watch`, which must fire within a tick and [`SLACK`] of now; how long it took.
async fn fires(watch: Watch, what: &str) -> Duration {
    let start = Instant::now();
    tokio::time::timeout(TICK + SLACK, watch)
        .await
        .unwrap_or_else(|_| panic!("the waiter did not hear that the record was {what}"));
    start.elapsed()
}

fn polls(store: &MySqlStore) -> u64 {
    store
        .metrics()
        .into_iter()
        .find(|m| m.name == "idem_mysql_wait_polls_total")
        .expect("the poller's metric")
        .value
}

/// A waiter on instance B wakes within a tick of instance A's completion, and its
/// reserve then replays A's answer; while A's attempt runs, B's watch does not fire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_one_instance_wakes_when_another_completes() {
    let clock = ManualClock::starting_now();
    let Some((a, b)) = two_instances(&unique_namespace("wait"), &clock).await else {
        return;
    };
    let req = request("wait-complete");
    let lease = acquire(&a, &req).await;
    let mut watch = wait_on(&b, &req).await;
    // Several looks find the attempt held: the watch stays.
    let (before, deadline) = (polls(&b), Instant::now() + SLACK * 5);
    while polls(&b) < before + 3 {
        assert!(Instant::now() < deadline, "the poller does not look");
        assert!(
            tokio::time::timeout(TICK, &mut watch).await.is_err(),
            "the watch fired while the attempt ran"
        );
    }
    let answer = StoredResponse::new(201, "charged once");
    a.complete(&lease, &answer).await.expect("complete on A");
    let took = fires(watch, "completed").await;
    eprintln!("B's waiter woke {took:?} after A's completion (tick {TICK:?})");
    assert_eq!(
        b.reserve(&req).await.expect("reserve on B"),
        Reservation::Replay(answer),
        "the waiter replays A's answer"
    );
    a.close().await;
    b.close().await;
}

/// A release on A and a lapsed lease wake B's waiters too: each then acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_and_a_lapsed_lease_wake_a_waiter_on_another_instance() {
    let clock = ManualClock::starting_now();
    let Some((a, b)) = two_instances(&unique_namespace("wait"), &clock).await else {
        return;
    };
    let released = request("wait-release");
    let lease = acquire(&a, &released).await;
    let watch = wait_on(&b, &released).await;
    a.release(&lease).await.expect("release on A");
    fires(watch, "released").await;
    let retry = acquire(&b, &released).await;
    assert_eq!(retry.attempt, 1, "a released key's next attempt is a first");

    let lapsing = request("wait-lapse");
    let lease = acquire(&a, &lapsing).await;
    let watch = wait_on(&b, &lapsing).await;
    clock.advance(lapsing.lease + Duration::from_millis(1));
    fires(watch, "left to lapse").await;
    let took_over = acquire(&b, &lapsing).await;
    assert!(took_over.recovered(), "{took_over:?}");
    assert!(
        a.complete(&lease, &StoredResponse::new(201, "late"))
            .await
            .is_err(),
        "the lapsed attempt is fenced"
    );
    a.close().await;
    b.close().await;
}

/// Many waiters on many scopes cost one statement per tick for each
/// [`MOST_PER_STATEMENT`] scopes, not one per waiter; and nothing once nobody waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_sends_one_statement_per_tick_for_all_waiters() {
    const SCOPES: usize = MOST_PER_STATEMENT + 88;
    const WAITERS_PER_SCOPE: usize = 3;
    let clock = ManualClock::starting_now();
    let Some((a, b)) = two_instances(&unique_namespace("wait"), &clock).await else {
        return;
    };
    let requests: Vec<ReserveRequest> = (0..SCOPES)
        .map(|i| request(&format!("wait-many-{i}")))
        .collect();
    let mut leases = Vec::new();
    for req in &requests {
        leases.push(acquire(&a, req).await);
    }
    let mut watches = Vec::new();
    for req in &requests {
        for _ in 0..WAITERS_PER_SCOPE {
            watches.push(b.watch(&req.scope));
        }
    }
    let (start, before) = (Instant::now(), polls(&b));
    tokio::time::sleep(20 * TICK).await;
    let (elapsed, sent) = (start.elapsed(), polls(&b) - before);
    let chunks = SCOPES.div_ceil(MOST_PER_STATEMENT) as u64;
    let ticks = (elapsed.as_millis() / TICK.as_millis()) as u64 + 1;
    eprintln!(
        "{} waiters on {SCOPES} scopes: {sent} statements in {elapsed:?}",
        watches.len()
    );
    assert!(sent > 0, "the poller looked");
    assert!(
        sent <= ticks * chunks,
        "{sent} statements in {ticks} ticks of {chunks} statements at most"
    );

    // Completing every record wakes every waiter.
    for lease in &leases {
        a.complete(lease, &StoredResponse::new(201, "ok"))
            .await
            .expect("complete");
    }
    for watch in watches {
        tokio::time::timeout(SLACK * 5, watch)
            .await
            .expect("every waiter hears its completion");
    }
    // Nobody waits: the poller is idle.
    let idle = polls(&b);
    tokio::time::sleep(10 * TICK).await;
    assert_eq!(polls(&b), idle, "no statement while nobody waits");
    a.close().await;
    b.close().await;
}

/// `wait-poll-ms=0` turns the poller off: watches are [`Watch::poll`], and the
/// waiters reserve again on their own backoff, as before there was a poller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_poll_zero_leaves_waiters_to_poll() {
    let url = common::mysql_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let store = MySqlStore::builder()
        .connect_lazy(&format!("{url}{sep}wait-poll-ms=0"))
        .expect("a valid URL");
    assert!(!store.watch(&test_scope("/v1/charges", "off")).notifies());
    assert!(
        store
            .metrics()
            .iter()
            .all(|m| m.name != "idem_mysql_wait_polls_total")
    );
    let on = MySqlStore::builder()
        .connect_lazy(&url)
        .expect("a valid URL");
    assert!(on.watch(&test_scope("/v1/charges", "on")).notifies());
}
