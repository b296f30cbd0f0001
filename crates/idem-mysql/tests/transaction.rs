//! Same-transaction completion (SPEC S9): the record completes in the application's own
//! MySQL transaction, beside its business rows, and a business `UNIQUE` constraint
//! stands as the second layer.

mod common;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{
    Lease, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};
use idem_mysql::MySqlStore;
use sqlx::AssertSqlSafe;

async fn acquire(store: &MySqlStore, key: &str) -> Lease {
    let req = ReserveRequest::new(test_scope("/v1/orders", key), test_fingerprint("{}"));
    match store.reserve(&req).await.expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// A committed transaction keeps the order and the answer together; a rolled-back one
/// keeps neither, and the record stays in progress for the middleware to settle; a
/// stale lease is fenced inside the transaction; a second order with the same business
/// id is refused by the `UNIQUE` constraint whatever the keys say.
#[tokio::test]
async fn the_answer_commits_or_rolls_back_with_the_business_rows() {
    let ns = unique_namespace("tx");
    let Some(store) = common::connect(MySqlStore::builder(), &ns).await else {
        return;
    };
    let orders = format!("orders_{ns}");
    let run = async |sql: String| {
        sqlx::query(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .expect("statement")
    };
    run(format!(
        "CREATE TABLE {orders} (id BIGINT AUTO_INCREMENT PRIMARY KEY,
                                reference VARCHAR(64) NOT NULL UNIQUE) ENGINE=InnoDB"
    ))
    .await;
    let insert = format!("INSERT INTO {orders} (reference) VALUES (?)");
    let response = StoredResponse::new(201, r#"{"id":"ord_1"}"#);

    let lease = acquire(&store, "commit").await;
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(insert.clone()))
        .bind("ord_1")
        .execute(&mut *tx)
        .await
        .unwrap();
    store.complete_in(&mut tx, &lease, &response).await.unwrap();
    tx.commit().await.unwrap();
    let record = store.get(&lease.scope).await.unwrap().expect("record");
    assert!(
        matches!(record.state, RecordState::Completed { .. }),
        "{record:?}"
    );
    // The middleware completing after the handler did is no conflict.
    store.complete(&lease, &response).await.unwrap();

    let lease = acquire(&store, "rollback").await;
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(insert.clone()))
        .bind("ord_2")
        .execute(&mut *tx)
        .await
        .unwrap();
    store.complete_in(&mut tx, &lease, &response).await.unwrap();
    tx.rollback().await.unwrap();
    let record = store.get(&lease.scope).await.unwrap().expect("record");
    assert!(
        matches!(record.state, RecordState::InProgress { .. }),
        "{record:?}"
    );

    let stale = Lease {
        token: idem_core::FencingToken::generate(),
        ..acquire(&store, "stale").await
    };
    let mut tx = store.pool().begin().await.unwrap();
    let e = store
        .complete_in(&mut tx, &stale, &response)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Fenced), "{e:?}");
    tx.rollback().await.unwrap();

    let lease = acquire(&store, "another key, the same order").await;
    let mut tx = store.pool().begin().await.unwrap();
    let refused = sqlx::query(AssertSqlSafe(insert.clone()))
        .bind("ord_1")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    tx.rollback().await.unwrap();
    store.release(&lease).await.unwrap();
    let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {orders}")))
        .fetch_one(store.pool())
        .await
        .unwrap();
    run(format!("DROP TABLE {orders}")).await;
    assert!(
        refused
            .as_database_error()
            .is_some_and(|e| e.is_unique_violation()),
        "{refused}"
    );
    assert_eq!(count, 1, "only the committed order is kept");
}
