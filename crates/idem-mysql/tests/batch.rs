//! Shared commits: operations that queue while a batch is written go in one statement,
//! with exactly one winner per scope, a member the server refuses failing alone, and a
//! lone operation written at once in one statement.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{
    ManualClock, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
    Tenant,
};
use idem_mysql::{BatchStats, MySqlStore};
use idem_test_support::scope;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection};

/// The tenant of every record this file makes.
const TENANT: &str = "batch";

fn request(key: &str, body: &str) -> ReserveRequest {
    ReserveRequest::new(
        scope(Tenant::new(TENANT), "/v1/charges", key),
        test_fingerprint(body),
    )
}

/// A store writing one batch at a time, so that whatever queues while it writes goes
/// in the next one.
async fn store(case: &str) -> Option<common::TempStore> {
    let clock = ManualClock::starting_now();
    let options = MySqlStore::builder()
        .clock(Arc::new(clock))
        .batches_in_flight(1)
        .acquire_timeout(Duration::from_secs(20))
        .operation_timeout(Duration::from_secs(40));
    common::connect(options, &unique_namespace(case)).await
}

/// Holds the row of `key` locked from another session (an insert not yet committed),
/// so that the store's one drainer, reserving `key`, waits on it while the operations
/// submitted meanwhile queue. Returns once InnoDB shows the drainer waiting.
struct Gate {
    conn: MySqlConnection,
}

impl Gate {
    async fn close(store: &common::TempStore, key: &str) -> (Gate, tokio::task::JoinHandle<()>) {
        let mut conn = MySqlConnection::connect(&common::mysql_url())
            .await
            .unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        let s = scope(Tenant::new(TENANT), "/v1/charges", key);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id, tenant, endpoint, idem_key, fingerprint, created_at,
                             expires_at, attempt, token, state, status, headers, body,
                             completed_at)
             VALUES (UNHEX(?), ?, ?, ?, ?, 0, 9223372036854775807, 1, 1, 'completed', 200,
                     '', 'gate', 0)",
            store.table()
        )))
        .bind(s.digest())
        .bind(s.tenant().as_str())
        .bind(s.endpoint_str())
        .bind(s.key().as_str())
        .bind(&test_fingerprint("{}").as_bytes()[..])
        .execute(&mut conn)
        .await
        .unwrap();
        let blocked = tokio::spawn({
            let store = store.inner.clone();
            let req = request(key, "{}");
            async move {
                // The gate's row, committed or not, is answered when the lock goes.
                store.reserve(&req).await.expect("the gated reserve");
            }
        });
        let mut watch = MySqlConnection::connect(&common::mysql_url())
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            // The drainer's insert, sent and not answered: the server's process list
            // shows it (InnoDB's transaction list was seen not to list it as waiting).
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.processlist
                  WHERE command IN ('Execute', 'Query') AND LOCATE(?, info) > 0
                    AND info LIKE 'INSERT IGNORE%'",
            )
            .bind(store.table())
            .fetch_one(&mut watch)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the gated reserve never waited for the row"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (Gate { conn }, blocked)
    }

    async fn open(mut self) {
        sqlx::query("ROLLBACK")
            .execute(&mut self.conn)
            .await
            .unwrap();
    }
}

/// Held by each test of this file, one at a time, so that a gate's open insert never
/// holds up another test's statements (a CREATE TABLE of another test's store was seen
/// stalling in its commit while a gate was open, on MariaDB 10.11).
static GATED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Operations queued until the store shows `n` of them waiting.
async fn queued(store: &common::TempStore, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while idem_test_support::figure(&**store, "idem_mysql_queued_operations") < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} operations never queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn delta(after: BatchStats, before: BatchStats) -> (u64, u64, u64) {
    (
        after.batches - before.batches,
        after.statements - before.statements,
        after.operations - before.operations,
    )
}

