//! SPEC S9: the handler's business writes and the record's completion commit in one
//! transaction, or neither does.

mod common;

use std::time::{Duration, Instant};

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{
    ManualClock, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};
use sqlx::AssertSqlSafe;

const LEASE: Duration = Duration::from_secs(60);

/// A business table next to the records table, dropped at the end.
struct Orders {
    table: String,
}

impl Orders {
    async fn create(store: &common::TempStore, ns: &str) -> Orders {
        let table = format!("orders_{ns}");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)"
        )))
        .execute(store.pool())
        .await
        .expect("create orders");
        Orders { table }
    }

    async fn insert(&self, conn: &mut sqlx::PgConnection, id: &str, amount: i64) {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id, amount) VALUES ($1, $2)",
            self.table
        )))
        .bind(id)
        .bind(amount)
        .execute(conn)
        .await
        .expect("insert order");
    }

    async fn count(&self, store: &common::TempStore) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            self.table
        )))
        .fetch_one(store.pool())
        .await
        .expect("count orders")
    }

    async fn drop(self, store: &common::TempStore) {
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {}", self.table)))
            .execute(store.pool())
            .await
            .expect("drop orders");
    }
}

async fn setup(case: &str) -> Option<(common::TempStore, ManualClock, Orders)> {
    let ns = unique_namespace(case);
    let clock = ManualClock::starting_now();
    let store = common::store_with_clock(&clock, &ns).await?;
    let orders = Orders::create(&store, &ns).await;
    Some((store, clock, orders))
}

fn request(key: &str) -> ReserveRequest {
    ReserveRequest::new(
        test_scope("/v1/orders", key),
        test_fingerprint(r#"{"amount":100}"#),
    )
    .lease(LEASE)
}

async fn acquire(store: &common::TempStore, req: &ReserveRequest) -> idem_core::Lease {
    match store.reserve(req).await.expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

fn created() -> StoredResponse {
    StoredResponse::new(201, r#"{"id":"ord_1"}"#).with_header("location", "/v1/orders/ord_1")
}

#[tokio::test]
async fn business_row_and_completion_commit_together() {
    let Some((store, _clock, orders)) = setup("tx_commit").await else {
        return;
    };
    let req = request("commit-key");
    let lease = acquire(&store, &req).await;

    let mut tx = store.pool().begin().await.expect("begin");
    orders.insert(&mut tx, "ord_1", 100).await;
    store
        .complete_in(&mut tx, &lease, &created())
        .await
        .expect("complete in transaction");
    tx.commit().await.expect("commit");

    assert_eq!(orders.count(&store).await, 1);
    let record = store.get(&req.scope).await.expect("get").expect("stored");
    assert_eq!(record.token, lease.token);
    assert!(record.is_completed());
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(created())
    );
    orders.drop(&store).await;
}

#[tokio::test]
async fn rollback_leaves_neither_business_row_nor_completion() {
    let Some((store, clock, orders)) = setup("tx_rollback").await else {
        return;
    };
    let req = request("rollback-key");
    let lease = acquire(&store, &req).await;

    let mut tx = store.pool().begin().await.expect("begin");
    orders.insert(&mut tx, "ord_1", 100).await;
    store
        .complete_in(&mut tx, &lease, &created())
        .await
        .expect("complete in transaction");
    // The worker dies before committing.
    tx.rollback().await.expect("rollback");

    assert_eq!(orders.count(&store).await, 0, "no business row");
    let record = store.get(&req.scope).await.expect("get").expect("stored");
    assert_eq!(record.token, lease.token);
    assert_eq!(
        record.state,
        RecordState::InProgress {
            lease_until: record.created_at.plus(LEASE)
        },
        "the key stays in progress until its lease lapses"
    );
    assert!(matches!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::InProgress { .. }
    ));

    // After the lease, the retry executes cleanly as a recovered attempt.
    clock.advance(LEASE);
    let retry = acquire(&store, &req).await;
    assert_eq!(retry.attempt, 2);
    assert!(retry.recovered());
    let mut tx = store.pool().begin().await.expect("begin");
    orders.insert(&mut tx, "ord_1", 100).await;
    store
        .complete_in(&mut tx, &retry, &created())
        .await
        .expect("complete in transaction");
    tx.commit().await.expect("commit");
    assert_eq!(orders.count(&store).await, 1);
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(created())
    );
    orders.drop(&store).await;
}

#[tokio::test]
async fn completion_in_transaction_then_middleware_complete_keeps_first_response() {
    let Some((store, _clock, orders)) = setup("tx_twice").await else {
        return;
    };
    let req = request("twice-key");
    let lease = acquire(&store, &req).await;
    let mut tx = store.pool().begin().await.expect("begin");
    orders.insert(&mut tx, "ord_1", 100).await;
    store
        .complete_in(&mut tx, &lease, &created())
        .await
        .expect("complete in transaction");
    tx.commit().await.expect("commit");

    // The middleware completes after the handler returns; the handler's answer stays.
    store
        .complete(&lease, &StoredResponse::new(200, "middleware's copy"))
        .await
        .expect("second completion with the same lease");
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(created())
    );
    orders.drop(&store).await;
}

#[tokio::test]
async fn stale_lease_cannot_complete_in_transaction() {
    let Some((store, clock, orders)) = setup("tx_stale").await else {
        return;
    };
    let req = request("stale-key");
    let stale = acquire(&store, &req).await;
    clock.advance(LEASE);
    let current = acquire(&store, &req).await;

    let mut tx = store.pool().begin().await.expect("begin");
    orders.insert(&mut tx, "ord_1", 100).await;
    match store.complete_in(&mut tx, &stale, &created()).await {
        Err(StoreError::Fenced) => {}
        other => panic!("a taken-over attempt must be fenced, got {other:?}"),
    }
    tx.rollback().await.expect("rollback");

    assert_eq!(orders.count(&store).await, 0);
    let record = store.get(&req.scope).await.expect("get").expect("stored");
    assert_eq!(record.token, current.token);
    assert_eq!(record.attempt, 2);
    assert!(!record.is_completed());
    orders.drop(&store).await;
}

#[tokio::test]
async fn retry_during_open_transaction_waits_and_never_acquires() {
    let Some((store, _clock, orders)) = setup("tx_wait").await else {
        return;
    };
    let req = request("wait-key");
    let lease = acquire(&store, &req).await;
    let mut tx = store.pool().begin().await.expect("begin");
    orders.insert(&mut tx, "ord_1", 100).await;
    store
        .complete_in(&mut tx, &lease, &created())
        .await
        .expect("complete in transaction");

    // A retry arriving before the commit must not see a half-done record: its insert
    // waits on the row the transaction locked.
    let retry = {
        let store = store.inner.clone();
        let req = req.clone();
        tokio::spawn(async move { store.reserve(&req).await })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
        )
        .bind(store.table())
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_activity");
        if waiting > 0 {
            break;
        }
        assert!(
            !retry.is_finished(),
            "the retry answered while the completing transaction was open"
        );
        assert!(Instant::now() < deadline, "the retry never blocked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tx.commit().await.expect("commit");
    match retry.await.expect("task").expect("reserve") {
        // The blocked statement's snapshot predates the commit, so it may still report
        // the attempt in progress; it never acquires.
        Reservation::Replay(r) => assert_eq!(r, created()),
        Reservation::InProgress { .. } => {}
        other => panic!("a retry during the transaction got {other:?}"),
    }
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(created())
    );
    assert_eq!(orders.count(&store).await, 1);
    orders.drop(&store).await;
}
