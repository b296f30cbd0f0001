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
    let Some(inner) = common::connect(PgStore::builder(), &ns).await else {
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
    let Some(inner) = common::connect(PgStore::builder(), &ns).await else {
        return;
    };
    sealing::all(Arc::new(inner)).await;
}

#[tokio::test]
async fn a_sealed_answer_completes_in_the_handlers_transaction() {
    let ns = unique_namespace("sealed_tx");
    let Some(inner) = common::connect(PgStore::builder(), &ns).await else {
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
    let sealed = store.seal(&lease, &known_answer());
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

/// A row's status, headers and body.
type Columns = (i32, Vec<u8>, Vec<u8>);

/// The answer columns of `scope`'s row, as PostgreSQL holds them.
async fn answer_columns(store: &common::TempStore, table: &str, scope: &Scope) -> Columns {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT status, headers, body FROM {table} \
         WHERE tenant = $1 AND endpoint = $2 AND idem_key = $3"
    )))
    .bind(scope.tenant().as_str())
    .bind(scope.endpoint_str())
    .bind(scope.key().as_str())
    .fetch_one(store.pool())
    .await
    .expect("the row")
}

/// Runs `set` (an `UPDATE … SET` list over `$4`, `$5`, …) on `scope`'s row.
async fn update_row(
    store: &common::TempStore,
    table: &str,
    scope: &Scope,
    set: &str,
    values: &[&[u8]],
    status: Option<i32>,
) {
    let sql =
        format!("UPDATE {table} SET {set} WHERE tenant = $1 AND endpoint = $2 AND idem_key = $3");
    let mut query = sqlx::query(AssertSqlSafe(sql))
        .bind(scope.tenant().as_str())
        .bind(scope.endpoint_str())
        .bind(scope.key().as_str());
    if let Some(status) = status {
        query = query.bind(status);
    }
    for value in values {
        query = query.bind(*value);
    }
    let done = query.execute(store.pool()).await.expect("update");
    assert_eq!(done.rows_affected(), 1);
}

async fn set_answer_columns(store: &common::TempStore, table: &str, scope: &Scope, c: &Columns) {
    let set = "status = $4, headers = $5, body = $6";
    update_row(store, table, scope, set, &[&c.1, &c.2], Some(c.0)).await;
}

fn refused(reservation: idem_core::Result<Reservation>, what: &str) {
    match reservation {
        Err(idem_core::StoreError::Sealed(_)) => {}
        other => panic!("{what}: expected StoreError::Sealed, got {other:?}"),
    }
}

/// Rows edited with SQL in a real table: an older attempt's sealed answer written back
/// over a later attempt's, a fingerprint changed to another payload's, and a plain
/// answer written into a sealed store. None opens: each is refused, where a
/// scope-only binding would have replayed the first two.
#[tokio::test]
async fn answers_edited_into_rows_of_the_table_never_open() {
    let ns = unique_namespace("sealed_edit");
    let Some(inner) = common::connect(PgStore::builder(), &ns).await else {
        return;
    };
    let table = common::table_for(&ns);
    let inner = Arc::new(inner);
    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let first = sealing::record_known_answer(&store).await;
    let scope = first.scope.clone();
    let older = answer_columns(&inner, &table, &scope).await;

    // A later attempt of the same key and payload (the first record removed), with an
    // answer of its own; the first attempt's columns are then written back over it.
    assert!(inner.remove(&scope).await.unwrap());
    let Reservation::Acquired(lease) = store.reserve(&first).await.unwrap() else {
        panic!("acquire");
    };
    store
        .complete(&lease, &StoredResponse::new(201, "ch_2"))
        .await
        .unwrap();
    let later = answer_columns(&inner, &table, &scope).await;
    assert_ne!(later, older);
    set_answer_columns(&inner, &table, &scope, &older).await;
    refused(store.reserve(&first).await, "an older attempt's answer");
    set_answer_columns(&inner, &table, &scope, &later).await;
    match store.reserve(&first).await.unwrap() {
        Reservation::Replay(answer) => assert_eq!(answer.body, "ch_2"),
        other => panic!("its own answer, put back: {other:?}"),
    }

    // The fingerprint changed to another payload's: that payload's request matches the
    // row, and its answer still does not open; the original payload mismatches.
    let other = ReserveRequest::new(scope.clone(), test_fingerprint(r#"{"amount":999}"#));
    let fingerprint = "fingerprint = $4";
    update_row(
        &inner,
        &table,
        &scope,
        fingerprint,
        &[other.fingerprint.as_bytes().as_slice()],
        None,
    )
    .await;
    refused(store.reserve(&other).await, "another payload's fingerprint");
    assert!(matches!(
        store.reserve(&first).await.unwrap(),
        Reservation::Mismatch
    ));

    // The fingerprint put back, and a plain answer written into the sealed store.
    update_row(
        &inner,
        &table,
        &scope,
        fingerprint,
        &[first.fingerprint.as_bytes().as_slice()],
        None,
    )
    .await;
    let plain = (
        201,
        idem_core::codec::encode_headers(&[]),
        b"{\"id\":\"ch_forged\"}".to_vec(),
    );
    set_answer_columns(&inner, &table, &scope, &plain).await;
    refused(store.reserve(&first).await, "a plain answer");
    assert!(matches!(
        store.get(&scope).await,
        Err(idem_core::StoreError::Sealed(_))
    ));
}
