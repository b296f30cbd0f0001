//! SPEC S8: expired rows go in bounded batches, through the expiry index, and a
//! sweeper keeps the table bounded under a constant request rate.

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{
    ManualClock, Reservation, ReserveRequest, Store, StoredResponse, SweeperConfig, sweep_once,
};
use idem_sqlite::SqliteStore;

async fn open(dir: &tempfile::TempDir, clock: &ManualClock) -> SqliteStore {
    SqliteStore::builder()
        .clock(Arc::new(clock.clone()))
        .connect(&format!("sqlite://{}", dir.path().join("p.db").display()))
        .await
        .unwrap()
}

async fn count(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn purge_walks_the_expiry_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, &ManualClock::starting_now()).await;
    // EXPLAIN QUERY PLAN rows: id, parent, notused, detail.
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(
        "EXPLAIN QUERY PLAN DELETE FROM idem_records WHERE rowid IN \
         (SELECT rowid FROM idem_records WHERE expires_at <= 1 LIMIT 10)",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    let plan: Vec<String> = plan.into_iter().map(|r| r.3).collect();
    println!("{plan:?}");
    assert!(
        plan.iter().any(
            |d| d.contains("USING COVERING INDEX idem_records_expires_at")
                || d.contains("USING INDEX idem_records_expires_at")
        ),
        "purge must not scan the table: {plan:?}"
    );
}

#[tokio::test]
async fn sweeper_keeps_the_table_bounded_under_a_constant_rate() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = open(&dir, &clock).await;
    let ttl = Duration::from_secs(10);
    let config = SweeperConfig {
        every: ttl,
        batch: 16,
        max_batches: 100,
    };
    let mut peak = 0;
    for round in 0..20 {
        // One TTL's worth of requests, then the sweeper's tick.
        for i in 0..50 {
            let req = ReserveRequest::new(
                test_scope("/v1/orders", &format!("r{round}-{i}")),
                test_fingerprint("{}"),
            )
            .ttl(ttl)
            .lease(Duration::from_secs(5));
            let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
                panic!("fresh key acquires")
            };
            store
                .complete(&lease, &StoredResponse::new(201, "ok"))
                .await
                .unwrap();
        }
        peak = peak.max(count(&store).await);
        clock.advance(ttl);
        let removed = sweep_once(&store, config).await;
        assert_eq!(removed, 50, "round {round}: the previous TTL's records go");
        assert_eq!(count(&store).await, 0);
    }
    assert_eq!(peak, 50, "never more than one TTL's worth of records");
}
