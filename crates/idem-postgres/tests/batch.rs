//! Shared commits: operations that queue while a batch is written go in one statement,
//! with exactly one winner per scope, a bad member failing alone, and a lone operation
//! written at once in one round trip.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{
    ManualClock, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
    Tenant,
};
use idem_postgres::{BatchStats, PgStore};
use idem_test_support::scope;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

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
    let options = PgStore::builder()
        .clock(Arc::new(clock))
        .batches_in_flight(1)
        .acquire_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(30));
    common::connect(options, &unique_namespace(case)).await
}

/// Holds the row of `key` locked from another session (an insert not yet committed),
/// so that the store's one drainer, reserving `key`, waits on it while the operations
/// submitted meanwhile queue. Returns once PostgreSQL shows the drainer waiting.
struct Gate {
    conn: PgConnection,
}

impl Gate {
    async fn close(store: &common::TempStore, key: &str) -> (Gate, tokio::task::JoinHandle<()>) {
        let mut conn = PgConnection::connect(&common::pg_url()).await.unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        let s = scope(Tenant::new(TENANT), "/v1/charges", key);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (tenant, endpoint, idem_key, fingerprint, created_at, expires_at,
                             attempt, token, state, status, headers, body, completed_at)
             VALUES ($1, $2, $3, $4, 0, 9223372036854775807, 1, 1, 'completed', 200,
                     '\\x0000'::bytea, 'gate'::bytea, 0)",
            store.table()
        )))
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
        // Watched from a connection of its own: inside the gate's transaction,
        // pg_stat_activity is a snapshot taken at its first read and kept until the
        // transaction ends, so a read made before the reserve blocked would be seen
        // again and again.
        let mut watch = PgConnection::connect(&common::pg_url()).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            // This store's reserve (a lone one: its single-row statement), waiting for the row.
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND datname = current_database()
                    AND position($1 in query) > 0",
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

/// Operations queued until `stats` shows `n` of them waiting.
async fn queued(store: &common::TempStore, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while idem_test_support::figure(&**store, "idem_postgres_queued_operations") < n {
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
/// they are written by one statement, each distinct scope is acquired, and of the
/// reserves of the shared scope exactly one is, the others answered as a reserve
/// right after it would be (in progress, or a mismatch for another payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_for_a_queued_batch_and_one_winner_per_scope() {
    const DISTINCT: usize = 24;
    const SAME: usize = 12;
    let Some(store) = store("batch_winners").await else {
        return;
    };
    let (gate, gated) = Gate::close(&store, "gate").await;
    let before = store.batch_stats();
    let mut calls = Vec::new();
    for i in 0..DISTINCT {
        let (store, req) = (store.inner.clone(), request(&format!("k-{i}"), "{}"));
        calls.push(tokio::spawn(async move { store.reserve(&req).await }));
    }
    queued(&store, DISTINCT as u64).await;
    for i in 0..SAME {
        // One in four with another payload.
        let body = if i % 4 == 3 { "{\"other\":1}" } else { "{}" };
        let (inner, req) = (store.inner.clone(), request("shared", body));
        calls.push(tokio::spawn(async move { inner.reserve(&req).await }));
        // Spawned tasks start in no set order: queue the shared scope's reserves one
        // at a time, so the first spawned is the first in the batch.
        queued(&store, (DISTINCT + i + 1) as u64).await;
    }
    gate.open().await;
    gated.await.unwrap();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap().expect("reserve"));
    }
    let (batches, statements, operations) = delta(store.batch_stats(), before);
    // After the gated reserve's batch, one batch of everything queued behind it.
    assert_eq!(operations, (DISTINCT + SAME) as u64);
    assert_eq!(batches, 1, "{:?}", store.batch_stats());
    assert_eq!(statements, 1, "one statement for the whole queued batch");
    assert!(store.batch_stats().largest_batch >= (DISTINCT + SAME) as u64);

    for (i, answer) in answers[..DISTINCT].iter().enumerate() {
        assert!(
            matches!(answer, Reservation::Acquired(_)),
            "k-{i}: {answer:?}"
        );
    }
    let shared = &answers[DISTINCT..];
    let winners = shared
        .iter()
        .filter(|a| matches!(a, Reservation::Acquired(_)))
        .count();
    assert_eq!(winners, 1, "{shared:?}");
    // The first of the shared scope's reserves went in the statement: it won.
    let Reservation::Acquired(lease) = &shared[0] else {
        panic!("the first reserve of the shared scope wins: {shared:?}");
    };
    for (i, answer) in shared.iter().enumerate().skip(1) {
        match answer {
            Reservation::Mismatch => assert_eq!(i % 4, 3, "{i}"),
            Reservation::InProgress { .. } => assert_ne!(i % 4, 3, "{i}"),
            other => panic!("shared reserve {i}: {other:?}"),
        }
    }
    let record = store
        .get(&scope(Tenant::new(TENANT), "/v1/charges", "shared"))
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(
        record.token, lease.token,
        "the stored attempt is the winner's"
    );
}

