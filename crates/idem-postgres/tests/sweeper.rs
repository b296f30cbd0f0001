//! SPEC S8: expired rows are purged in bounded batches, in the background; and the
//! embedded migration is safe to run from many instances at once.

mod common;

use std::time::{Duration, Instant};

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{
    ManualClock, Reservation, ReserveRequest, Scope, Store, StoredResponse, SweeperConfig,
    sweep_once,
};
use idem_postgres::PgStore;
use sqlx::AssertSqlSafe;

const SHORT: Duration = Duration::from_secs(10);

/// `n` completed records that expire after [`SHORT`], and `live` that do not.
async fn fill(store: &common::TempStore, n: usize, live: usize) -> (Vec<Scope>, Vec<Scope>) {
    let make = async |prefix: &str, count: usize, ttl: Duration| {
        let mut scopes = Vec::new();
        for i in 0..count {
            let scope = test_scope("/sweep", &format!("{prefix}-{i}"));
            let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
                .ttl(ttl)
                .lease(Duration::from_secs(5));
            let Reservation::Acquired(lease) = store.reserve(&req).await.expect("reserve") else {
                panic!("fresh key must acquire")
            };
            store
                .complete(&lease, &StoredResponse::new(200, "ok"))
                .await
                .expect("complete");
            scopes.push(scope);
        }
        scopes
    };
    let old = make("old", n, SHORT).await;
    let kept = make("live", live, Duration::from_secs(3600)).await;
    (old, kept)
}

