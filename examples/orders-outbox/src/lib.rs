//! Exactly-once effects from an HTTP request to a consumer, through a real broker, with
//! `kill -9` anywhere (issue 41 §3).
//!
//! Three processes, each killable at any moment, and a client:
//!
//! - **the service** (`orders-outbox-service`): `orders-api` behind the tower layer; a
//!   new order, its key's completion and its `order.created` event commit in one SQLite
//!   transaction;
//! - **the relay** (`orders-outbox-relay`): publishes the staged events to NATS
//!   JetStream or RabbitMQ, marking each only after the broker confirmed it;
//! - **the consumer** (`orders-outbox-consumer`): credits each order's amount to a
//!   ledger through an inbox, acking only after the credit committed;
//! - **the client** ([`scenario`]): `idem-client` operations, some of whose first
//!   answers are thrown away (a lost answer) before the operation is sent again with its
//!   key.
//!
//! [`scenario::run`] kills the three at random points, restarts them, and at the end
//! checks that every order exists once, every event was published and consumed once
//! (the ledger is exact), and nothing staged was lost.

pub mod scenario;

use std::time::Duration;

use idem_inbox::{Error, JetStreamInbox, NatsOptions, RabbitInbox, RabbitOptions, SqliteInbox};
use idem_outbox::{NatsPublisher, RabbitPublisher, Relay, RelayOptions, SqliteOutbox};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

/// The error type of the roles.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The environment the child processes read.
pub mod env {
    /// The orders database: the service's and the relay's SQLite file (a path).
    pub const ORDERS_DB: &str = "ORDERS_OUTBOX_DB";
    /// The consumer's SQLite file: its inbox and the ledger (a path).
    pub const LEDGER_DB: &str = "ORDERS_OUTBOX_LEDGER";
    /// The service's address.
    pub const ADDR: &str = "ORDERS_OUTBOX_ADDR";
    /// `nats` or `rabbitmq`.
    pub const BROKER: &str = "ORDERS_OUTBOX_BROKER";
    /// The broker's URL.
    pub const BROKER_URL: &str = "ORDERS_OUTBOX_BROKER_URL";
    /// The events' subject (NATS) or queue (RabbitMQ).
    pub const SUBJECT: &str = "ORDERS_OUTBOX_SUBJECT";
    /// The JetStream stream (NATS only); its durable consumer is `ledger`.
    pub const STREAM: &str = "ORDERS_OUTBOX_STREAM";
}

/// The JetStream durable consumer's name.
pub const DURABLE: &str = "ledger";

/// Which broker carries the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// NATS JetStream.
    Nats,
    /// RabbitMQ (a quorum queue).
    RabbitMq,
}

impl Broker {
    /// Its name in [`env::BROKER`].
    pub fn name(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::RabbitMq => "rabbitmq",
        }
    }

    fn from_env() -> Result<Broker, BoxError> {
        match var(env::BROKER)?.as_str() {
            "nats" => Ok(Broker::Nats),
            "rabbitmq" => Ok(Broker::RabbitMq),
            other => Err(format!("{}={other:?}: nats or rabbitmq", env::BROKER).into()),
        }
    }
}

fn var(name: &str) -> Result<String, BoxError> {
    std::env::var(name).map_err(|_| format!("{name} is not set").into())
}

/// A WAL-mode SQLite pool on `path` with a busy timeout: the service and the relay
/// write the same file from two processes.
pub async fn sqlite(path: &str) -> Result<SqlitePool, BoxError> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    Ok(SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?)
}

/// The service: `orders-api` on [`env::ADDR`] over [`env::ORDERS_DB`], with a short
/// lease so that the key of an attempt killed mid-request is taken over soon.
pub async fn serve() -> Result<(), BoxError> {
    let db = format!("sqlite://{}", var(env::ORDERS_DB)?);
    let store = orders_api::open(&db, orders_api::system_clock()).await?;
    let settings = orders_api::Settings {
        lease: Duration::from_secs(2),
        events_subject: var(env::SUBJECT)?,
        ..orders_api::Settings::default()
    };
    let (router, _) = orders_api::app(store, settings);
    let listener = tokio::net::TcpListener::bind(var(env::ADDR)?).await?;
    println!("READY");
    axum::serve(listener, router).await?;
    Ok(())
}

