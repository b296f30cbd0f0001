//! Exactly-once effects for at-least-once message consumers (SPEC S12).
//!
//! Brokers deliver a message at least once: after a consumer crash, a lost ack or a
//! publisher's retry, the same message arrives again. An [`Inbox`] keeps a
//! processed-message table keyed by `(consumer, message_id)` with a unique constraint,
//! and [`Inbox::process`] inserts that row and runs the caller's effects **in one
//! transaction**: the first delivery commits both; a later one finds the row, skips the
//! effects and reports [`Outcome::Duplicate`] so the caller acks it.
//!
//! | backend | feature | guarantee |
//! |---|---|---|
//! | [`SqliteInbox`] | `sqlite` | exactly once, effects in the same SQLite transaction |
//! | [`PgInbox`] | `postgres` | exactly once, effects in the same PostgreSQL transaction, many consumers |
//! | `MySqlInbox` | `mysql` | exactly once, effects in the same MySQL or MariaDB transaction, many consumers |
//! | [`RedisInbox`] | `redis` | effects outside any transaction: at least once across crashes (see its docs) |
//!
//! [`SqliteInbox`], [`PgInbox`] and `MySqlInbox` are one implementation, [`SqlInbox`],
//! over the sqlx database named by [`SqlDatabase`], whose dialect `idem-sql` keeps.
//!
//! The PostgreSQL pool and the Redis client a caller hands in may use TLS: the
//! `postgres` and `redis` features build sqlx and redis-rs with rustls on the ring
//! provider (`sslmode=verify-full&sslrootcert=FILE`, `rediss://`).
//!
//! [`JetStreamInbox`] (feature `nats`) drives a NATS JetStream pull consumer through an
//! inbox and acks each message only after its transaction committed; [`Publisher`] sets
//! `Nats-Msg-Id` so JetStream's own duplicate window applies too. [`RabbitInbox`]
//! (feature `rabbitmq`) does the same for a RabbitMQ queue (classic or quorum): manual
//! acks after commit, a prefetch, redeliveries de-duplicated on the AMQP `message-id`,
//! reconnection. Rows are kept for a
//! retention ([`DEFAULT_RETENTION`], 7 days), purged in bounded batches
//! ([`Inbox::purge`], [`Purger`]); [`Inbox::check_retention`] and
//! [`JetStreamInbox::check_retention`] warn when the broker may redeliver a message
//! after the inbox forgot it.
//!
//! # Examples
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> Result<(), idem_inbox::Error> {
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! # rt.block_on(async {
//! use idem_inbox::{BoxFuture, Error, Inbox, Outcome, SqliteInbox};
//! use sqlx::{Sqlite, Transaction};
//!
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! sqlx::query("CREATE TABLE points (account TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
//!     .execute(&pool)
//!     .await?;
//! let inbox = SqliteInbox::new(pool.clone(), "points")?;
//! inbox.migrate().await?;
//!
//! // The effects: credit alice 10 points, inside the inbox's transaction.
//! fn credit<'t>(tx: &'t mut Transaction<'static, Sqlite>) -> BoxFuture<'t, Result<(), Error>> {
//!     Box::pin(async move {
//!         sqlx::query(
//!             "INSERT INTO points VALUES ('alice', 10) \
//!              ON CONFLICT (account) DO UPDATE SET balance = balance + 10",
//!         )
//!         .execute(&mut **tx)
//!         .await?;
//!         Ok(())
//!     })
//! }
//! // The broker delivers message "m-1" twice; the points are credited once.
//! assert_eq!(inbox.process("m-1", credit).await?, Outcome::Processed(()));
//! assert_eq!(inbox.process("m-1", credit).await?, Outcome::Duplicate);
//!
//! let balance: i64 = sqlx::query_scalar("SELECT balance FROM points WHERE account = 'alice'")
//!     .fetch_one(&pool)
//!     .await?;
//! assert_eq!(balance, 10);
//! # Ok(()) })
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

mod error;
mod inbox;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "rabbitmq")]
mod rabbit;
#[cfg(feature = "redis")]
mod redis;
mod retention;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use error::{Error, Result};
pub use futures_util::future::BoxFuture;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use idem_sql::SqlDatabase;
pub use inbox::{Inbox, MAX_ID_LEN, Outcome};
#[cfg(feature = "mysql")]
pub use mysql::MySqlInbox;
#[cfg(feature = "nats")]
pub use nats::{
    ConsumerStats, Delivery, IdSource, JetStreamInbox, NATS_MSG_ID, NatsOptions, Publisher,
    broker_window, handler,
};
#[cfg(feature = "postgres")]
pub use postgres::PgInbox;
#[cfg(feature = "rabbitmq")]
pub use rabbit::{QueueType, RabbitDelivery, RabbitInbox, RabbitOptions, RabbitStats};
#[cfg(feature = "redis")]
pub use redis::{DEFAULT_IN_FLIGHT_LEASE, RedisInbox};
pub use retention::{DEFAULT_RETENTION, PurgeConfig, Purger, RetentionWarning, check_retention};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use sql::{DEFAULT_TABLE, SqlInbox};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteInbox;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
