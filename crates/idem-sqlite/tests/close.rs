//! `Store::close`: what was queued is written, the WAL is folded into the database file
//! and deleted, later operations are refused, and a pool the application owns stays
//! open.

mod support;

use std::path::Path;
use std::sync::Arc;

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{
    ManualClock, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};
use idem_sqlite::SqliteStore;
use support::until_pending;

/// A request for `key` (each call draws a new tenant: keep the request to ask again).
fn request(key: &str) -> ReserveRequest {
    ReserveRequest::new(test_scope("/v1/charges", key), test_fingerprint("{}"))
}

fn sidecars(db: &Path) -> [std::path::PathBuf; 2] {
    let name = db.file_name().unwrap().to_str().unwrap();
    ["-wal", "-shm"].map(|suffix| db.with_file_name(format!("{name}{suffix}")))
}

async fn reserve_and_complete(store: &SqliteStore, req: &ReserveRequest) {
    let Reservation::Acquired(lease) = store.reserve(req).await.unwrap() else {
        panic!("a fresh key acquires")
    };
    let answer = StoredResponse::new(201, format!("charge {}", req.scope.key().as_str()));
    store.complete(&lease, &answer).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_leaves_one_self_contained_file_and_refuses_later_writes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("close.db");
    let url = format!("sqlite://{}", db.display());
    let clock = ManualClock::starting_now();
    let open = || {
        SqliteStore::builder()
            .clock(Arc::new(clock.clone()))
            .connect(&url)
    };
    let store = open().await.unwrap();
    let requests: Vec<ReserveRequest> = (0..50).map(|i| request(&format!("k{i}"))).collect();
    let late = request("late");
    for req in &requests[..40] {
        reserve_and_complete(&store, req).await;
    }
    assert!(sidecars(&db).iter().all(|p| p.exists()), "WAL mode is on");

    // Writes still queued when close is called are written before it closes. Holding
    // SQLite's write lock keeps them queued: the writer waits in BEGIN with the first.
    let lock = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    let queued: Vec<_> = requests[40..]
        .iter()
        .map(|req| {
            let (store, req) = (store.clone(), req.clone());
            tokio::spawn(async move { store.reserve(&req).await })
        })
        .collect();
    until_pending(&store, 10).await;
    let closing = {
        let store = store.clone();
        tokio::spawn(async move { store.close().await })
    };
    until_pending(&store, 11).await;
    lock.rollback().await.unwrap();
    for q in queued {
        assert!(matches!(q.await.unwrap(), Ok(Reservation::Acquired(_))));
    }
    closing.await.unwrap();
    for path in sidecars(&db) {
        assert!(!path.exists(), "{} is left after close", path.display());
    }
    assert!(matches!(
        store.reserve(&late).await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(store.ping().await.is_err());
    store.close().await; // a second close is harmless

    // The file alone holds every record: copied elsewhere, it answers the same.
    let moved = dir.path().join("moved.db");
    std::fs::copy(&db, &moved).unwrap();
    let reopened = SqliteStore::builder()
        .clock(Arc::new(clock.clone()))
        .connect(&format!("sqlite://{}", moved.display()))
        .await
        .unwrap();
    for req in &requests[..40] {
        let key = req.scope.key().as_str();
        let record = reopened.get(&req.scope).await.unwrap().unwrap();
        match record.state {
            RecordState::Completed { response, .. } => {
                assert_eq!(response.body, format!("charge {key}"));
            }
            other => panic!("{key}: expected completed, found {other:?}"),
        }
    }
    for req in &requests[40..] {
        let record = reopened.get(&req.scope).await.unwrap().unwrap();
        assert!(matches!(record.state, RecordState::InProgress { .. }));
    }
    assert!(reopened.get(&late.scope).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_leaves_the_applications_pool_open() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shared.db").display());
    let builder = SqliteStore::builder();
    let pool = sqlx::SqlitePool::connect_with(builder.connect_options(&url).unwrap())
        .await
        .unwrap();
    let store = builder.from_pool(pool.clone()).await.unwrap();
    reserve_and_complete(&store, &request("mine")).await;

    store.close().await;
    assert!(matches!(
        store.reserve(&request("late")).await,
        Err(StoreError::Unavailable(_))
    ));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .expect("the application's pool still works");
    assert_eq!(rows, 1);
    pool.close().await;
}
