//! Helpers shared by the integration tests: service connections and the inbox cases
//! every SQL backend runs.

#![allow(dead_code)]

pub mod cases;

use std::time::Duration;

use idem_test_support::service_unavailable;
pub use idem_test_support::services::{nats_url, postgres_url as pg_url, redis_url};

/// A PostgreSQL pool, or `None` (skipped loudly) when the server is unreachable.
pub async fn pg_pool(max_connections: u32) -> Option<sqlx::PgPool> {
    let url = pg_url();
    let connect = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => service_unavailable("PostgreSQL", &url, &e),
        Err(e) => service_unavailable("PostgreSQL", &url, &e),
    }
}

/// A MySQL or MariaDB pool (`IDEM_TEST_MYSQL_URL`), or `None` (skipped loudly) when
/// the server is unreachable.
#[cfg(feature = "mysql")]
pub async fn mysql_pool(max_connections: u32) -> Option<sqlx::MySqlPool> {
    let url = idem_test_support::services::mysql_url();
    let connect = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => service_unavailable("MySQL", &url, &e),
        Err(e) => service_unavailable("MySQL", &url, &e),
    }
}

/// A NATS client and its JetStream context, or `None` (skipped loudly).
pub async fn nats() -> Option<(async_nats::Client, async_nats::jetstream::Context)> {
    let url = nats_url();
    let connect = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(client)) => {
            let js = async_nats::jetstream::new(client.clone());
            Some((client, js))
        }
        Ok(Err(e)) => service_unavailable("NATS", &url, &e),
        Err(e) => service_unavailable("NATS", &url, &e),
    }
}

/// A Redis connection, or `None` (skipped loudly).
pub async fn redis_conn() -> Option<redis::aio::MultiplexedConnection> {
    let url = redis_url();
    let client = match redis::Client::open(url.as_str()) {
        Ok(c) => c,
        Err(e) => return service_unavailable("Redis", &url, &e),
    };
    let connect = client.get_multiplexed_async_connection();
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(e)) => service_unavailable("Redis", &url, &e),
        Err(e) => service_unavailable("Redis", &url, &e),
    }
}

/// A JetStream stream and durable pull consumer with names unique to one test run.
/// Call [`TestStream::delete`] at the end; a stream left behind by a failed test ages
/// out by itself (max age 10 minutes).
pub struct TestStream {
    pub js: async_nats::jetstream::Context,
    pub name: String,
    pub subject: String,
    pub consumer: String,
}

impl TestStream {
    pub async fn create(
        js: &async_nats::jetstream::Context,
        case: &str,
        ack_wait: Duration,
        max_deliver: i64,
    ) -> TestStream {
        use async_nats::jetstream::{consumer, stream};
        let ns = idem_core::testing::unique_namespace(case);
        let name = format!("INBOX_{ns}");
        let subject = format!("inbox.{ns}");
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            max_age: Duration::from_secs(600),
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        // The server removes an account's stream directory when its last stream is
        // deleted; a create racing that removal (tests run in parallel) fails with
        // "error creating store for stream". It succeeds when tried again.
        let mut tries = 0;
        let created = loop {
            match js.create_stream(config.clone()).await {
                Ok(created) => break created,
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("create stream {name} failed ({e}); trying again");
                    tokio::time::sleep(Duration::from_millis(50 * tries)).await;
                }
                Err(e) => panic!("create stream {name}: {e}"),
            }
        };
        created
            .create_consumer(consumer::pull::Config {
                durable_name: Some("points".to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait,
                max_deliver,
                ..Default::default()
            })
            .await
            .expect("create consumer");
        TestStream {
            js: js.clone(),
            name,
            subject,
            consumer: "points".to_owned(),
        }
    }

    /// Messages stored in the stream.
    pub async fn stored(&self) -> u64 {
        let stream = self.js.get_stream(&self.name).await.unwrap();
        stream.get_info().await.unwrap().state.messages
    }

    /// Whether the consumer has nothing left to deliver or to be acked.
    pub async fn drained(&self) -> bool {
        let mut consumer: async_nats::jetstream::consumer::PullConsumer = self
            .js
            .get_consumer_from_stream(&self.consumer, &self.name)
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        info.num_pending == 0 && info.num_ack_pending == 0
    }

    pub async fn delete(self) {
        self.js
            .delete_stream(&self.name)
            .await
            .expect("delete stream");
    }
}

/// A SQLite pool on a fresh file in `dir`, with a `ledger` table.
pub async fn sqlite_ledger(dir: &std::path::Path) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("ledger.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS ledger (message_id TEXT NOT NULL, account TEXT NOT NULL, \
         amount INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool
}

/// Parses a test payload `"account amount"`.
pub fn parse_credit(payload: &[u8]) -> Result<(String, i64), idem_inbox::Error> {
    let text = std::str::from_utf8(payload).map_err(idem_inbox::Error::handler)?;
    let (account, amount) = text
        .split_once(' ')
        .ok_or_else(|| idem_inbox::Error::handler(format!("bad payload {text:?}")))?;
    let amount = amount.parse().map_err(idem_inbox::Error::handler)?;
    Ok((account.to_owned(), amount))
}
