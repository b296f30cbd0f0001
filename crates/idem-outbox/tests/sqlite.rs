//! The outbox on SQLite.

mod common;

use std::sync::Arc;

use common::cases::{Backend, event};
use common::{FakeBroker, Shared};
use idem_outbox::{Message, Outbox, Relay, SqliteOutbox};
use sqlx::SqlitePool;

#[derive(Clone)]
struct Sqlite {
    pool: SqlitePool,
    outbox: SqliteOutbox,
    _dir: Arc<tempfile::TempDir>,
}

async fn setup(_case: &str) -> Option<Sqlite> {
    let dir = tempfile::tempdir().unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("service.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(10));
    let pool = SqlitePool::connect_with(options).await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    // A short lease: the cases start a relay after another one stopped (or was killed).
    let outbox =
        SqliteOutbox::new(pool.clone()).with_relay_lease(std::time::Duration::from_millis(50));
    outbox.migrate().await.unwrap();
    outbox.migrate().await.unwrap();
    Some(Sqlite {
        pool,
        outbox,
        _dir: Arc::new(dir),
    })
}

impl Backend for Sqlite {
    type O = SqliteOutbox;

    fn outbox(&self) -> SqliteOutbox {
        self.outbox.clone()
    }

    async fn order(&self, order: i64, messages: Vec<Message>, commit: bool) {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query("INSERT INTO orders (id) VALUES (?1)")
            .bind(order)
            .execute(&mut *tx)
            .await
            .unwrap();
        for m in &messages {
            self.outbox.stage(&mut tx, m).await.unwrap();
        }
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }

    async fn orders(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

outbox_cases!(setup);

#[tokio::test]
async fn a_second_relay_on_the_same_file_stays_idle_while_the_first_holds_it() {
    let b = setup("lease").await.unwrap();
    b.order(1, vec![event("x1")], true).await;
    let (one, two) = (FakeBroker::default(), FakeBroker::default());
    let outbox = b
        .outbox()
        .with_relay_lease(std::time::Duration::from_secs(60));
    let first = Relay::new(outbox.clone(), Shared(Arc::new(one.clone())));
    let second = Relay::new(outbox, Shared(Arc::new(two.clone())));
    assert_eq!(first.round().await.unwrap().published, 1);
    b.order(2, vec![event("x2")], true).await;
    assert_eq!(
        second.round().await.unwrap().claimed,
        0,
        "the file is the first's"
    );
    assert_eq!(first.round().await.unwrap().published, 1);
    assert_eq!(one.delivered_ids(), ["x1", "x2"]);
    assert!(two.delivered().is_empty());
}

#[tokio::test]
async fn table_names_are_checked() {
    let b = setup("names").await.unwrap();
    assert!(
        SqliteOutbox::new(b.pool.clone())
            .with_table("x; drop")
            .is_err()
    );
    let custom = SqliteOutbox::new(b.pool.clone())
        .with_table("custom_outbox")
        .unwrap();
    custom.migrate().await.unwrap();
    assert_eq!(custom.table(), "custom_outbox");
}
