//! Sealed records over PostgreSQL (SPEC S17): the table's columns hold no recorded
//! body or header in plain text (what a dump would copy), the sealing cases hold, and
//! same-transaction completion (SPEC S9) still works with a sealed answer.

mod common;

use std::sync::Arc;

use idem_core::testing::sealing::{self, KNOWN_BODY, KNOWN_HEADER, known_answer, ring};
use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{Reservation, ReserveRequest, Scope, Sealed, Store, StoredResponse};
use idem_postgres::PgStore;
use sqlx::AssertSqlSafe;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every column of `scope`'s row, as the bytes PostgreSQL sends for its text form.
async fn row_bytes(store: &common::TempStore, ns: &str, scope: &Scope) -> Vec<u8> {
    let table = common::table_for(ns);
    let row: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT t::text || encode(coalesce(headers, ''), 'escape') || encode(coalesce(body, ''), 'escape') \
         FROM {table} t WHERE tenant = $1 AND endpoint = $2 AND idem_key = $3"
    )))
    .bind(scope.tenant().as_str())
    .bind(scope.endpoint_str())
    .bind(scope.key().as_str())
    .fetch_one(store.pool())
    .await
    .expect("the row");
    row.into_bytes()
}

#[tokio::test]
async fn the_table_holds_no_sealed_body_or_header() {
    let ns = unique_namespace("sealed_raw");
    let Some(inner) = common::connect(PgStore::options(), &ns).await else {
        return;
    };
    let inner = Arc::new(inner);
    // The control: unsealed, the row shows the body, so the search below can see it.
    let plain = sealing::record_known_answer(&*inner).await;
    let bytes = row_bytes(&inner, &ns, &plain.scope).await;
    assert!(contains(&bytes, KNOWN_BODY) && contains(&bytes, KNOWN_HEADER));

    let sealed = Sealed::new(inner.clone(), ring("k1", 1));
    let request = sealing::record_known_answer(&sealed).await;
    match sealed.reserve(&request).await.unwrap() {
        Reservation::Replay(answer) => assert_eq!(answer, known_answer()),
        other => panic!("{other:?}"),
    }
    let bytes = row_bytes(&inner, &ns, &request.scope).await;
    assert!(!contains(&bytes, KNOWN_BODY), "the body is in the row");
    assert!(
        !contains(&bytes, b"4242424242424242"),
        "the card is in the row"
    );
    assert!(!contains(&bytes, KNOWN_HEADER), "a header is in the row");
}

#[tokio::test]
async fn sealing_cases_hold_over_postgres() {
    let ns = unique_namespace("sealed_cases");
    let Some(inner) = common::connect(PgStore::options(), &ns).await else {
        return;
    };
    sealing::all(Arc::new(inner)).await;
}

#[tokio::test]
async fn a_sealed_answer_completes_in_the_handlers_transaction() {
    let ns = unique_namespace("sealed_tx");
    let Some(inner) = common::connect(PgStore::options(), &ns).await else {
        return;
    };
    let inner = Arc::new(inner);
    let orders = format!("orders_{ns}");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id TEXT PRIMARY KEY)"
    )))
    .execute(inner.pool())
    .await
    .unwrap();
    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let request = ReserveRequest::new(
        test_scope("/v1/orders", "sealed-tx"),
        test_fingerprint("{}"),
    );
    let Reservation::Acquired(lease) = store.reserve(&request).await.unwrap() else {
        panic!("acquire")
    };
    let mut tx = inner.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {orders} (id) VALUES ('ord_1')"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let sealed = store.seal(&lease.scope, &known_answer());
    store
        .inner()
        .complete_in(&mut tx, &lease, &sealed)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    store
        .complete(&lease, &StoredResponse::new(500, "later"))
        .await
        .unwrap();
    match store.reserve(&request).await.unwrap() {
        Reservation::Replay(answer) => assert_eq!(answer, known_answer()),
        other => panic!("{other:?}"),
    }
    let bytes = row_bytes(&inner, &ns, &request.scope).await;
    assert!(!contains(&bytes, KNOWN_BODY));
    let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {orders}")))
        .fetch_one(inner.pool())
        .await
        .unwrap();
    assert_eq!(count, 1);
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {orders}")))
        .execute(inner.pool())
        .await
        .unwrap();
}
