//! SPEC S9: a handler's business writes and the key's completion commit in one
//! transaction, or neither does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{
    Lease, ManualClock, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};
use idem_sqlite::SqliteStore;

const LEASE: Duration = Duration::from_secs(60);

struct Fixture {
    store: SqliteStore,
    clock: ManualClock,
    req: ReserveRequest,
    executions: AtomicUsize,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("shop.db").display());
        let clock = ManualClock::starting_now();
        let store = SqliteStore::builder()
            .clock(Arc::new(clock.clone()))
            .connect(&url)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        let req = ReserveRequest::new(
            test_scope("/v1/orders", "order-key"),
            test_fingerprint(r#"{"amount":100}"#),
        )
        .lease(LEASE);
        Fixture {
            store,
            clock,
            req,
            executions: AtomicUsize::new(0),
            _dir: dir,
        }
    }

    async fn acquire(&self) -> Lease {
        match self.store.reserve(&self.req).await.unwrap() {
            Reservation::Acquired(lease) => lease,
            other => panic!("expected to acquire, got {other:?}"),
        }
    }

    /// The handler: inserts the order and completes the key in one transaction, and
    /// commits only if `commit`. Returns the completion's outcome.
    async fn handle(&self, lease: &Lease, commit: bool) -> Result<(), StoreError> {
        self.executions.fetch_add(1, Ordering::SeqCst);
        let mut tx = self
            .store
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .unwrap();
        sqlx::query("INSERT INTO orders (id, amount) VALUES ('ord_1', 100)")
            .execute(&mut *tx)
            .await
            .unwrap();
        let completed = self
            .store
            .complete_in(&mut tx, lease, &response(lease.attempt))
            .await;
        if commit && completed.is_ok() {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        completed
    }

    async fn orders(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }
}

fn response(attempt: u32) -> StoredResponse {
    StoredResponse::new(201, format!(r#"{{"id":"ord_1","attempt":{attempt}}}"#))
        .with_header("content-type", "application/json")
}

#[tokio::test]
async fn business_write_and_completion_commit_together() {
    let f = Fixture::new().await;
    let lease = f.acquire().await;
    f.handle(&lease, true).await.unwrap();
    assert_eq!(f.orders().await, 1);
    let record = f.store.get(&f.req.scope).await.unwrap().unwrap();
    assert!(
        matches!(&record.state, RecordState::Completed { response: r, .. } if *r == response(1))
    );
    // The middleware completing after the handler keeps the handler's response.
    f.store
        .complete(&lease, &StoredResponse::new(500, "later"))
        .await
        .unwrap();
    assert_eq!(
        f.store.reserve(&f.req).await.unwrap(),
        Reservation::Replay(response(1))
    );
    assert_eq!(f.executions.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn rollback_leaves_neither_and_the_retry_executes_cleanly() {
    let f = Fixture::new().await;
    let first = f.acquire().await;
    // The completion itself succeeds inside the transaction, but nothing commits:
    // as if the process died before COMMIT.
    f.handle(&first, false).await.unwrap();
    assert_eq!(f.orders().await, 0, "no business row");
    let record = f.store.get(&f.req.scope).await.unwrap().unwrap();
    assert_eq!(record.token, first.token);
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    // Until the lease lapses, retries wait (asked back in a second: the attempt has
    // only just begun).
    assert_eq!(
        f.store.reserve(&f.req).await.unwrap(),
        Reservation::InProgress {
            retry_after: Duration::from_secs(1)
        }
    );

    f.clock.advance(LEASE);
    let second = f.acquire().await;
    assert_eq!(second.attempt, 2);
    assert!(second.recovered());
    f.handle(&second, true).await.unwrap();
    assert_eq!(f.orders().await, 1, "exactly one order");
    let record = f.store.get(&f.req.scope).await.unwrap().unwrap();
    assert_eq!(record.attempt, 2);
    assert_eq!(record.token, second.token);
    assert_eq!(
        f.store.reserve(&f.req).await.unwrap(),
        Reservation::Replay(response(2))
    );
    assert!(matches!(
        f.store.complete(&first, &response(1)).await,
        Err(StoreError::Fenced)
    ));
    assert_eq!(f.executions.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn taken_over_attempt_cannot_complete_in_its_transaction() {
    let f = Fixture::new().await;
    let stale = f.acquire().await;
    f.clock.advance(LEASE);
    let current = f.acquire().await;
    // The slow first attempt finally tries to commit its order: fenced, rolled back.
    assert!(matches!(
        f.handle(&stale, true).await,
        Err(StoreError::Fenced)
    ));
    assert_eq!(f.orders().await, 0);
    let record = f.store.get(&f.req.scope).await.unwrap().unwrap();
    assert_eq!(record.token, current.token);
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    f.handle(&current, true).await.unwrap();
    assert_eq!(f.orders().await, 1);
}
