//! The table's shape against the live server: a scope of any length fits its fixed-width
//! key, and gateways starting together migrate one table once.

mod common;

use idem_core::testing::{scope_of, test_fingerprint, unique_namespace};
use idem_core::{MAX_KEY_LEN, Reservation, ReserveRequest, Store, StoredResponse, Tenant};
use idem_mysql::MySqlStore;

/// A key of the longest length, a 16 KiB endpoint and a tenant of 1024 four-byte
/// characters (each far past InnoDB's 3072-byte index limit) reserve, complete and replay:
/// the primary key is the scope's 32-byte digest, whatever the parts' lengths.
#[tokio::test]
async fn a_scope_of_any_length_fits_the_key() {
    let ns = unique_namespace("long");
    let Some(store) = common::connect(MySqlStore::builder(), &ns).await else {
        return;
    };
    let key = "k".repeat(MAX_KEY_LEN);
    let endpoint = format!("/v1/{}", "e".repeat(16 * 1024));
    let scope = scope_of(Tenant::new("🔑".repeat(1024)), &endpoint, &key);
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    let Reservation::Acquired(lease) = store.reserve(&req).await.expect("reserve") else {
        panic!("the first reserve acquires");
    };
    let response = StoredResponse::new(201, "made");
    store.complete(&lease, &response).await.expect("complete");
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(response)
    );
    let record = store.get(&scope).await.expect("get").expect("a record");
    assert_eq!(record.scope, scope, "the parts come back whole");
}

/// Four stores connecting to one new table at once migrate it under `GET_LOCK`: each
/// connects, and the table has each migration once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_starting_together_migrate_the_table_once() {
    let ns = unique_namespace("together");
    let table = common::table_for(&ns);
    let Some(first) = common::connect(MySqlStore::builder().migrate(false), &ns).await else {
        return;
    };
    let url = common::mysql_url();
    let connecting: Vec<_> = (0..4)
        .map(|_| {
            let (url, table) = (url.clone(), table.clone());
            tokio::spawn(async move { MySqlStore::builder().table(table).connect(&url).await })
        })
        .collect();
    for task in connecting {
        task.await.expect("task").expect("connect and migrate");
    }
    let rows: Vec<i32> = sqlx::query_scalar(
        "SELECT version FROM idem_schema_migrations WHERE table_name = ? ORDER BY version",
    )
    .bind(&table)
    .fetch_all(first.pool())
    .await
    .expect("migration rows");
    let expected: Vec<i32> = (1..=idem_mysql::schema::SCHEMA_VERSION).collect();
    assert_eq!(rows, expected);
    idem_mysql::schema::check(first.pool(), &table)
        .await
        .expect("the schema is current");
}
