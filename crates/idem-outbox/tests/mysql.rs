//! The outbox on MySQL or MariaDB, several relays sharing one table.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cases::{Backend, event};
use common::{FakeBroker, Shared};
use idem_outbox::{Destination, MAX_ID_LEN, Message, MySqlOutbox, Outbox, Relay, RelayOptions};
use sqlx::{AssertSqlSafe, MySqlPool};

#[derive(Clone)]
struct My {
    pool: MySqlPool,
    outbox: MySqlOutbox,
    orders: String,
}

async fn setup(case: &str) -> Option<My> {
    let pool = common::mysql_pool(16).await?;
    let table = common::unique(case);
    let orders = format!("{table}_orders");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY) ENGINE=InnoDB"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let outbox = MySqlOutbox::new(pool.clone()).with_table(&table).unwrap();
    outbox.migrate().await.unwrap();
    outbox.migrate().await.unwrap();
    Some(My {
        pool,
        outbox,
        orders,
    })
}

impl Backend for My {
    type O = MySqlOutbox;

    fn outbox(&self) -> MySqlOutbox {
        self.outbox.clone()
    }

    async fn order(&self, order: i64, messages: Vec<Message>, commit: bool) {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id) VALUES (?)",
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

/// A relay holding its claim (the broker has not confirmed yet) does not hold up the
/// application's transactions that stage new messages: the claim locks rows, not the
/// gap after the last one, as it would under REPEATABLE READ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_in_progress_does_not_block_staging() {
    let Some(b) = setup("claimgap").await else {
        return;
    };
    b.order(1, vec![event("held")], true).await;
    let outbox = b.outbox();
    let (batch, claimed) = outbox.claim("relay-a", 16).await.unwrap();
    assert_eq!(claimed.len(), 1);
    // A second relay skips the locked row.
    let (other, none) = outbox.claim("relay-b", 16).await.unwrap();
    assert!(none.is_empty());
    drop(other);
    tokio::time::timeout(Duration::from_secs(5), b.order(2, vec![event("new")], true))
        .await
        .expect("staging waited for the relay's claim");
    outbox
        .settle(
            batch,
            claimed
                .iter()
                .map(|m| (m.seq, idem_outbox::Settlement::Published))
                .collect(),
        )
        .await
        .unwrap();
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.unpublished, stats.published), (1, 1));
    b.cleanup().await;
}

/// Ids, ordering keys and headers MySQL's text columns would cut short or take for one
/// another (255 characters, trailing spaces, 64 KiB) are staged, and come back, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_ids_keys_and_headers_come_back_whole() {
    let Some(b) = setup("mysqlids").await else {
        return;
    };
    let long = "é".repeat(MAX_ID_LEN / 2);
    let other = format!("{}x", &long[..long.len() - 2]);
    let header = "h".repeat(100_000);
    let messages = vec![
        Message::with_id(long.as_str(), Destination::subject("s"), "1")
            .ordering_key(long.as_str())
            .header("big", header.as_str()),
        Message::with_id(other.as_str(), Destination::subject("s"), "2"),
        Message::with_id("m-1", Destination::subject("s"), "3"),
        Message::with_id("m-1 ", Destination::subject("s"), "4"),
    ];
    b.order(1, messages.clone(), true).await;
    let broker = Arc::new(FakeBroker::default());
    let relay = Relay::new(b.outbox(), Shared(broker.clone())).with_options(RelayOptions {
        poll_interval: Duration::from_millis(20),
        ..RelayOptions::default()
    });
    relay.round().await.unwrap();
    assert_eq!(broker.delivered(), messages);
    b.cleanup().await;
}
