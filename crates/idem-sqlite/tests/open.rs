//! Opening a store: connection settings, the embedded migration, configuration errors,
//! and failing closed when the database is gone.

use std::sync::Arc;

use idem_core::codec::encode_headers;
use idem_core::testing::test_fingerprint;
use idem_core::{
    Endpoint, Key, ManualClock, Reservation, ReserveRequest, Scope, ScopeMode, Store, StoreError,
    StoredResponse, Tenant,
};
use idem_sqlite::{SetupError, SqliteStore};
use idem_test_support::figure;
use sqlx::Row;

fn db_url(dir: &tempfile::TempDir, name: &str) -> String {
    format!("sqlite://{}", dir.path().join(name).display())
}

#[tokio::test]
async fn connect_creates_the_file_in_wal_mode_with_normal_sync_and_busy_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    assert!(!path.exists());
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert!(path.exists());
    let mut conn = store.pool().acquire().await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(sync, 1, "NORMAL");
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(busy, 5000);
}

#[tokio::test]
async fn migration_is_idempotent_and_versioned_per_table() {
    let dir = tempfile::tempdir().unwrap();
    let url = db_url(&dir, "m.db");
    // Two stores migrating one fresh file at once, then once more, then another table.
    let (a, b) = tokio::join!(SqliteStore::connect(&url), SqliteStore::connect(&url));
    let (a, _b) = (a.unwrap(), b.unwrap());
    SqliteStore::connect(&url).await.unwrap();
    SqliteStore::builder()
        .table("other_records")
        .connect(&url)
        .await
        .unwrap();
    let versions: Vec<(String, i64)> =
        sqlx::query_as("SELECT table_name, version FROM idem_schema_versions ORDER BY 1")
            .fetch_all(a.pool())
            .await
            .unwrap();
    assert_eq!(
        versions,
        vec![
            ("idem_records".to_owned(), idem_sqlite::SCHEMA_VERSION),
            ("other_records".to_owned(), idem_sqlite::SCHEMA_VERSION)
        ]
    );
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idem_records' \
         AND sql IS NOT NULL",
    )
    .fetch_all(a.pool())
    .await
    .unwrap();
    assert_eq!(
        indexes,
        vec![
            "idem_records_expires_at".to_owned(),
            "idem_records_ambiguity".to_owned()
        ]
    );
}

/// A file written by a version-1 build: its records survive the version-2 rebuild
/// (tombstones) with their answers, and replay.
#[tokio::test]
async fn a_version_1_file_is_migrated_with_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let url = db_url(&dir, "v1.db");
    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::new("t-1"),
        Endpoint::new("POST", "/v1/charges"),
        Key::new("k-1").unwrap(),
    );
    let fingerprint = test_fingerprint("{}");
    let answer = StoredResponse::new(201, "charged").with_header("content-type", "text/plain");
    {
        // Version 1's table, exactly as that build made it, and one completed record.
        let store = SqliteStore::connect(&url).await.unwrap();
        let pool = store.pool();
        for sql in [
            "DROP TABLE idem_records",
            "CREATE TABLE idem_records (
                tenant TEXT NOT NULL, endpoint TEXT NOT NULL, idem_key TEXT NOT NULL,
                fingerprint BLOB NOT NULL, created_at INTEGER NOT NULL,
                expires_at INTEGER NOT NULL, attempt INTEGER NOT NULL, token INTEGER NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed')),
                lease_until INTEGER, status INTEGER, headers BLOB, body BLOB,
                completed_at INTEGER, PRIMARY KEY (tenant, endpoint, idem_key))",
            "CREATE INDEX idem_records_expires_at ON idem_records (expires_at)",
            "UPDATE idem_schema_versions SET version = 1",
        ] {
            sqlx::query(sql).execute(pool).await.unwrap();
        }
        sqlx::query(
            "INSERT INTO idem_records VALUES (?1, ?2, ?3, ?4, 0, 9000000000000, 1, 7,
                 'completed', NULL, 201, ?5, ?6, 10)",
        )
        .bind(scope.tenant().as_str())
        .bind(scope.endpoint_str())
        .bind(scope.key().as_str())
        .bind(&fingerprint.as_bytes()[..])
        .bind(encode_headers(&answer.headers))
        .bind(&b"charged"[..])
        .execute(pool)
        .await
        .unwrap();
        store.close().await;
    }
    let store = SqliteStore::connect(&url).await.unwrap();
    let version: i64 =
        sqlx::query_scalar("SELECT version FROM idem_schema_versions WHERE table_name = ?1")
            .bind("idem_records")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(version, idem_sqlite::SCHEMA_VERSION);
    let record = store.get(&scope).await.unwrap().expect("kept");
    assert_eq!(record.tombstone_until, None);
    assert_eq!(
        store
            .reserve(&ReserveRequest::new(scope.clone(), fingerprint))
            .await
            .unwrap(),
        Reservation::Replay(answer)
    );
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idem_records' \
         AND sql IS NOT NULL",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        indexes,
        vec![
            "idem_records_expires_at".to_owned(),
            "idem_records_ambiguity".to_owned()
        ]
    );
}

