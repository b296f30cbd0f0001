//! `idem-sql`'s MySQL dialect against the live server: what its statements report, and
//! that its migration lock makes a second session wait.

mod common;

use std::time::Duration;

use idem_core::testing::unique_namespace;
use idem_sql::{MigrationLock, SqlDatabase};
use idem_test_support::service_unavailable;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{AssertSqlSafe, MySql, MySqlPool};

async fn pool() -> Option<MySqlPool> {
    let url = common::mysql_url();
    match MySqlPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await
    {
        Ok(pool) => Some(pool),
        Err(e) => service_unavailable("MySQL", &url, &e),
    }
}

/// Insert-if-absent reports one row when it inserted and none when the key was taken,
/// and an upsert writes the values it proposed, as the trait says every dialect does.
#[tokio::test]
async fn insert_if_absent_reports_whether_it_inserted() {
    let Some(pool) = pool().await else {
        return;
    };
    let t = format!("idem_dialect_{}", unique_namespace("insert"));
    let run = async |sql: String| sqlx::query(AssertSqlSafe(sql)).execute(&pool).await;
    run(format!(
        "CREATE TABLE {t} (id {} NOT NULL PRIMARY KEY, at BIGINT NOT NULL) ENGINE=InnoDB",
        MySql::KEY_TEXT
    ))
    .await
    .expect("create");
    let insert = MySql::statement(&format!("INSERT INTO {t} (id, at) VALUES ($1, $2)"));
    let absent = MySql::insert_if_absent(&insert, "id");
    let upsert = MySql::upsert(&insert, "id", &["at"]);
    let counted = async |sql: &str, at: i64| {
        let done = sqlx::query(AssertSqlSafe(sql.to_owned()))
            .bind("a")
            .bind(at)
            .execute(&pool)
            .await
            .expect(sql);
        MySql::rows_affected(&done)
    };
    let first = counted(&absent, 1).await;
    let again = counted(&absent, 2).await;
    counted(&upsert, 3).await;
    let at: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT at FROM {t} WHERE id = 'a'")))
        .fetch_one(&pool)
        .await
        .expect("read");
    run(format!("DROP TABLE {t}")).await.expect("drop");
    assert_eq!((first, again), (1, 0), "rows reported by insert-if-absent");
    assert_eq!(at, 3, "the upsert's value");
}

/// While one session holds the migration lock, another's waits; it gets the lock once
/// the first releases it.
#[tokio::test]
async fn the_migration_lock_makes_a_second_session_wait() {
    let Some(pool) = pool().await else {
        return;
    };
    let name = unique_namespace("lock");
    let mut first = pool.acquire().await.expect("first");
    let mut second = pool.acquire().await.expect("second");
    MySql::lock_migrations(&mut first, MigrationLock::Named(&name))
        .await
        .expect("first lock");
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            MySql::lock_migrations(&mut second, MigrationLock::Named(&name)).await?;
            MySql::unlock_migrations(&mut second, MigrationLock::Named(&name)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the second session got a held lock");
    MySql::unlock_migrations(&mut first, MigrationLock::Named(&name))
        .await
        .expect("unlock");
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the freed lock is taken at once")
        .expect("task")
        .expect("second lock");
}