async fn rows(store: &common::TempStore) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        store.table()
    )))
    .fetch_one(store.pool())
    .await
    .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_once_is_bounded_per_sweep() {
    let clock = ManualClock::starting_now();
    let Some(store) = common::store_with_clock(&clock, &unique_namespace("sweep_once")).await
    else {
        return;
    };
    let (_old, live) = fill(&store, 250, 5).await;
    clock.advance(SHORT);
    let config = SweeperConfig {
        every: Duration::from_secs(1),
        batch: 100,
        max_batches: 2,
    };
    assert_eq!(sweep_once(&*store, config).await, 200, "two batches of 100");
    assert_eq!(rows(&store).await, 55);
    assert_eq!(sweep_once(&*store, config).await, 50);
    assert_eq!(rows(&store).await, 5);
    assert_eq!(sweep_once(&*store, config).await, 0);
    for s in &live {
        assert!(store.get(s).await.expect("get").is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_deletes_expired_rows_in_background() {
    let clock = ManualClock::starting_now();
    let Some(store) = common::store_with_clock(&clock, &unique_namespace("sweeper")).await else {
        return;
    };
    let (old, live) = fill(&store, 120, 3).await;
    clock.advance(SHORT);
    let sweeper = store.spawn_sweeper(SweeperConfig {
        every: Duration::from_millis(20),
        batch: 25,
        max_batches: 2,
    });
    // The sweeper runs on real time; wait for its outcome, bounded.
    let deadline = Instant::now() + Duration::from_secs(20);
    while rows(&store).await > 3 {
        assert!(
            Instant::now() < deadline,
            "the sweeper did not purge in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sweeper.stop();
    for s in &old {
        assert!(store.get(s).await.expect("get").is_none());
    }
    for s in &live {
        assert!(store.get(s).await.expect("get").is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_skips_rows_another_transaction_holds() {
    let clock = ManualClock::starting_now();
    let Some(store) = common::store_with_clock(&clock, &unique_namespace("skip_locked")).await
    else {
        return;
    };
    let (old, _) = fill(&store, 3, 0).await;
    clock.advance(SHORT);
    // Another transaction holds one expired row (as a reserve taking it over would).
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE idem_key = $1 AND tenant = $2 FOR UPDATE",
        store.table()
    )))
    .bind(old[0].key().as_str())
    .bind(old[0].tenant().as_str())
    .execute(&mut *tx)
    .await
    .expect("lock a row");
    let purged = tokio::time::timeout(Duration::from_secs(10), store.purge_expired(10))
        .await
        .expect("purge must not wait for the held row")
        .expect("purge");
    assert_eq!(purged, 2);
    tx.rollback().await.expect("rollback");
    assert_eq!(store.purge_expired(10).await.expect("purge"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_of_a_new_table_all_succeed() {
    let ns = unique_namespace("migrate");
    let Some(first) = common::connect(PgStore::builder().migrate(false), &ns).await else {
        return;
    };
    // Instances starting together all migrate the same new table.
    let table = first.table().to_owned();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let table = table.clone();
            tokio::spawn(async move {
                PgStore::builder()
                    .table(table)
                    .max_connections(1)
                    .connect(&common::pg_url())
                    .await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for t in tasks {
        stores.push(t.await.expect("task").expect("migration"));
    }
    let versions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem_schema_migrations WHERE table_name = $1")
            .bind(&table)
            .fetch_one(first.pool())
            .await
            .expect("count migrations");
    assert_eq!(
        versions,
        i64::from(idem_postgres::schema::SCHEMA_VERSION),
        "each migration ran once"
    );
    // And the table works from every instance.
    let req = ReserveRequest::new(test_scope("/m", "k"), test_fingerprint("{}"));
    let Reservation::Acquired(lease) = stores[0].reserve(&req).await.expect("reserve") else {
        panic!("fresh key must acquire")
    };
    assert!(matches!(
        stores[3].reserve(&req).await.expect("reserve"),
        Reservation::InProgress { .. }
    ));
    stores[1].release(&lease).await.expect("release");
    // Migrating again is a no-op.
    stores[2].migrate().await.expect("second migration");
}

/// A table at schema version 3 (before tombstones) that holds records: migration 4
/// keeps them and their answers, and tombstones work on it from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_table_with_records_migrates_to_tombstones() {
    let clock = ManualClock::starting_now();
    let Some(store) = common::store_with_clock(&clock, &unique_namespace("migrate_v3")).await
    else {
        return;
    };
    let t = store.table().to_owned();
    let (old, _) = fill(&store, 3, 0).await;
    // Back to version 3, as a build before tombstones left the table: no column, the
    // two-state check, no rate table, no record of migrations 4 and 5.
    for sql in [
        format!("DROP TABLE {t}_rate"),
        format!("ALTER TABLE {t} DROP CONSTRAINT {t}_state"),
        format!("ALTER TABLE {t} DROP COLUMN tombstone_until"),
        format!("ALTER TABLE {t} DROP COLUMN ambiguity"),
        format!(
            "ALTER TABLE {t} ADD CONSTRAINT {t}_state CHECK (
                (state = 'in_progress' AND lease_until IS NOT NULL
                    AND status IS NULL AND completed_at IS NULL)
                OR (state = 'completed' AND lease_until IS NULL
                    AND status IS NOT NULL AND headers IS NOT NULL
                    AND body IS NOT NULL AND completed_at IS NOT NULL))"
        ),
        format!("DELETE FROM idem_schema_migrations WHERE table_name = '{t}' AND version >= 4"),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .expect("undo migrations 4 and 5");
    }
    store
        .migrate()
        .await
        .expect("migration 4 on a table with rows");
    let version: i32 =
        sqlx::query_scalar("SELECT max(version) FROM idem_schema_migrations WHERE table_name = $1")
            .bind(&t)
            .fetch_one(store.pool())
            .await
            .expect("version");
    assert_eq!(version, idem_postgres::schema::SCHEMA_VERSION);
    // The old records replay as they did.
    let old_req = ReserveRequest::new(old[0].clone(), test_fingerprint("{}"))
        .ttl(SHORT)
        .lease(Duration::from_secs(5));
    assert_eq!(
        store.reserve(&old_req).await.expect("reserve"),
        Reservation::Replay(StoredResponse::new(200, "ok"))
    );
    // A new record keeps its tombstone past its TTL; an old one, made without, does not.
    let scope = test_scope("/sweep", "tombstoned");
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
        .ttl(SHORT)
        .tombstone(Duration::from_secs(3600));
    let Reservation::Acquired(lease) = store.reserve(&req).await.expect("reserve") else {
        panic!("fresh key must acquire")
    };
    store
        .complete(&lease, &StoredResponse::new(201, "made"))
        .await
        .expect("complete");
    clock.advance(SHORT);
    assert!(matches!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Gone { status: 201, .. }
    ));
    assert!(matches!(
        store.reserve(&old_req).await.expect("reserve"),
        Reservation::Acquired(_)
    ));
}