/// The relay: the orders file's outbox to the broker, until killed.
// ANCHOR: relay (the user guide shows a relay from here)
pub async fn relay() -> Result<(), BoxError> {
    let pool = sqlite(&var(env::ORDERS_DB)?).await?;
    // A short lease: the relay that replaces a killed one takes the file over soon.
    let outbox = SqliteOutbox::new(pool).with_relay_lease(Duration::from_secs(1));
    outbox.migrate().await?;
    let options = RelayOptions {
        poll_interval: Duration::from_millis(20),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(500),
        ..RelayOptions::default()
    };
    let url = var(env::BROKER_URL)?;
    println!("READY");
    match Broker::from_env()? {
        Broker::Nats => {
            let js = async_nats::jetstream::new(async_nats::connect(&url).await?);
            let relay = Relay::new(outbox, NatsPublisher::new(js)).with_options(options);
            relay.run(std::future::pending::<()>()).await;
        }
        Broker::RabbitMq => {
            let publisher = RabbitPublisher::connect(&url).await?;
            let relay = Relay::new(outbox, publisher).with_options(options);
            relay.run(std::future::pending::<()>()).await;
        }
    }
    Ok(())
}
// ANCHOR_END: relay

/// The ledger table: no unique constraint, so that a double credit would show.
const LEDGER: &str = "CREATE TABLE IF NOT EXISTS ledger (message_id TEXT NOT NULL, \
                      order_id INTEGER NOT NULL, amount INTEGER NOT NULL)";

/// Credits an `order.created` event's amount inside the inbox's transaction.
async fn credit(
    message_id: String,
    body: &[u8],
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
) -> Result<(), Error> {
    let event: serde_json::Value = serde_json::from_slice(body).map_err(Error::handler)?;
    let (Some(order), Some(amount)) = (event["order_id"].as_i64(), event["amount_cents"].as_i64())
    else {
        return Err(Error::handler(format!(
            "not an order.created event: {event}"
        )));
    };
    sqlx::query("INSERT INTO ledger (message_id, order_id, amount) VALUES (?1, ?2, ?3)")
        .bind(message_id)
        .bind(order)
        .bind(amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The consumer: the broker's events through a SQLite inbox into the ledger.
pub async fn consume() -> Result<(), BoxError> {
    let pool = sqlite(&var(env::LEDGER_DB)?).await?;
    sqlx::query(LEDGER).execute(&pool).await?;
    let inbox = SqliteInbox::new(pool, "ledger")?;
    inbox.migrate().await?;
    let url = var(env::BROKER_URL)?;
    println!("READY");
    match Broker::from_env()? {
        Broker::Nats => {
            let js = async_nats::jetstream::new(async_nats::connect(&url).await?);
            let options = NatsOptions {
                nak_delay: Duration::from_millis(100),
                ..NatsOptions::default()
            };
            let consumer =
                JetStreamInbox::new(js, &var(env::STREAM)?, DURABLE, inbox, options).await?;
            consumer
                .run(
                    |d, tx| Box::pin(async move { credit(d.message_id, &d.payload, tx).await }),
                    std::future::pending::<()>(),
                )
                .await?;
        }
        // ANCHOR: rabbit_consumer (the user guide shows a RabbitInbox from here)
        Broker::RabbitMq => {
            let options = RabbitOptions {
                requeue_delay: Duration::from_millis(100),
                reconnect_backoff: Duration::from_millis(50),
                ..RabbitOptions::default()
            };
            let consumer = RabbitInbox::new(&url, &var(env::SUBJECT)?, inbox, options);
            consumer
                .run(
                    |d, tx| Box::pin(async move { credit(d.message_id, &d.payload, tx).await }),
                    std::future::pending::<()>(),
                )
                .await?;
        } // ANCHOR_END: rabbit_consumer
    }
    Ok(())
}

/// The ledger's `(rows, distinct orders, total)`, read from outside the consumer.
pub async fn ledger_totals(pool: &SqlitePool) -> Result<(i64, i64, i64), BoxError> {
    sqlx::query(LEDGER).execute(pool).await?;
    Ok(sqlx::query_as(
        "SELECT count(*), count(DISTINCT order_id), coalesce(sum(amount), 0) FROM ledger",
    )
    .fetch_one(pool)
    .await?)
}
