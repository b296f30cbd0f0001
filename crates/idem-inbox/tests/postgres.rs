//! `PgInbox` against the PostgreSQL server (SPEC S12).

mod common;

use std::time::Duration;

use idem_core::SharedClock;
use idem_inbox::{BoxFuture, Error, PgInbox};
use sqlx::{PgPool, Postgres, Transaction};

#[derive(Clone)]
struct PgBackend {
    pool: PgPool,
    table: String,
    ledger: String,
}

async fn setup(case: &str) -> Option<PgBackend> {
    let pool = common::pg_pool(20).await?;
    let ns = idem_core::testing::unique_namespace(case);
    let ledger = format!("ledger_{ns}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {ledger} (message_id TEXT NOT NULL, amount BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    Some(PgBackend {
        pool,
        table: format!("inbox_{ns}"),
        ledger,
    })
}

impl common::cases::Backend for PgBackend {
    type I = PgInbox;

    async fn inbox(&self, consumer: &str, retention: Duration, clock: SharedClock) -> PgInbox {
        let inbox = PgInbox::new(self.pool.clone(), consumer)
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
        tx: &'t mut Transaction<'static, Postgres>,
        ledger: String,
        message_id: String,
        amount: i64,
    ) -> BoxFuture<'t, Result<(), Error>> {
        Box::pin(async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {ledger} (message_id, amount) VALUES ($1, $2)"
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
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT message_id, amount FROM {} ORDER BY message_id, amount",
            self.ledger
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }
}

inbox_cases!(setup);