#[tokio::test]
async fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = db_url(&dir, "future.db");
    let store = SqliteStore::connect(&url).await.unwrap();
    sqlx::query("UPDATE idem_schema_versions SET version = 99")
        .execute(store.pool())
        .await
        .unwrap();
    let e = SqliteStore::connect(&url)
        .await
        .map(drop)
        .expect_err("a newer schema is refused");
    match &e {
        SetupError::SchemaVersion {
            kind: "sqlite",
            at,
            found,
            supported,
        } => {
            assert_eq!(at, "table idem_records");
            assert_eq!(*found, 99);
            assert_eq!(*supported, idem_sqlite::SCHEMA_VERSION);
        }
        other => panic!("expected SchemaVersion, got {other:?}"),
    }
    assert!(e.to_string().contains("newer than version"), "{e}");
}

#[tokio::test]
async fn invalid_table_name_is_refused_before_opening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.db");
    let result = SqliteStore::builder()
        .table("records; DROP TABLE orders")
        .connect(&format!("sqlite://{}", path.display()))
        .await;
    assert!(
        matches!(&result, Err(SetupError::Namespace { kind: "sqlite", name, .. })
            if name == "records; DROP TABLE orders"),
        "{:?}",
        result.map(|_| ())
    );
    assert!(!path.exists());
}

#[tokio::test]
async fn from_pool_shares_the_applications_pool() {
    let dir = tempfile::tempdir().unwrap();
    let builder = SqliteStore::builder().table("app_keys");
    let options = builder.connect_options(&db_url(&dir, "app.db")).unwrap();
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let store = builder.from_pool(pool.clone()).await.unwrap();
    assert_eq!(store.table(), "app_keys");
    let req = ReserveRequest::new(
        idem_core::testing::test_scope("/x", "k"),
        test_fingerprint("{}"),
    );
    assert!(matches!(
        store.reserve(&req).await.unwrap(),
        Reservation::Acquired(_)
    ));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM app_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn rows_follow_the_documented_schema() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = SqliteStore::builder()
        .clock(Arc::new(clock.clone()))
        .connect(&db_url(&dir, "schema.db"))
        .await
        .unwrap();
    let scope = Scope::new(
        ScopeMode::Internal,
        Tenant::new("acct_1"),
        Endpoint::new("POST", "/v1/transfers"),
        Key::new("k-1").unwrap(),
    );
    let fp = test_fingerprint("{}");
    let req = ReserveRequest::new(scope, fp);
    let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
        panic!("first reserve acquires")
    };
    let resp = StoredResponse::new(201, "made").with_header("location", "/t/1");
    store.complete(&lease, &resp).await.unwrap();
    let row = sqlx::query("SELECT * FROM idem_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let now = idem_core::Clock::now(&clock).as_millis();
    assert_eq!(row.get::<String, _>("tenant"), "acct_1");
    assert_eq!(row.get::<String, _>("endpoint"), "", "internal mode");
    assert_eq!(row.get::<String, _>("idem_key"), "k-1");
    assert_eq!(row.get::<Vec<u8>, _>("fingerprint"), fp.as_bytes().to_vec());
    assert_eq!(row.get::<i64, _>("created_at"), now);
    assert_eq!(
        row.get::<i64, _>("expires_at"),
        req.expires_at(idem_core::Timestamp::from_millis(now))
            .as_millis()
    );
    assert_eq!(row.get::<i64, _>("attempt"), 1);
    assert_eq!(row.get::<i64, _>("token"), lease.token.as_i64());
    assert_eq!(row.get::<String, _>("state"), "completed");
    assert_eq!(row.get::<i64, _>("status"), 201);
    assert_eq!(
        row.get::<Vec<u8>, _>("headers"),
        idem_core::codec::encode_response_headers(&resp, false)
    );
    assert_eq!(row.get::<Vec<u8>, _>("body"), b"made");
    assert_eq!(row.get::<i64, _>("completed_at"), now);
}

#[tokio::test]
async fn closed_database_fails_closed_as_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(&db_url(&dir, "gone.db"))
        .await
        .unwrap();
    store.pool().close().await;
    let req = ReserveRequest::new(
        idem_core::testing::test_scope("/x", "k"),
        test_fingerprint("{}"),
    );
    assert!(matches!(
        store.reserve(&req).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(
        store.ping().await,
        Err(StoreError::Unavailable(_))
    ));
}