/// Reserves of distinct scopes and many of one scope, all queued behind one batch:
/// they are written by one insert and one read, each distinct scope is acquired, and
/// of the reserves of the shared scope exactly one is, the others answered as a
/// reserve right after it would be (in progress, or a mismatch for another payload).
/// Their completions, queued behind another gate, are one statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_for_a_queued_batch_and_one_winner_per_scope() {
    const DISTINCT: usize = 20;
    const SHARED: usize = 12;
    let _one_at_a_time = GATED.lock().await;
    let Some(store) = store("batch_queued").await else {
        return;
    };
    let (gate, gated) = Gate::close(&store, "gate").await;
    let before = store.batch_stats();
    let mut calls = Vec::new();
    for i in 0..DISTINCT {
        let (store, req) = (store.inner.clone(), request(&format!("d-{i}"), "{}"));
        calls.push(tokio::spawn(async move { store.reserve(&req).await }));
    }
    for i in 0..SHARED {
        let body = if i % 3 == 2 { "{\"other\":1}" } else { "{}" };
        let (store, req) = (store.inner.clone(), request("shared", body));
        calls.push(tokio::spawn(async move { store.reserve(&req).await }));
    }
    queued(&store, (DISTINCT + SHARED) as u64).await;
    gate.open().await;
    gated.await.unwrap();
    let answers: Vec<Reservation> = {
        let mut out = Vec::new();
        for call in calls {
            out.push(call.await.unwrap().expect("no reserve fails"));
        }
        out
    };
    // One batch (the gated reserve's was counted as it began): an insert and a read.
    let (batches, statements, operations) = delta(store.batch_stats(), before);
    assert_eq!(
        (batches, statements, operations),
        (1, 2, (DISTINCT + SHARED) as u64)
    );
    let leases: Vec<_> = answers[..DISTINCT]
        .iter()
        .map(|a| match a {
            Reservation::Acquired(lease) => lease.clone(),
            other => panic!("a distinct scope is acquired: {other:?}"),
        })
        .collect();
    let shared = &answers[DISTINCT..];
    let won = shared
        .iter()
        .filter(|a| matches!(a, Reservation::Acquired(_)))
        .count();
    let waiting = shared
        .iter()
        .filter(|a| matches!(a, Reservation::InProgress { .. }))
        .count();
    let mismatched = shared
        .iter()
        .filter(|a| matches!(a, Reservation::Mismatch))
        .count();
    assert_eq!(won, 1, "{shared:?}");
    assert_eq!(won + waiting + mismatched, SHARED, "{shared:?}");
    assert!(waiting > 0 && mismatched > 0, "{shared:?}");

    let (gate, gated) = Gate::close(&store, "gate-2").await;
    let before = store.batch_stats();
    let mut calls = Vec::new();
    for lease in &leases {
        let (store, lease) = (store.inner.clone(), lease.clone());
        calls.push(tokio::spawn(async move {
            store
                .complete(&lease, &StoredResponse::new(201, "charged"))
                .await
        }));
    }
    queued(&store, DISTINCT as u64).await;
    gate.open().await;
    gated.await.unwrap();
    for call in calls {
        call.await.unwrap().expect("a completion");
    }
    let (batches, statements, _) = delta(store.batch_stats(), before);
    assert_eq!((batches, statements), (1, 1));
    for lease in &leases {
        assert_eq!(
            store
                .reserve(&request(lease.scope.key().as_str(), "{}"))
                .await
                .unwrap(),
            Reservation::Replay(StoredResponse::new(201, "charged"))
        );
    }
}