/// The same race without a gate: many callers at once on a few scopes, several
/// batches; every scope has exactly one winner and its record is the winner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reserves_of_few_scopes_have_one_winner_each() {
    const CALLERS: usize = 64;
    const SCOPES: usize = 8;
    let Some(store) = store("batch_race").await else {
        return;
    };
    let calls: Vec<_> = (0..CALLERS)
        .map(|c| {
            let (store, req) = (
                store.inner.clone(),
                request(&format!("s-{}", c % SCOPES), "{}"),
            );
            tokio::spawn(async move { (c % SCOPES, store.reserve(&req).await.expect("reserve")) })
        })
        .collect();
    let mut winners = vec![Vec::new(); SCOPES];
    for call in calls {
        let (s, answer) = call.await.unwrap();
        match answer {
            Reservation::Acquired(lease) => winners[s].push(lease),
            Reservation::InProgress { .. } => {}
            other => panic!("s-{s}: {other:?}"),
        }
    }
    for (s, won) in winners.iter().enumerate() {
        assert_eq!(won.len(), 1, "s-{s}: {won:?}");
        let record = store
            .get(&scope(
                Tenant::new(TENANT),
                "/v1/charges",
                &format!("s-{s}"),
            ))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.token, won[0].token);
    }
    let stats = store.batch_stats();
    assert_eq!(stats.operations, CALLERS as u64, "{stats:?}");
}

/// A trigger refuses one member's row: the batch statement fails in the database, its
/// members are written again one by one, and only that member fails; the same for a
/// completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_member_fails_alone() {
    const NEIGHBOURS: usize = 10;
    let Some(store) = store("batch_poison").await else {
        return;
    };
    let t = store.table().to_owned();
    let poison = format!("{t}_poison");
    for statement in [
        format!(
            "CREATE FUNCTION {poison}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.idem_key = 'poison' OR NEW.status = 599 THEN
                 RAISE EXCEPTION 'poisoned row';
               END IF;
               RETURN NEW;
             END $$"
        ),
        format!(
            "CREATE TRIGGER {poison} BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {poison}()"
        ),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(store.pool())
            .await
            .unwrap();
    }

    // Reserves: the poisoned key among its neighbours, in one batch.
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
                assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
            }
            (key, Ok(Reservation::Acquired(lease))) if key != "poison" => leases.push(lease),
            (key, other) => panic!("{key}: {other:?}"),
        }
    }
    assert_eq!(leases.len(), NEIGHBOURS);
    assert!(
        store
            .get(&scope(Tenant::new(TENANT), "/v1/charges", "poison"))
            .await
            .unwrap()
            .is_none()
    );
    let after = store.batch_stats();
    assert_eq!(after.split_batches - before.split_batches, 1, "{after:?}");

    // Completions: one with the refused status among the others, in one batch.
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

    sqlx::query(AssertSqlSafe(format!("DROP TRIGGER {poison} ON {t}")))
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP FUNCTION {poison}()")))
        .execute(store.pool())
        .await
        .unwrap();
}

/// With nothing else going on, an operation waits for no one: it is written at once,
/// alone, in one statement (one round trip, one commit), as without batching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_operation_is_one_statement() {
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

    // A replay is one statement too; a second completion of the same lease is the
    // update and the read that finds it done already.
    let before = store.batch_stats();
    assert!(matches!(
        store.reserve(&req).await.unwrap(),
        Reservation::Replay(_)
    ));
    store
        .complete(&lease, &StoredResponse::new(201, "again"))
        .await
        .unwrap();
    assert_eq!(delta(store.batch_stats(), before), (2, 3, 2));

    let other = request("released", "{}");
    let Reservation::Acquired(lease) = store.reserve(&other).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let before = store.batch_stats();
    store.release(&lease).await.unwrap();
    assert_eq!(delta(store.batch_stats(), before), (1, 1, 1));
    assert!(matches!(
        store.release(&lease).await,
        Err(StoreError::Fenced)
    ));
}
