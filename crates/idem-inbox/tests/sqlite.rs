//! `SqliteInbox` against a SQLite file (SPEC S12).

mod common;

use std::time::Duration;

use idem_core::SharedClock;
use idem_inbox::{BoxFuture, Error, SqliteInbox};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool, Transaction};

#[derive(Clone)]
struct SqliteBackend {
    pool: SqlitePool,
    // Keeps the database file until the case ends.
    _dir: std::sync::Arc<tempfile::TempDir>,
}

async fn setup(_case: &str) -> Option<SqliteBackend> {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("inbox.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    Some(SqliteBackend {
        pool,
        _dir: std::sync::Arc::new(dir),
    })
}

impl common::cases::Backend for SqliteBackend {
    type I = SqliteInbox;

    async fn inbox(&self, consumer: &str, retention: Duration, clock: SharedClock) -> SqliteInbox {
        let inbox = SqliteInbox::new(self.pool.clone(), consumer)
            .unwrap()
            .with_retention(retention)
            .with_clock(clock);
        inbox.migrate().await.unwrap();
        inbox
    }

    fn ledger_table(&self) -> String {
        "ledger".to_owned()
    }

    fn credit<'t>(
        tx: &'t mut Transaction<'static, Sqlite>,
        ledger: String,
        message_id: String,
        amount: i64,
    ) -> BoxFuture<'t, Result<(), Error>> {
        Box::pin(async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {ledger} (message_id, amount) VALUES (?1, ?2)"
            )))
            .bind(message_id)
            .bind(amount)
            .execute(&mut **tx)
            .await?;
            Ok(())
        })
    }

    async fn ledger(&self) -> Vec<(String, i64)> {
        sqlx::query_as("SELECT message_id, amount FROM ledger ORDER BY message_id, amount")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
}

inbox_cases!(setup);

#[tokio::test]
async fn custom_table_is_created_and_used() {
    let b = setup("custom_table").await.unwrap();
    let inbox = SqliteInbox::new(b.pool.clone(), "points")
        .unwrap()
        .with_table("my_inbox")
        .unwrap();
    inbox.migrate().await.unwrap();
    inbox.migrate().await.unwrap(); // idempotent
    let out =
        idem_inbox::Inbox::process(&inbox, "m-1", |_tx| Box::pin(async { Ok::<_, Error>(7) }))
            .await
            .unwrap();
    assert_eq!(out, idem_inbox::Outcome::Processed(7));
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT consumer, message_id FROM my_inbox")
        .fetch_all(&b.pool)
        .await
        .unwrap();
    assert_eq!(rows, vec![("points".to_owned(), "m-1".to_owned())]);
}

#[test]
fn unsafe_table_name_is_rejected() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = SqlitePool::connect("sqlite::memory:").await.unwrap();
        let r = SqliteInbox::new(pool, "points")
            .unwrap()
            .with_table("inbox; DROP TABLE ledger");
        assert!(matches!(
            r,
            Err(Error::Invalid {
                what: "table name",
                ..
            })
        ));
    });
}
