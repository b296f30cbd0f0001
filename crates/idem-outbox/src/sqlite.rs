//! `SqliteOutbox`: the outbox table in SQLite, next to the business tables, with one
//! relay per file.

use std::time::Duration;

use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{AssertSqlSafe, Pool, Sqlite, Transaction};

use crate::outbox::{ms, now_ms};
use crate::sql::{OutboxDatabase, SqlOutbox, claim_rows, sealed};
use crate::{Result, StagedMessage};

/// An [`Outbox`](crate::Outbox) whose table lives in a SQLite file, next to the
/// business tables: [`stage`](crate::Outbox::stage) runs in the caller's transaction on
/// the same pool.
///
/// One relay per file: a relay claims the file with a lease
/// ([`SQLITE_RELAY_LEASE`](crate::SQLITE_RELAY_LEASE) by default), renewed at every
/// batch; another relay on the same file stays idle while that lease lives, so a
/// standby may take over after a crash.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), idem_outbox::Error> {
/// use idem_outbox::{Destination, Message, Outbox, SqliteOutbox};
///
/// let outbox = SqliteOutbox::new(pool.clone());
/// outbox.migrate().await?;
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// let event = Message::with_id("order-42.created", Destination::subject("orders.created"), "{}");
/// outbox.stage(&mut tx, &event).await?;
/// tx.commit().await?; // the order and its event, or neither
/// # Ok(()) }
/// ```
pub type SqliteOutbox = SqlOutbox<Sqlite>;

impl SqlOutbox<Sqlite> {
    /// How long a relay's claim on the file lasts without renewal (it renews at every
    /// round, so keep it well above the relay's poll interval).
    pub fn with_relay_lease(mut self, lease: Duration) -> SqliteOutbox {
        self.relay_lease = lease;
        self
    }
}

impl sealed::Sealed for Sqlite {}

impl OutboxDatabase for Sqlite {
    type Batch = ();
    type Listener = ();
    /// The relay lease statement.
    type Extra = String;
    const SEQ_IN: &'static str = "IN (SELECT value FROM json_each($2))";
    const STAGE_TAKES_CHANNEL: bool = false;

    fn stage_statement(insert: String) -> String {
        insert
    }

    fn extra_tables(t: &str) -> Vec<String> {
        vec![format!(
            "CREATE TABLE IF NOT EXISTS {t}_relay (\
             id INTEGER PRIMARY KEY CHECK (id = 1), \
             holder TEXT NOT NULL, \
             until INTEGER NOT NULL)"
        )]
    }

    fn extra(t: &str) -> String {
        format!(
            "INSERT INTO {t}_relay (id, holder, until) VALUES (1, $1, $2) \
             ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, until = excluded.until \
             WHERE {t}_relay.holder = excluded.holder OR {t}_relay.until < $3"
        )
    }

    fn bind_seqs(
        query: Query<'_, Sqlite, SqliteArguments>,
        seqs: Vec<i64>,
    ) -> Query<'_, Sqlite, SqliteArguments> {
        query.bind(serde_json::to_string(&seqs).expect("integers serialise"))
    }

    async fn claim(
        outbox: &SqliteOutbox,
        relay: &str,
        limit: usize,
    ) -> Result<((), Vec<StagedMessage>)> {
        let now = now_ms();
        let held = sqlx::query(AssertSqlSafe(outbox.sql.extra.as_str()))
            .bind(relay)
            .bind(now.saturating_add(ms(outbox.relay_lease)))
            .bind(now)
            .execute(&outbox.pool)
            .await?
            .rows_affected();
        if held == 0 {
            tracing::debug!(relay, table = %outbox.table, "another relay holds this SQLite file");
            return Ok(((), Vec::new()));
        }
        let staged = claim_rows(&outbox.sql.claim, &outbox.pool, now, limit).await?;
        Ok(((), staged))
    }

    async fn settling(pool: &Pool<Sqlite>, (): ()) -> Result<Option<Transaction<'static, Sqlite>>> {
        Ok(Some(pool.begin().await?))
    }

    async fn listen(_: &SqliteOutbox) -> Result<()> {
        Ok(())
    }

    async fn wait_for_work(_: &SqliteOutbox, (): &mut (), timeout: Duration) {
        // No notifications across processes in SQLite: the poll interval is the wait.
        tokio::time::sleep(timeout).await;
    }
}