/// A trigger refuses one member's row: the batch statement fails in the server and
/// rolls back whole, its members are written again one by one, and only that member
/// fails; the same for a completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_member_fails_alone() {
    const NEIGHBOURS: usize = 10;
    let _one_at_a_time = GATED.lock().await;
    let Some(store) = store("batch_poison").await else {
        return;
    };
    let t = store.table().to_owned();
    let poison = format!("{t}_poison");
    for statement in [
        format!(
            "CREATE TRIGGER {poison}_i BEFORE INSERT ON {t} FOR EACH ROW
             BEGIN IF NEW.idem_key = 'poison' THEN
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poisoned row'; END IF; END"
        ),
        format!(
            "CREATE TRIGGER {poison}_u BEFORE UPDATE ON {t} FOR EACH ROW
             BEGIN IF NEW.status = 599 THEN
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poisoned row'; END IF; END"
        ),
    ] {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(store.pool())
            .await
            .unwrap();
    }

    let (gate, gated) = Gate::close(&store, "gate").await;
    let before = store.batch_stats();
    let mut calls = Vec::new();
    for i in 0..=NEIGHBOURS {
        let key = if i == NEIGHBOURS / 2 {
            "poison".to_owned()
        } else {
            format!("n-{i}")
        };
        let (store, req) = (store.inner.clone(), request(&key, "{}"));
        calls.push(tokio::spawn(
            async move { (key, store.reserve(&req).await) },
        ));
    }
    queued(&store, NEIGHBOURS as u64 + 1).await;
    gate.open().await;
    gated.await.unwrap();
    let mut leases = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            (key, Err(e)) if key == "poison" => {
                assert!(e.to_string().contains("poisoned row"), "{e}");
            }
            (key, Ok(Reservation::Acquired(lease))) if key != "poison" => leases.push(lease),
            (key, other) => panic!("{key}: {other:?}"),
        }
    }
    assert_eq!(leases.len(), NEIGHBOURS);
    let poisoned = scope(Tenant::new(TENANT), "/v1/charges", "poison");
    assert!(store.get(&poisoned).await.unwrap().is_none());
    let after = store.batch_stats();
    assert_eq!(after.split_batches - before.split_batches, 1, "{after:?}");

    let (gate, gated) = Gate::close(&store, "gate-2").await;
    let before = store.batch_stats();
    let mut calls = Vec::new();
    for (i, lease) in leases.iter().cloned().enumerate() {
        let status = if i == 3 { 599 } else { 201 };
        let store = store.inner.clone();
        calls.push(tokio::spawn(async move {
            let done = store
                .complete(&lease, &StoredResponse::new(status, "done"))
                .await;
            (lease, status, done)
        }));
    }
    queued(&store, NEIGHBOURS as u64).await;
    gate.open().await;
    gated.await.unwrap();
    for call in calls {
        let (lease, status, done) = call.await.unwrap();
        let record = store.get(&lease.scope).await.unwrap().expect("record");
        if status == 599 {
            assert!(matches!(done, Err(StoreError::Unavailable(_))), "{done:?}");
            assert!(matches!(record.state, RecordState::InProgress { .. }));
        } else {
            done.expect("a neighbour completes");
            assert!(matches!(record.state, RecordState::Completed { .. }));
        }
    }
    let after = store.batch_stats();
    assert_eq!(after.split_batches - before.split_batches, 1, "{after:?}");
}

/// With nothing else going on, an operation waits for no one: it is written at once,
/// alone, in one statement, as without batching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_operation_is_one_statement() {
    // Its store's migration (a CREATE TABLE) must not run while another test's gate is
    // open (see GATED).
    let _one_at_a_time = GATED.lock().await;
    let Some(store) = store("batch_idle").await else {
        return;
    };
    let req = request("lone", "{}");
    let before = store.batch_stats();
    let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    assert_eq!(delta(store.batch_stats(), before), (1, 1, 1));

    let before = store.batch_stats();
    store
        .complete(&lease, &StoredResponse::new(201, "done"))
        .await
        .unwrap();
    assert_eq!(delta(store.batch_stats(), before), (1, 1, 1));

    // A replay is the insert that passes over the row and the read; a second
    // completion of the same lease is the update and the read that finds it done.
    let before = store.batch_stats();
    assert_eq!(
        store.reserve(&req).await.unwrap(),
        Reservation::Replay(StoredResponse::new(201, "done"))
    );
    store
        .complete(&lease, &StoredResponse::new(201, "again"))
        .await
        .unwrap();
    assert_eq!(delta(store.batch_stats(), before), (2, 4, 2));
    let record = store.get(&req.scope).await.unwrap().expect("record");
    assert!(matches!(record.state, RecordState::Completed { .. }));
}