#[tokio::test]
async fn unopenable_path_is_a_database_error() {
    let dir = tempfile::tempdir().unwrap();
    // Its "directory" is a file.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let url = format!("sqlite://{}", file.join("x.db").display());
    match SqliteStore::connect(&url).await {
        Err(SetupError::Failed {
            kind: "sqlite",
            source,
        }) => assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}"),
        other => panic!("expected a database error, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn a_missing_directory_is_named_and_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("no/such/dir/x.db").display());
    match SqliteStore::connect(&url).await {
        Err(SetupError::Invalid {
            kind: "sqlite",
            reason,
        }) => {
            let missing = dir.path().join("no/such/dir").display().to_string();
            assert_eq!(
                reason,
                format!("the directory {missing} of the database file does not exist")
            );
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(!dir.path().join("no").exists());
}

/// The value of `PRAGMA name` on one of the store's pooled connections.
async fn pragma(store: &SqliteStore, name: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("PRAGMA {name}")))
        .fetch_one(store.pool())
        .await
        .unwrap_or_else(|e| panic!("PRAGMA {name}: {e}"))
}

#[tokio::test]
async fn synchronous_comes_from_the_url() {
    let dir = tempfile::tempdir().unwrap();
    // Among SQLite's own parameters, which still apply: `mode=rwc` creates the file.
    let full = SqliteStore::connect(&format!(
        "{}?mode=rwc&synchronous=FULL",
        db_url(&dir, "b.db")
    ))
    .await
    .unwrap();
    assert_eq!(pragma(&full, "synchronous").await, 2, "FULL from the URL");
    assert!(dir.path().join("b.db").exists());
    assert_eq!(figure(&full, "idem_sqlite_synchronous_off"), 0);

    // Allowed, and said: commits that are never synced may be lost or corrupted.
    let off = SqliteStore::connect(&format!("{}?synchronous=off", db_url(&dir, "o.db")))
        .await
        .unwrap();
    assert_eq!(pragma(&off, "synchronous").await, 0);
    assert_eq!(figure(&off, "idem_sqlite_synchronous_off"), 1);

    let e = SqliteStore::connect(&format!("{}?synchronous=sometimes", db_url(&dir, "c.db")))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("synchronous"), "{e}");
    assert!(
        !dir.path().join("c.db").exists(),
        "nothing opened on a bad URL"
    );
}

#[tokio::test]
async fn page_size_from_the_url_applies_to_a_new_file_only() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}?page_size=1024&synchronous=full", db_url(&dir, "p.db"));
    let small = SqliteStore::connect(&url).await.unwrap();
    assert_eq!(
        pragma(&small, "page_size").await,
        1024,
        "a new file takes the URL's size"
    );
    assert_eq!(
        pragma(&small, "synchronous").await,
        2,
        "the other parameter still applies"
    );
    // Records live in it like in any other: the writer's connection shares the file.
    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::anonymous(),
        Endpoint::new("POST", "/v1/charges"),
        Key::new("k-1").unwrap(),
    );
    let reserved = small
        .reserve(&ReserveRequest::new(scope.clone(), test_fingerprint("a")))
        .await
        .unwrap();
    assert!(matches!(reserved, Reservation::Acquired(_)), "{reserved:?}");
    small.close().await;

    // An existing file keeps the size it was made with, whatever the URL says.
    let reopened = SqliteStore::connect(&format!("{}?page_size=8192", db_url(&dir, "p.db")))
        .await
        .unwrap();
    assert_eq!(pragma(&reopened, "page_size").await, 1024);
    assert!(
        reopened.get(&scope).await.unwrap().is_some(),
        "the record survived"
    );

    // Without the parameter, SQLite's default.
    let default = SqliteStore::connect(&db_url(&dir, "d.db")).await.unwrap();
    assert_eq!(pragma(&default, "page_size").await, 4096);

    for bad in ["1000", "256", "131072", "big", ""] {
        let e = SqliteStore::connect(&format!("{}?page_size={bad}", db_url(&dir, "e.db")))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, SetupError::Invalid { kind: "sqlite", reason }
                if reason.starts_with(&format!("invalid page_size {bad:?}:"))),
            "{bad:?}: {e}"
        );
        assert!(e.to_string().contains("power of two"), "{e}");
    }
    assert!(
        !dir.path().join("e.db").exists(),
        "nothing opened on a bad URL"
    );
}

/// The tenant secret is kept in the file: two stores opened on it at once, each
/// offering its own, agree on one, and a store reopened after both closed reads it
/// again (SPEC S3: every gateway on one store, and every restart, names a tenant
/// alike).
#[tokio::test]
async fn secrets_are_shared_by_stores_on_one_file_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let url = db_url(&dir, "secret.db");
    let a = SqliteStore::connect(&url).await.unwrap();
    let b = SqliteStore::connect(&url).await.unwrap();
    let (from_a, from_b) = tokio::join!(
        a.init_secret(idem_core::TENANT_SECRET_NAME, &[1; 32]),
        b.init_secret(idem_core::TENANT_SECRET_NAME, &[2; 32]),
    );
    let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
    assert_eq!(from_a, from_b);
    assert!(from_a == [1; 32] || from_a == [2; 32], "{from_a:?}");
    a.close().await;
    b.close().await;
    let reopened = SqliteStore::connect(&url).await.unwrap();
    assert_eq!(
        reopened
            .init_secret(idem_core::TENANT_SECRET_NAME, &[3; 32])
            .await
            .unwrap(),
        from_a
    );
    let mut conn = reopened.pool().acquire().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records_meta")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(rows, 1, "kept apart from the records, in TABLE_meta");
}
