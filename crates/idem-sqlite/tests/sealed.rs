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
    let sealed = store.seal(&lease.scope, &known_answer());
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
