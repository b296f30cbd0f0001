//! Credits "points" messages from a NATS JetStream stream to a SQLite ledger, each
//! exactly once, however often JetStream delivers it.
//!
//! The ledger's balance update and the inbox's processed-message row commit in one
//! SQLite transaction ([`idem_inbox::SqliteInbox`]); the message is acked only after
//! that commit ([`idem_inbox::JetStreamInbox`]). A redelivery (consumer crash, lost ack)
//! finds the row and is acked without crediting again; a republish inside JetStream's
//! duplicate window never reaches the consumer at all ([`idem_inbox::Publisher`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), idem_inbox::Error> {
//! let client = async_nats::connect("127.0.0.1:4222").await.map_err(idem_inbox::Error::broker)?;
//! let js = async_nats::jetstream::new(client);
//! let names = points_consumer::Names::default();
//! points_consumer::ensure_stream(&js, &names).await?;
//! let ledger = points_consumer::Ledger::open("points.db".as_ref()).await?;
//! let consumer = ledger.consumer(js, &names).await?;
//! let stats = consumer.run(points_consumer::credit_handler(), std::future::pending()).await?;
//! # let _ = stats; Ok(()) }
//! ```

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use idem_inbox::{
    BoxFuture, Delivery, Error, JetStreamInbox, NatsOptions, Publisher, SqliteInbox, handler,
};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool, Transaction};

/// A "credit points" message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credit {
    /// The account to credit.
    pub account: String,
    /// How many points.
    pub points: i64,
}

/// The stream, subject and durable consumer the example uses.
#[derive(Debug, Clone)]
pub struct Names {
    /// The stream.
    pub stream: String,
    /// The subject credits are published to.
    pub subject: String,
    /// The durable pull consumer, also the inbox's consumer name.
    pub consumer: String,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            stream: "POINTS".to_owned(),
            subject: "points.credit".to_owned(),
            consumer: "points-ledger".to_owned(),
        }
    }
}

/// Creates the stream and the durable consumer unless they exist. The stream keeps
/// messages a day and de-duplicates publishes for 2 minutes; the consumer redelivers an
/// unacked message after 30 s, at most 10 times. The inbox's 7 days cover both.
pub async fn ensure_stream(js: &jetstream::Context, names: &Names) -> Result<(), Error> {
    let stream = js
        .get_or_create_stream(stream::Config {
            name: names.stream.clone(),
            subjects: vec![names.subject.clone()],
            max_age: Duration::from_secs(24 * 3600),
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(Error::broker)?;
    stream
        .get_or_create_consumer(
            &names.consumer,
            consumer::pull::Config {
                durable_name: Some(names.consumer.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_deliver: 10,
                ..Default::default()
            },
        )
        .await
        .map_err(Error::broker)?;
    Ok(())
}

/// Publishes `credits` as messages `{id}`, each with `Nats-Msg-Id` set. Returns how
/// many JetStream stored and how many it dropped as duplicates.
pub async fn publish(
    js: &jetstream::Context,
    names: &Names,
    credits: &[(String, Credit)],
) -> Result<(usize, usize), Error> {
    let publisher = Publisher::new(js.clone());
    let mut acks = Vec::with_capacity(credits.len());
    for (id, credit) in credits {
        let payload = serde_json::to_vec(credit).map_err(Error::handler)?;
        acks.push(
            publisher
                .send(
                    names.subject.clone(),
                    id,
                    Default::default(),
                    payload.into(),
                )
                .await?,
        );
    }
    let (mut stored, mut dropped) = (0, 0);
    for ack in acks {
        if ack.await.map_err(Error::broker)?.duplicate {
            dropped += 1;
        } else {
            stored += 1;
        }
    }
    Ok((stored, dropped))
}

/// The SQLite ledger: balances and the inbox's processed-message table in one file.
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: SqlitePool,
}

impl Ledger {
    /// Opens (creating if needed) the ledger at `path`.
    pub async fn open(path: &Path) -> Result<Ledger, Error> {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS balances \
             (account TEXT PRIMARY KEY, points INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await?;
        Ok(Ledger { pool })
    }

    // ANCHOR: consumer (the user guide shows the inbox and its consumer from here)
    /// The inbox for `consumer` on this ledger.
    pub async fn inbox(&self, consumer: &str) -> Result<SqliteInbox, Error> {
        let inbox = SqliteInbox::new(self.pool.clone(), consumer)?;
        inbox.migrate().await?;
        Ok(inbox)
    }

    /// The JetStream consumer, bound to this ledger's inbox; warns (in the log) when the
    /// inbox's retention is shorter than the broker's redelivery window.
    pub async fn consumer(
        &self,
        js: jetstream::Context,
        names: &Names,
    ) -> Result<JetStreamInbox<SqliteInbox>, Error> {
        let inbox = self.inbox(&names.consumer).await?;
        let consumer = JetStreamInbox::new(
            js,
            &names.stream,
            &names.consumer,
            inbox,
            NatsOptions::default(),
        )
        .await?;
        consumer.check_retention().await?;
        Ok(consumer)
    }
    // ANCHOR_END: consumer

    /// Every account's balance, by account.
    pub async fn balances(&self) -> Result<Vec<(String, i64)>, Error> {
        Ok(
            sqlx::query_as("SELECT account, points FROM balances ORDER BY account")
                .fetch_all(&self.pool)
                .await?,
        )
    }
}

// ANCHOR: apply_credit (the user guide shows the handler from here)
/// Applies one credit inside the inbox's transaction.
pub fn apply_credit<'t>(
    delivery: Delivery,
    tx: &'t mut Transaction<'static, Sqlite>,
) -> BoxFuture<'t, Result<(), Error>> {
    Box::pin(async move {
        let credit: Credit = serde_json::from_slice(&delivery.payload).map_err(Error::handler)?;
        sqlx::query(
            "INSERT INTO balances (account, points) VALUES (?1, ?2) \
             ON CONFLICT (account) DO UPDATE SET points = points + excluded.points",
        )
        .bind(&credit.account)
        .bind(credit.points)
        .execute(&mut **tx)
        .await?;
        Ok(())
    })
}
// ANCHOR_END: apply_credit

/// [`apply_credit`] as a handler for [`JetStreamInbox::run`].
pub fn credit_handler()
-> impl for<'t> Fn(Delivery, &'t mut Transaction<'static, Sqlite>) -> BoxFuture<'t, Result<(), Error>>
+ Send
+ Sync
+ Copy {
    handler(apply_credit)
}
