//! The writer: concurrent writes are committed in shared transactions, every caller is
//! answered only after its transaction committed, a failure is confined to what it
//! touched, the queue and batch are bounded, and the writer ends with the last handle.
//!
//! To put chosen operations into one transaction whatever the scheduling, a test holds
//! SQLite's write lock from a pooled connection: the writer takes the first operation
//! and blocks in its `BEGIN IMMEDIATE`, the test queues the rest behind it (watching
//! `pending_writes`), then lets go, and the writer takes everything queued into that
//! transaction.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{
    ManualClock, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};
use idem_sqlite::{SqliteStore, SqliteStoreBuilder};
use support::until_pending;
use tokio::task::JoinHandle;

fn builder(clock: &ManualClock) -> SqliteStoreBuilder {
    // The held lock must not outlast the writer's patience on a loaded machine.
    SqliteStore::builder()
        .clock(Arc::new(clock.clone()))
        .busy_timeout(Duration::from_secs(60))
}

fn db_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("writer.db").display())
}

fn request(key: &str) -> ReserveRequest {
    ReserveRequest::new(
        test_scope("/v1/orders", key),
        test_fingerprint(&format!(r#"{{"order":"{key}"}}"#)),
    )
}

/// Reserves `requests` in this order, all in one transaction of the writer.
async fn reserve_in_one_batch(
    store: &SqliteStore,
    requests: &[ReserveRequest],
) -> Vec<idem_core::Result<Reservation>> {
    let lock = store
        .pool()
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("hold the write lock");
    // One at a time, so that the transaction runs them in this order.
    let mut tasks: Vec<JoinHandle<_>> = Vec::new();
    for (i, req) in requests.iter().enumerate() {
        let (writer, req) = (store.clone(), req.clone());
        tasks.push(tokio::spawn(async move { writer.reserve(&req).await }));
        until_pending(store, i + 1).await;
    }
    lock.commit().await.expect("let the writer go");
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

async fn count_rows(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

fn assert_unavailable(result: &idem_core::Result<Reservation>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::Unavailable(_))),
        "{what}: expected Unavailable, got {result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_are_batched_and_each_key_acquired_exactly_once() {
    const TASKS: usize = 64;
    const KEYS: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = builder(&clock).connect(&db_url(&dir)).await.unwrap();
    let requests: Arc<Vec<ReserveRequest>> =
        Arc::new((0..KEYS).map(|i| request(&format!("key-{i}"))).collect());
    let barriers: Arc<Vec<tokio::sync::Barrier>> = Arc::new(
        (0..KEYS)
            .map(|_| tokio::sync::Barrier::new(TASKS))
            .collect(),
    );
    let response = |key: usize, task: usize| {
        StoredResponse::new(201, format!("key {key} by task {task}"))
            .with_header("content-type", "text/plain")
    };

    // The first key's 64 reservers queue behind a held lock, so at least that batch
    // holds all of them; the rest batch as the scheduling falls.
    let lock = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, requests, barriers) = (store.clone(), requests.clone(), barriers.clone());
            tokio::spawn(async move {
                let mut seen = Vec::with_capacity(KEYS);
                for (i, req) in requests.iter().enumerate() {
                    barriers[i].wait().await;
                    let reservation = store.reserve(req).await.expect("reserve");
                    if let Reservation::Acquired(lease) = &reservation {
                        store
                            .complete(lease, &response(i, t))
                            .await
                            .expect("complete");
                    }
                    seen.push((i, reservation));
                }
                (t, seen)
            })
        })
        .collect();
    until_pending(&store, TASKS).await;
    lock.commit().await.unwrap();

    let mut winners: Vec<Option<(usize, Reservation)>> = vec![None; KEYS];
    let mut replays = Vec::new();
    let mut in_progress = 0;
    for task in tasks {
        let (t, seen) = task.await.unwrap();
        for (i, reservation) in seen {
            match reservation {
                Reservation::Acquired(ref lease) => {
                    assert_eq!(lease.attempt, 1, "key {i}");
                    assert!(winners[i].is_none(), "key {i} acquired twice");
                    winners[i] = Some((t, reservation));
                }
                Reservation::Replay(r) => replays.push((i, r)),
                Reservation::InProgress { .. } => in_progress += 1,
                Reservation::Mismatch => panic!("key {i}: mismatch"),
                Reservation::Gone { .. } => panic!("key {i}: gone"),
            }
        }
    }
    assert_eq!(replays.len() + in_progress, KEYS * (TASKS - 1));

    // Every key was acquired once, and its completed record is readable, through this
    // store and through a second one opened on the file afterwards.
    let other = builder(&clock).connect(&db_url(&dir)).await.unwrap();
    for (i, winner) in winners.iter().enumerate() {
        let Some((t, Reservation::Acquired(lease))) = winner else {
            panic!("key {i} was never acquired")
        };
        for reader in [&store, &other] {
            let record = reader.get(&requests[i].scope).await.unwrap().unwrap();
            assert_eq!(record.token, lease.token, "key {i}");
            match record.state {
                RecordState::Completed { response: r, .. } => assert_eq!(r, response(i, *t)),
                other => panic!("key {i}: {other:?}"),
            }
        }
    }
    // A replay is always the winner's answer.
    for (i, r) in replays {
        let Some((t, _)) = winners[i] else {
            unreachable!()
        };
        assert_eq!(r, response(i, t), "key {i}");
    }
    assert_eq!(count_rows(&store).await, KEYS as i64);

    let stats = store.writer_stats();
    println!("{stats:?}");
    assert_eq!(stats.operations, (TASKS * KEYS + KEYS) as u64);
    assert_eq!(stats.failed_batches, 0);
    assert!(stats.largest_batch >= TASKS as u64, "{stats:?}");
    assert!(stats.batches < stats.operations, "{stats:?}");
    assert_eq!(store.pending_writes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_commit_answers_every_operation_in_its_batch_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = builder(&clock).connect(&db_url(&dir)).await.unwrap();
    // Reserving the key `poison` adds a row that breaks a deferred foreign key: every
    // statement succeeds, and the COMMIT fails.
    sqlx::raw_sql(
        "CREATE TABLE parent (id INTEGER PRIMARY KEY);
         CREATE TABLE child (parent INTEGER REFERENCES parent (id)
             DEFERRABLE INITIALLY DEFERRED);
         CREATE TRIGGER poison AFTER INSERT ON idem_records
             WHEN NEW.idem_key = 'poison'
             BEGIN INSERT INTO child VALUES (42); END;",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let mut requests: Vec<ReserveRequest> =
        (0..20).map(|i| request(&format!("good-{i}"))).collect();
    requests.insert(10, request("poison"));

    let results = reserve_in_one_batch(&store, &requests).await;
    for (req, result) in requests.iter().zip(&results) {
        assert_unavailable(result, req.scope.key().as_str());
    }
    assert_eq!(
        count_rows(&store).await,
        0,
        "nothing of the batch was stored"
    );
    let stats = store.writer_stats();
    assert_eq!((stats.batches, stats.failed_batches), (0, 1), "{stats:?}");

    // Nothing is left behind: the same keys acquire now, as first attempts.
    requests.remove(10);
    for req in &requests {
        match store.reserve(req).await.unwrap() {
            Reservation::Acquired(lease) => assert_eq!(lease.attempt, 1),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(count_rows(&store).await, requests.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statement_error_fails_only_its_own_operation() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = builder(&clock).connect(&db_url(&dir)).await.unwrap();
    // SQLite undoes just the refused statement; the transaction goes on.
    sqlx::raw_sql(
        "CREATE TRIGGER refuse BEFORE INSERT ON idem_records
             WHEN NEW.idem_key = 'refused'
             BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END;",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let mut requests: Vec<ReserveRequest> =
        (0..20).map(|i| request(&format!("good-{i}"))).collect();
    requests.insert(10, request("refused"));

    let results = reserve_in_one_batch(&store, &requests).await;
    for (i, (req, result)) in requests.iter().zip(results).enumerate() {
        if i == 10 {
            assert_unavailable(&result, "the refused reserve");
            assert_eq!(store.get(&req.scope).await.unwrap(), None);
            continue;
        }
        let Ok(Reservation::Acquired(lease)) = result else {
            panic!("{i}: {result:?}")
        };
        let record = store.get(&req.scope).await.unwrap().unwrap();
        assert_eq!(record.token, lease.token);
    }
    assert_eq!(count_rows(&store).await, 20);
    let stats = store.writer_stats();
    assert_eq!(stats.batches, 1, "one transaction: {stats:?}");
    assert_eq!(stats.operations, 21);
    assert_eq!(stats.failed_batches, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn statement_that_rolls_back_the_transaction_fails_the_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = builder(&clock).connect(&db_url(&dir)).await.unwrap();
    // As SQLite does on some I/O errors: the failed statement ends the transaction.
    // What ran before it is undone; what comes after must not run, least of all on
    // its own outside any transaction.
    sqlx::raw_sql(
        "CREATE TRIGGER wreck BEFORE INSERT ON idem_records
             WHEN NEW.idem_key = 'wreck'
             BEGIN SELECT RAISE(ROLLBACK, 'the transaction is rolled back'); END;",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let mut requests: Vec<ReserveRequest> =
        (0..20).map(|i| request(&format!("good-{i}"))).collect();
    requests.insert(10, request("wreck"));

    let results = reserve_in_one_batch(&store, &requests).await;
    for (req, result) in requests.iter().zip(&results) {
        assert_unavailable(result, req.scope.key().as_str());
    }
    assert_eq!(
        count_rows(&store).await,
        0,
        "nothing of the batch was stored"
    );
    let stats = store.writer_stats();
    assert_eq!((stats.batches, stats.failed_batches), (0, 1), "{stats:?}");

    // The writer carries on with a new connection.
    requests.remove(10);
    for req in &requests {
        assert!(matches!(
            store.reserve(req).await.unwrap(),
            Reservation::Acquired(_)
        ));
    }
    assert_eq!(count_rows(&store).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_and_batch_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::starting_now();
    let store = builder(&clock)
        .write_batch(1)
        .write_queue(4)
        .connect(&db_url(&dir))
        .await
        .unwrap();
    let lock = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    // The writer takes one operation and blocks on the lock; four more fit in the
    // queue; the other six callers wait for room.
    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..11)
        .map(|i| {
            let (store, started) = (store.clone(), started.clone());
            let req = request(&format!("k{i}"));
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                store.reserve(&req).await
            })
        })
        .collect();
    until_pending(&store, 5).await;
    while started.load(Ordering::SeqCst) < 11 {
        tokio::task::yield_now().await;
    }
    // Give the waiting callers every chance to overfill the queue; they cannot.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.pending_writes(), 5);
    lock.commit().await.unwrap();
    for t in tasks {
        assert!(matches!(
            t.await.unwrap().unwrap(),
            Reservation::Acquired(_)
        ));
    }
    let stats = store.writer_stats();
    assert_eq!(stats.largest_batch, 1, "{stats:?}");
    assert_eq!(stats.batches, 11, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_stops_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("writer.db-wal");
    let clock = ManualClock::starting_now();
    let store = builder(&clock).connect(&db_url(&dir)).await.unwrap();
    let clone = store.clone();
    assert!(matches!(
        store.reserve(&request("k")).await.unwrap(),
        Reservation::Acquired(_)
    ));
    // With the pool closed only the writer's connection keeps the file open, and
    // SQLite removes the WAL when the last connection to it closes.
    store.pool().close().await;
    drop(store);
    assert!(wal.exists(), "a clone still holds the writer");
    drop(clone);
    let deadline = Instant::now() + Duration::from_secs(30);
    while wal.exists() {
        assert!(
            Instant::now() < deadline,
            "the writer's connection stayed open"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn in_memory_database_is_shared_by_the_writer_and_the_pool() {
    let clock = ManualClock::starting_now();
    let store = builder(&clock).connect("sqlite::memory:").await.unwrap();
    let req = request("k");
    let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
        panic!("first reserve acquires")
    };
    let resp = StoredResponse::new(201, "made");
    store.complete(&lease, &resp).await.unwrap();
    // Read through the pool: the writer wrote to the same database.
    let record = store.get(&req.scope).await.unwrap().unwrap();
    assert_eq!(record.token, lease.token);
    assert_eq!(
        store.reserve(&req).await.unwrap(),
        Reservation::Replay(resp)
    );
    assert_eq!(count_rows(&store).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_is_copied_into_the_database_file_while_writes_flow() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("writer.db");
    let clock = ManualClock::starting_now();
    let store = builder(&clock).connect(&db_url(&dir)).await.unwrap();
    let before = std::fs::metadata(&db).unwrap().len();
    // About 2 MB of bodies: some 500 WAL pages, fewer than the 1000 after which a
    // connection checkpoints its own commits, so only the checkpoint thread moves
    // them into the database file.
    let body = bytes::Bytes::from(vec![b'x'; 10 * 1024]);
    for i in 0..200 {
        let Reservation::Acquired(lease) = store.reserve(&request(&format!("k{i}"))).await.unwrap()
        else {
            panic!("fresh key acquires")
        };
        store
            .complete(&lease, &StoredResponse::new(201, body.clone()))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(&db).unwrap().len() < before + 1_500_000 {
        assert!(
            Instant::now() < deadline,
            "the WAL was not checkpointed: the database file is {} bytes",
            std::fs::metadata(&db).unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The WAL header's checkpoint sequence number, which SQLite bumps each time the WAL
/// starts over from its beginning.
fn wal_sequence(wal: &std::path::Path) -> Option<u32> {
    let bytes = std::fs::read(wal).ok()?;
    Some(u32::from_be_bytes(bytes.get(12..16)?.try_into().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_starts_over_while_writes_never_pause() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("writer.db-wal");
    let clock = ManualClock::starting_now();
    let store = Arc::new(builder(&clock).connect(&db_url(&dir)).await.unwrap());
    // 16 callers write without a pause between them until the WAL has started over
    // three times. A checkpoint that only ever runs beside the writer never reaches the
    // WAL's end, and SQLite starts the WAL over only once all of it is in the database
    // file: the WAL would grow by every page written, for as long as the load lasts.
    const CALLERS: usize = 16;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<JoinHandle<()>> = (0..CALLERS)
        .map(|c| {
            let (store, done, written) = (store.clone(), done.clone(), written.clone());
            tokio::spawn(async move {
                let body = bytes::Bytes::from(vec![b'x'; 512]);
                for i in 0.. {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    let req = request(&format!("c{c}-{i}"));
                    let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
                        panic!("fresh key acquires")
                    };
                    store
                        .complete(&lease, &StoredResponse::new(201, body.clone()))
                        .await
                        .unwrap();
                    written.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    // Bounded: without restarts the WAL grows by some 80 MB a second here, and by far
    // less on a loaded machine, which the bound leaves time for.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(seq) = wal_sequence(&wal) {
            break seq;
        }
        assert!(Instant::now() < deadline, "no WAL appeared");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let mut largest = 0;
    loop {
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        let seq = wal_sequence(&wal).unwrap_or(first);
        if seq.wrapping_sub(first) >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the WAL started over {} times in 60 s of writes ({} records, WAL {largest} bytes)",
            seq.wrapping_sub(first),
            written.load(Ordering::Relaxed),
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    done.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let n = written.load(Ordering::Relaxed);
    assert_eq!(count_rows(&store).await, n as i64);
}
