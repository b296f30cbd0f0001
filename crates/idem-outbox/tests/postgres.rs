//! The outbox on PostgreSQL, several relays sharing one table.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cases::{Backend, event};
use common::{FakeBroker, Shared};
use idem_outbox::{Message, Outbox, PgOutbox, Relay, RelayOptions};
use sqlx::{AssertSqlSafe, PgPool};

#[derive(Clone)]
struct Pg {
    pool: PgPool,
    outbox: PgOutbox,
    orders: String,
}

async fn setup(case: &str) -> Option<Pg> {
    let pool = common::pg_pool(16).await?;
    let table = common::unique(case);
    let orders = format!("{table}_orders");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let outbox = PgOutbox::new(pool.clone()).with_table(&table).unwrap();
    outbox.migrate().await.unwrap();
    outbox.migrate().await.unwrap();
    Some(Pg {
        pool,
        outbox,
        orders,
    })
}

impl Backend for Pg {
    type O = PgOutbox;

    fn outbox(&self) -> PgOutbox {
        self.outbox.clone()
    }

    async fn order(&self, order: i64, messages: Vec<Message>, commit: bool) {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id) VALUES ($1)",
            self.orders
        )))
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
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}",
            self.orders
        )))
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn cleanup(&self) {
        let sql = format!(
            "DROP TABLE IF EXISTS {}, {}",
            self.orders,
            self.outbox.table()
        );
        sqlx::query(AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

outbox_cases!(setup);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_publish_each_message_once() {
    let Some(b) = setup("tworelays").await else {
        return;
    };
    common::cases::two_relays_publish_each_message_once(b.clone()).await;
    b.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_wakes_the_relay_through_notify_not_the_poll() {
    let Some(b) = setup("notify").await else {
        return;
    };
    let broker = Arc::new(FakeBroker::default());
    // A poll this long means only the notification can wake it within the test.
    let relay = Arc::new(Relay::new(b.outbox(), Shared(broker.clone())).with_options(
        RelayOptions {
            poll_interval: Duration::from_secs(3600),
            ..RelayOptions::default()
        },
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    // Let it go idle, listening.
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.order(1, vec![event("woken")], true).await;
    idem_test_support::eventually(
        "published after the commit",
        Duration::from_secs(20),
        async || broker.delivered().len() == 1,
    )
    .await;
    stop.send(()).unwrap();
    task.await.unwrap();
    b.cleanup().await;
}
