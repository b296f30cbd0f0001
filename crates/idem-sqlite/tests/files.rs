//! The files that hold records are readable by their owner only (SPEC S14): a store
//! creates its database, `-wal` and `-shm` with mode 0600 whatever the umask, and leaves
//! the mode of a database that exists as the operator set it.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use idem_core::testing::test_fingerprint;
use idem_core::{
    Endpoint, Key, Reservation, ReserveRequest, Scope, ScopeMode, Store, StoredResponse, Tenant,
};
use idem_sqlite::SqliteStore;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The database and the two files SQLite keeps beside it in WAL mode.
fn files(db: &Path) -> [PathBuf; 3] {
    let with = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [db.to_owned(), with("-wal"), with("-shm")]
}

/// Writes a record, so the WAL and its index exist, and reads it back.
async fn write_one(store: &SqliteStore, key: &str) {
    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::new("t"),
        Endpoint::new("POST", "/files"),
        Key::new(key).unwrap(),
    );
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
        panic!("a fresh key is acquired")
    };
    store
        .complete(&lease, &StoredResponse::new(201, "{}"))
        .await
        .unwrap();
    assert!(store.get(&scope).await.unwrap().unwrap().is_completed());
}

#[tokio::test]
async fn the_database_file_is_0600_and_so_are_its_wal_and_shm() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fresh.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    write_one(&store, "k").await;
    for file in files(&db) {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    store.close().await;
    assert_eq!(mode(&db), 0o600);
}

#[tokio::test]
async fn an_existing_database_keeps_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    // An empty file an operator made for the store, group-readable.
    let made = dir.path().join("made.db");
    std::fs::File::create(&made).unwrap();
    std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o640)).unwrap();
    // A database of records the operator left readable by all (warned of, not changed).
    let used = dir.path().join("used.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", used.display()))
        .await
        .unwrap();
    write_one(&store, "first").await;
    store.close().await;
    for file in &files(&used)[1..] {
        let _ = std::fs::remove_file(file);
    }
    std::fs::set_permissions(&used, std::fs::Permissions::from_mode(0o644)).unwrap();

    for (db, existing) in [(made, 0o640), (used, 0o644)] {
        let store = SqliteStore::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        write_one(&store, "again").await;
        for file in files(&db) {
            assert_eq!(mode(&file), existing, "{}", file.display());
        }
        store.close().await;
        assert_eq!(mode(&db), existing);
    }
}
