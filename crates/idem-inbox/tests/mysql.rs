//! `MySqlInbox` against the MySQL or MariaDB server (SPEC S12): the cases every SQL
//! backend runs, and the message ids MySQL's text keys would confuse.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{SharedClock, SystemClock};
use idem_inbox::{BoxFuture, Error, Inbox, MAX_ID_LEN, MySqlInbox, Outcome};
use sqlx::{MySql, MySqlPool, Transaction};

#[derive(Clone)]
struct MyBackend {
    pool: MySqlPool,
    table: String,
    ledger: String,
}

async fn setup(case: &str) -> Option<MyBackend> {
    let pool = common::mysql_pool(20).await?;
    let ns = idem_core::testing::unique_namespace(case);
    let ledger = format!("ledger_{ns}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {ledger} (message_id VARBINARY(512) NOT NULL, amount BIGINT NOT NULL) \
         ENGINE=InnoDB"
    )))
    .execute(&pool)
    .await
    .unwrap();
    Some(MyBackend {
        pool,
        table: format!("inbox_{ns}"),
        ledger,
    })
}

impl common::cases::Backend for MyBackend {
    type I = MySqlInbox;

    async fn inbox(&self, consumer: &str, retention: Duration, clock: SharedClock) -> MySqlInbox {
        let inbox = MySqlInbox::new(self.pool.clone(), consumer)
            .unwrap()
            .with_table(&self.table)
            .unwrap()
            .with_retention(retention)
            .with_clock(clock);
        inbox.migrate().await.unwrap();
        inbox
    }

    fn ledger_table(&self) -> String {
        self.ledger.clone()
    }

    fn credit<'t>(
        tx: &'t mut Transaction<'static, MySql>,
        ledger: String,
        message_id: String,
        amount: i64,
    ) -> BoxFuture<'t, Result<(), Error>> {
        Box::pin(async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {ledger} (message_id, amount) VALUES (?, ?)"
            )))
            .bind(message_id)
            .bind(amount)
            .execute(&mut **tx)
            .await?;
            Ok(())
        })
    }

    async fn cleanup(&self) {
        let sql = format!("DROP TABLE IF EXISTS {}, {}", self.table, self.ledger);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .unwrap();
    }

    async fn ledger(&self) -> Vec<(String, i64)> {
        let rows: Vec<(Vec<u8>, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT message_id, amount FROM {} ORDER BY message_id, amount",
            self.ledger
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(id, amount)| (String::from_utf8(id).unwrap(), amount))
            .collect()
    }
}

inbox_cases!(setup);

/// Ids that a `VARCHAR(255)` key in MySQL's binary collation would take for one: one
/// longer than 255 characters and another sharing its first 255, one with a trailing
/// space and the same without, two differing only in case. Each is processed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_mysql_text_would_confuse_are_each_processed() {
    use common::cases::Backend;
    let Some(backend) = setup("mysql_ids").await else {
        return;
    };
    let inbox = backend
        .inbox("points", Duration::from_secs(3600), Arc::new(SystemClock))
        .await;
    let long = "é".repeat(MAX_ID_LEN / 2);
    let longer_prefix = format!("{}x", &long[..long.len() - 2]);
    let ids = [long.as_str(), longer_prefix.as_str(), "m-1", "m-1 ", "M-1"];
    for id in ids {
        assert!(id.len() <= MAX_ID_LEN);
        let ledger = backend.ledger_table();
        let outcome = inbox
            .process(id, move |tx| {
                MyBackend::credit(tx, ledger, id.to_owned(), 1)
            })
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Processed(()), "{id:?}");
    }
    for id in ids {
        assert!(inbox.contains(id).await.unwrap(), "{id:?}");
        let again = inbox
            .process(id, |_| Box::pin(async { Ok::<_, Error>(()) }))
            .await
            .unwrap();
        assert_eq!(again, Outcome::Duplicate, "{id:?}");
    }
    assert_eq!(backend.ledger().await.len(), ids.len());
    backend.cleanup().await;
}
