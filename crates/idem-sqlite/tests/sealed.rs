//! Sealed records over SQLite (SPEC S17): the database file holds no recorded body or
//! header in plain text, the sealing cases hold, and same-transaction completion
//! (SPEC S9) still works with a sealed answer.

use std::path::Path;
use std::sync::Arc;

use idem_core::testing::sealing::{self, KNOWN_BODY, KNOWN_HEADER, known_answer, ring};
use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{Reservation, ReserveRequest, Sealed, Store};
use idem_sqlite::SqliteStore;

async fn store(dir: &Path, name: &str) -> Arc<SqliteStore> {
    let url = format!("sqlite://{}", dir.join(name).display());
    Arc::new(SqliteStore::connect(&url).await.expect("open"))
}

/// Every byte SQLite keeps for `name`: the file and its write-ahead log.
fn file_bytes(dir: &Path, name: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for suffix in ["", "-wal", "-journal"] {
        if let Ok(b) = std::fs::read(dir.join(format!("{name}{suffix}"))) {
            bytes.extend(b);
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn the_database_file_holds_no_sealed_body_or_header() {
    let dir = tempfile::tempdir().unwrap();
    // The control: unsealed, the file shows the body, so the search below can see it.
    let plain = store(dir.path(), "plain.db").await;
    sealing::record_known_answer(&*plain).await;
    plain.close().await;
    let bytes = file_bytes(dir.path(), "plain.db");
    assert!(contains(&bytes, KNOWN_BODY) && contains(&bytes, KNOWN_HEADER));

    let inner = store(dir.path(), "sealed.db").await;
    let sealed = Sealed::new(inner.clone(), ring("k1", 1));
    let request = sealing::record_known_answer(&sealed).await;
    match sealed.reserve(&request).await.unwrap() {
        Reservation::Replay(answer) => assert_eq!(answer, known_answer()),
        other => panic!("{other:?}"),
    }
    inner.close().await;
    let bytes = file_bytes(dir.path(), "sealed.db");
    assert!(!bytes.is_empty());
    assert!(!contains(&bytes, KNOWN_BODY), "the body is in the file");
    assert!(
        !contains(&bytes, b"4242424242424242"),
        "the card is in the file"
    );
    assert!(!contains(&bytes, KNOWN_HEADER), "a header is in the file");
}

#[tokio::test]
async fn sealing_cases_hold_over_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    sealing::all(store(dir.path(), "cases.db").await).await;
}

#[tokio::test]
async fn a_sealed_answer_completes_in_the_handlers_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let inner = store(dir.path(), "shop.db").await;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)")
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
    let mut tx = inner.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES ('ord_1')")
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
    // The middleware completes after the handler: the first answer stays.
    store
        .complete(&lease, &idem_core::StoredResponse::new(500, "later"))
        .await
        .unwrap();
    match store.reserve(&request).await.unwrap() {
        Reservation::Replay(answer) => assert_eq!(answer, known_answer()),
        other => panic!("{other:?}"),
    }
    let raw = sealing::raw_answer(&*inner, &request.scope).await;
    assert!(idem_core::seal::is_sealed(&raw));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(inner.pool())
        .await
        .unwrap();
    assert_eq!(orders, 1);
}

/// The answer columns of `key`'s row, as SQLite holds them.
async fn answer_columns(store: &SqliteStore, key: &str) -> (i64, Vec<u8>, Vec<u8>) {
    sqlx::query_as("SELECT status, headers, body FROM idem_records WHERE idem_key = ?")
        .bind(key)
        .fetch_one(store.pool())
        .await
        .expect("the row")
}

async fn set_answer_columns(
    store: &SqliteStore,
    key: &str,
    (status, headers, body): &(i64, Vec<u8>, Vec<u8>),
) {
    let done =
        sqlx::query("UPDATE idem_records SET status = ?, headers = ?, body = ? WHERE idem_key = ?")
            .bind(status)
            .bind(headers)
            .bind(body)
            .bind(key)
            .execute(store.pool())
            .await
            .expect("update");
    assert_eq!(done.rows_affected(), 1);
}

fn refused(reservation: idem_core::Result<Reservation>, what: &str) {
    match reservation {
        Err(idem_core::StoreError::Sealed(_)) => {}
        other => panic!("{what}: expected StoreError::Sealed, got {other:?}"),
    }
}

/// Rows edited with SQL in the database file itself: an older attempt's sealed answer
/// written back over a later attempt's, a fingerprint changed to another payload's, and
/// a plain answer written into a sealed store. None opens: each is refused, where a
/// scope-only binding would have replayed the first two.
#[tokio::test]
async fn answers_edited_into_rows_of_the_file_never_open() {
    let dir = tempfile::tempdir().unwrap();
    let inner = store(dir.path(), "edited.db").await;
    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let first = sealing::record_known_answer(&store).await;
    let key = first.scope.key().as_str().to_owned();
    let older = answer_columns(&inner, &key).await;

    // A later attempt of the same key and payload (the first record removed), with an
    // answer of its own; the first attempt's columns are then written back over it.
    assert!(inner.remove(&first.scope).await.unwrap());
    let Reservation::Acquired(lease) = store.reserve(&first).await.unwrap() else {
        panic!("acquire");
    };
    store
        .complete(&lease, &idem_core::StoredResponse::new(201, "ch_2"))
        .await
        .unwrap();
    let later = answer_columns(&inner, &key).await;
    assert_ne!(later, older);
    set_answer_columns(&inner, &key, &older).await;
    refused(store.reserve(&first).await, "an older attempt's answer");
    set_answer_columns(&inner, &key, &later).await;
    match store.reserve(&first).await.unwrap() {
        Reservation::Replay(answer) => assert_eq!(answer.body, "ch_2"),
        other => panic!("its own answer, put back: {other:?}"),
    }

    // The fingerprint changed to another payload's: that payload's request would match
    // the row, and its answer must still not open.
    let other = ReserveRequest::new(first.scope.clone(), test_fingerprint(r#"{"amount":999}"#));
    sqlx::query("UPDATE idem_records SET fingerprint = ? WHERE idem_key = ?")
        .bind(other.fingerprint.as_bytes().as_slice())
        .bind(&key)
        .execute(inner.pool())
        .await
        .unwrap();
    refused(store.reserve(&other).await, "another payload's fingerprint");
    // The original payload now differs from the row: a mismatch, nothing opened.
    assert!(matches!(
        store.reserve(&first).await.unwrap(),
        Reservation::Mismatch
    ));

    // The fingerprint put back, and a plain answer written into the sealed store.
    sqlx::query("UPDATE idem_records SET fingerprint = ? WHERE idem_key = ?")
        .bind(first.fingerprint.as_bytes().as_slice())
        .bind(&key)
        .execute(inner.pool())
        .await
        .unwrap();
    let plain = (
        201,
        idem_core::codec::encode_headers(&[]),
        b"{\"id\":\"ch_forged\"}".to_vec(),
    );
    set_answer_columns(&inner, &key, &plain).await;
    refused(store.reserve(&first).await, "a plain answer");
    assert!(matches!(
        store.get(&first.scope).await,
        Err(idem_core::StoreError::Sealed(_))
    ));
}
