//! Under load, a connection whose operation finished goes straight to the next waiting
//! operation rather than back through the pool; the pool still serves its own waiters.
//! With batching on, reserves and completions queue for a batch instead of for a
//! connection, so the hand-offs are seen with it off; the pool's own waiters are served
//! either way.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{RecordState, Reservation, ReserveRequest, Store, StoredResponse, Tenant};
use idem_postgres::PgStore;
use idem_test_support::figure;
use idem_test_support::scope;
use sqlx::Connection;

/// The tenant of every record this file makes.
const TENANT: &str = "handoff";

const HANDOFFS: &str = "idem_postgres_connection_handoffs_total";

/// Reserves and completes a fresh key; panics unless both succeed.
async fn execute(store: &PgStore, key: &str) {
    let request = ReserveRequest::new(
        scope(Tenant::new(TENANT), "/v1/charges", key),
        test_fingerprint("{}"),
    );
    let lease = match store.reserve(&request).await.expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("{key}: expected to acquire, got {other:?}"),
    };
    let answer = StoredResponse::new(201, format!("{{\"key\":\"{key}\"}}"));
    store.complete(&lease, &answer).await.expect("complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_pass_from_operation_to_operation_under_load() {
    const CALLERS: usize = 24;
    const KEYS_EACH: usize = 20;
    let ns = unique_namespace("handoff");
    let options = PgStore::builder().max_connections(2).batching(false);
    let Some(store) = common::connect(options, &ns).await else {
        return;
    };
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let store = store.inner.clone();
            tokio::spawn(async move {
                for k in 0..KEYS_EACH {
                    execute(&store, &format!("k-{c}-{k}")).await;
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("caller");
    }

    // Every answer is recorded as it was given: no connection carried one operation's
    // state into another's.
    for c in 0..CALLERS {
        for k in 0..KEYS_EACH {
            let key = format!("k-{c}-{k}");
            let record = store
                .get(&scope(Tenant::new(TENANT), "/v1/charges", &key))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{key} has no record"));
            match record.state {
                RecordState::Completed { response, .. } => {
                    assert_eq!(response.status, 201, "{key}");
                    assert_eq!(response.body, format!("{{\"key\":\"{key}\"}}"), "{key}");
                }
                other => panic!("{key} is {other:?}"),
            }
        }
    }
    let handed = figure(&*store, HANDOFFS);
    assert!(
        handed > 0,
        "{CALLERS} callers on 2 connections never handed one on"
    );
    assert!(
        figure(&*store, "idem_postgres_pool_connections") <= 2,
        "the pool stays within its size"
    );
}

/// An application sharing the store's pool (for same-transaction completion, say)
/// still gets connections while store operations queue for them: connections go back
/// to the pool after a bounded number of hand-offs. The pool's acquire timeout is the
/// check: a starved acquire fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_sharing_the_pool_is_served_under_load() {
    application_served_under_load(false, HANDOFFS).await;
}

/// The same with batching on: the batches' connections go back to the pool too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_sharing_the_pool_is_served_under_batched_load() {
    application_served_under_load(true, "idem_postgres_batches_total").await;
}

/// Callers keep the store busy (its progress shows in the counter `busy`) while the
/// application takes turns with the pool.
async fn application_served_under_load(batching: bool, busy: &str) {
    const CALLERS: usize = 16;
    // Bounds the run should the application's turns never come.
    const MAX_KEYS_EACH: usize = 2_000;
    let ns = unique_namespace("handoff_app");
    let options = PgStore::builder()
        .max_connections(2)
        .batching(batching)
        .acquire_timeout(Duration::from_secs(10));
    let Some(store) = common::connect(options, &ns).await else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (store, stop) = (store.inner.clone(), stop.clone());
            tokio::spawn(async move {
                for k in 0..MAX_KEYS_EACH {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    execute(&store, &format!("k-{c}-{k}")).await;
                }
            })
        })
        .collect();

    // Wait until the callers keep the store busy, then take turns with them.
    while figure(&*store, busy) == 0 && !callers.iter().all(|c| c.is_finished()) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let handed_before = figure(&*store, busy);
    // At least five turns, and on until the store has made progress meanwhile (a batch
    // may take longer than five quick turns), within a bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut turn = 0;
    while turn < 5
        || (figure(&*store, busy) == handed_before && std::time::Instant::now() < deadline)
    {
        turn += 1;
        let mut conn = store
            .pool()
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("turn {turn}: the application was not served: {e}"));
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(one, 1);
    }
    let handed_during = figure(&*store, busy) - handed_before;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.expect("caller");
    }
    assert!(
        handed_during > 0,
        "the store was under load while the application took its turns"
    );
}

/// An operation that waits in the store for a connection gives up within the pool's
/// acquire timeout, as one waiting in the pool does, not at the later operation
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_connection_is_bounded_by_the_acquire_timeout() {
    let ns = unique_namespace("handoff_wait");
    // The acquire timeout is long enough for the first reserve to get the one
    // connection on a loaded machine, and far enough below the operation timeout that
    // which of the two ended the wait is plain.
    let options = PgStore::builder()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(3))
        .operation_timeout(Duration::from_secs(30));
    let Some(store) = common::connect(options, &ns).await else {
        return;
    };
    // Another session locks the table, so the store's one connection blocks in its
    // first reserve and the second reserve waits for it.
    let mut locker = sqlx::PgConnection::connect(&common::pg_url())
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        common::table_for(&ns)
    )))
    .execute(&mut locker)
    .await
    .unwrap();
    let blocked = tokio::spawn({
        let store = store.inner.clone();
        async move { execute(&store, "first").await }
    });
    // Proven by the lock itself: until PostgreSQL shows a session waiting for the table,
    // the one connection may still be on its way to the first reserve (being pinged or
    // opened), and the second reserve could take it first.
    let table = common::table_for(&ns);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND NOT granted",
        )
        .bind(&table)
        .fetch_one(&mut locker)
        .await
        .unwrap();
        if waiting > 0 || blocked.is_finished() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first reserve never waited for the table lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !blocked.is_finished(),
        "the first reserve should be blocked on the lock, holding the one connection"
    );
    assert_eq!(
        figure(&*store, "idem_postgres_pool_idle_connections"),
        0,
        "the blocked reserve holds the pool's one connection"
    );

    let started = std::time::Instant::now();
    let request = ReserveRequest::new(
        scope(Tenant::new(TENANT), "/v1/charges", "second"),
        test_fingerprint("{}"),
    );
    let waited = store.reserve(&request).await;
    let elapsed = started.elapsed();
    assert!(
        matches!(waited, Err(idem_core::StoreError::Unavailable(_))),
        "{waited:?}"
    );
    assert!(
        elapsed < Duration::from_secs(10),
        "gave up after {elapsed:?}, not within the 3 s acquire timeout"
    );

    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    blocked
        .await
        .expect("the first reserve completes once the lock is gone");
}
