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

/// A table at schema version 1 (before the key-rate buckets) is brought up: a store
/// that must not migrate refuses it, naming both versions; the dry run lists the
/// buckets table and its row only; the migration adds them, keeping the records; and
/// the buckets then work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_at_version_1_is_brought_up_to_the_buckets() {
    use idem_mysql::schema;
    let ns = unique_namespace("v1");
    let table = common::table_for(&ns);
    let Some(store) = common::connect(MySqlStore::builder(), &ns).await else {
        return;
    };
    let req = ReserveRequest::new(
        scope_of(Tenant::new("t"), "/v1/charges", "kept"),
        test_fingerprint("{}"),
    );
    store.reserve(&req).await.expect("reserve");
    // Back to version 1, as a table the previous build made.
    for statement in [
        format!("DROP TABLE {}", schema::rate_table(&table)),
        format!("DELETE FROM idem_schema_migrations WHERE table_name = '{table}' AND version > 1"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(store.pool())
            .await
            .expect("undo migration 2");
    }
    let refused = schema::check(store.pool(), &table).await.unwrap_err();
    assert!(
        matches!(
            &refused,
            idem_core::SetupError::SchemaVersion { found, supported, .. }
                if *found == 1 && *supported == 2
        ),
        "{refused:?}"
    );
    let plan = schema::migration_statements(&table, 1).unwrap();
    assert_eq!(plan.len(), 3, "{plan:#?}");
    assert!(plan[0].contains("CREATE TABLE IF NOT EXISTS idem_schema_migrations"));
    assert!(plan[1].contains(&format!("CREATE TABLE IF NOT EXISTS {table}_rate")));
    assert!(
        plan[2].ends_with(&format!("VALUES ('{table}', 2)")),
        "{}",
        plan[2]
    );

    store.migrate().await.expect("migrate");
    schema::check(store.pool(), &table).await.expect("current");
    assert!(
        store.get(&req.scope).await.unwrap().is_some(),
        "the record stays"
    );
    let rate = idem_core::KeyRate::new(1.0, 1).unwrap();
    assert_eq!(store.take_rate_token("t", &rate).await.unwrap(), Some(true));
    assert_eq!(
        store.take_rate_token("t", &rate).await.unwrap(),
        Some(false)
    );
}
