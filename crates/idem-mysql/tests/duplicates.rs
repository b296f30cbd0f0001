//! Concurrent duplicates under the server's default isolation (REPEATABLE READ in
//! MySQL and MariaDB, which the store leaves as it is): the reserve takes no gap or
//! next-key lock that two duplicates of a key could deadlock on.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ManualClock, Reservation, ReserveRequest, Store, StoredResponse};
use idem_mysql::MySqlStore;

const DUPLICATES: usize = 64;
const KEYS: usize = 8;

/// 64 concurrent reserves of each of 8 keys, on a pool of 32 connections: for each key
/// exactly one acquires, every other gets an in-progress answer, and none fails; no
/// statement was even rolled back for a deadlock and run again. After each winner
/// completes, 64 more duplicates of each key all replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_duplicates_find_one_winner_and_no_deadlock() {
    let ns = unique_namespace("dups");
    let clock = ManualClock::starting_now();
    let options = MySqlStore::builder()
        .clock(Arc::new(clock))
        .max_connections(32)
        .acquire_timeout(Duration::from_secs(20))
        .operation_timeout(Duration::from_secs(60));
    let Some(store) = common::connect(options, &ns).await else {
        return;
    };
    let isolation: String = sqlx::query_scalar("SELECT @@SESSION.tx_isolation")
        .fetch_one(store.pool())
        .await
        .or(sqlx::query_scalar("SELECT @@SESSION.transaction_isolation")
            .fetch_one(store.pool())
            .await)
        .expect("the session's isolation");
    eprintln!("isolation: {isolation}");
    let store = Arc::new(store);
    let requests: Vec<ReserveRequest> = (0..KEYS)
        .map(|k| {
            ReserveRequest::new(
                test_scope("/v1/charges", &format!("dup-{k}")),
                test_fingerprint("{\"amount\":100}"),
            )
        })
        .collect();
    let run = async |requests: &[ReserveRequest]| {
        let mut tasks = Vec::new();
        for req in requests {
            for _ in 0..DUPLICATES {
                let (store, req) = (store.clone(), req.clone());
                tasks.push(tokio::spawn(async move { store.reserve(&req).await }));
            }
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("task").expect("no duplicate fails"));
        }
        answers
    };
    let answers = run(&requests).await;
    let mut leases = Vec::new();
    for (k, per_key) in answers.chunks(DUPLICATES).enumerate() {
        let won: Vec<_> = per_key
            .iter()
            .filter_map(|r| match r {
                Reservation::Acquired(lease) => Some(lease.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(won.len(), 1, "key {k}: {} acquired", won.len());
        let waiting = per_key
            .iter()
            .filter(|r| matches!(r, Reservation::InProgress { .. }))
            .count();
        assert_eq!(waiting, DUPLICATES - 1, "key {k}");
        leases.extend(won);
    }
    let response = StoredResponse::new(201, "charged");
    for lease in &leases {
        store.complete(lease, &response).await.expect("complete");
    }
    for answer in run(&requests).await {
        assert_eq!(answer, Reservation::Replay(response.clone()));
    }
    assert_eq!(
        idem_test_support::figure(&**store, "idem_mysql_lock_retries_total"),
        0,
        "statements run again after a deadlock or lock wait"
    );
}
