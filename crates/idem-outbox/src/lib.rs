//! A transactional outbox: the publishing side of exactly-once effects across a broker
//! (SPEC S12, S9).
//!
//! A service that changes its database and must tell others about it cannot do both
//! atomically: the commit may succeed and the publish fail, or the reverse. The outbox
//! makes the message part of the database change. [`Outbox::stage`] writes it into an
//! outbox table **in the caller's own transaction** (SQLite or PostgreSQL through
//! sqlx), so the business rows and the message commit or roll back together; a
//! [`Relay`] then publishes what committed and marks it published only after the
//! broker confirmed it.
//!
//! | piece | feature | what it guarantees |
//! |---|---|---|
//! | [`SqliteOutbox`] | `sqlite` | staged in the caller's SQLite transaction; one relay per file (a lease) |
//! | [`PgOutbox`] | `postgres` | staged in the caller's PostgreSQL transaction; several relays share the table (`FOR UPDATE SKIP LOCKED`), woken by `LISTEN/NOTIFY`, a poll behind it |
//! | `MySqlOutbox` | `mysql` | staged in the caller's MySQL or MariaDB transaction; several relays share the table (`FOR UPDATE SKIP LOCKED`), found by polling |
//! | [`NatsPublisher`] | `nats` | JetStream publish with `Nats-Msg-Id` = message id, the stream's ack awaited |
//! | [`RabbitPublisher`] | `rabbitmq` | AMQP publish with publisher confirms, persistent delivery, `message-id` = message id, `mandatory` |
//!
//! [`SqliteOutbox`], [`PgOutbox`] and `MySqlOutbox` are one implementation, [`SqlOutbox`], over the
//! sqlx database named by [`OutboxDatabase`], whose dialect ([`SqlDatabase`])
//! `idem-sql` keeps.
//!
//! Delivery is at least once and never loses a committed message: a relay killed
//! between the broker's confirmation and its mark publishes the message again, so the
//! consumer de-duplicates on the message id (`idem-inbox`). Messages sharing an
//! ordering key are published in staging order, each after the broker confirmed the
//! one before. A message the broker refuses for good (too large, no stream or route)
//! is parked with the reason ([`Outbox::parked`], [`Outbox::requeue`]) instead of
//! blocking the rest; other failures are retried with a capped exponential backoff.
//!
//! # Examples
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> Result<(), idem_outbox::Error> {
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! # rt.block_on(async {
//! use idem_outbox::{Destination, Message, Outbox, SqliteOutbox};
//!
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)").execute(&pool).await?;
//! let outbox = SqliteOutbox::new(pool.clone());
//! outbox.migrate().await?;
//!
//! // The order and its event commit together...
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (1)").execute(&mut *tx).await?;
//! let event = Message::with_id("order-1.created", Destination::subject("orders.created"), "{}");
//! outbox.stage(&mut tx, &event).await?;
//! tx.commit().await?;
//!
//! // ...and roll back together.
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (2)").execute(&mut *tx).await?;
//! let event = Message::with_id("order-2.created", Destination::subject("orders.created"), "{}");
//! outbox.stage(&mut tx, &event).await?;
//! tx.rollback().await?;
//!
//! assert_eq!(outbox.stats().await?.unpublished, 1);
//! # Ok(()) })
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

mod error;
mod message;
mod metrics;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "nats")]
mod nats;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
mod publish;
#[cfg(feature = "rabbitmq")]
mod rabbit;
mod relay;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod table;

pub use error::{Error, Result};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use idem_sql::SqlDatabase;
pub use message::{Destination, MAX_ID_LEN, Message, ParkedMessage, StagedMessage};
pub use metrics::{MetricsSnapshot, RelayMetrics};
#[cfg(feature = "mysql")]
pub use mysql::MySqlOutbox;
#[cfg(feature = "nats")]
pub use nats::NatsPublisher;
pub use outbox::{Outbox, OutboxStats, Settlement};
#[cfg(feature = "postgres")]
pub use postgres::PgOutbox;
pub use publish::{Publish, PublishError};
#[cfg(feature = "rabbitmq")]
pub use rabbit::RabbitPublisher;
pub use relay::{Relay, RelayOptions, RoundReport};
#[cfg(feature = "sqlite")]
pub use sql::SQLITE_RELAY_LEASE;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use sql::{OutboxDatabase, SqlOutbox};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteOutbox;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use table::DEFAULT_TABLE;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
