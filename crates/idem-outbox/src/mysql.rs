//! `MySqlOutbox`: the outbox table in MySQL or MariaDB, shared by several relays.

use std::time::Duration;

use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, MySql, Pool, Transaction};

use crate::outbox::now_ms;
use crate::sql::{OutboxDatabase, SqlOutbox, sealed};
use crate::table::{ClaimRow, claim_columns, limit, staged};
use crate::{Result, StagedMessage};

/// An [`Outbox`](crate::Outbox) whose table lives in MySQL or MariaDB (InnoDB), next
/// to the business tables: [`stage`](crate::Outbox::stage) runs in the caller's
/// transaction.
///
/// Any number of relays may share the table. A relay claims its batch in a
/// transaction of its own: `SELECT … FOR UPDATE SKIP LOCKED` (MySQL 8.0 and MariaDB
/// 10.6 and later) locks the due rows no other relay holds, and a second statement
/// reads those that no earlier unfinished message of their ordering key outside the
/// batch holds back (MySQL takes no locking clause inside a `WITH`). The rows stay
/// locked until the relay marked them, so two relays never publish the same message
/// while both are alive. The claim runs at READ COMMITTED: under the server's default
/// REPEATABLE READ, a locking scan that reaches the end of the table would lock the gap
/// after the last row, and every transaction staging a message would wait for the
/// relay's publish.
///
/// There is no `LISTEN`: a relay finds new messages by polling
/// ([`RelayOptions::poll_interval`](crate::RelayOptions)). Ids and ordering keys are
/// `VARBINARY(512)` (compared byte for byte), headers and errors `LONGTEXT`; the server's
/// strict mode, the default, should stay on.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::MySqlPool) -> Result<(), idem_outbox::Error> {
/// use idem_outbox::{Destination, Message, MySqlOutbox, Outbox};
///
/// let outbox = MySqlOutbox::new(pool.clone());
/// outbox.migrate().await?;
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// let event = Message::with_id("order-42.created", Destination::subject("orders.created"), "{}")
///     .ordering_key("order-42");
/// outbox.stage(&mut tx, &event).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub type MySqlOutbox = SqlOutbox<MySql>;

/// A list of `seq`s bound as one JSON array: MySQL has no array parameter.
const SEQS: &str = "SELECT value FROM JSON_TABLE(?, '$[*]' COLUMNS (value BIGINT PATH '$')) AS s";

/// The claim's two statements.
#[derive(Debug)]
pub struct Claim {
    /// Locks the due rows no other relay holds: `now, limit`.
    lock: String,
    /// Reads the locked rows (a JSON array of their `seq`s) that no earlier unfinished
    /// message of their ordering key outside them holds back: `seqs, seqs`.
    read: String,
}

impl sealed::Sealed for MySql {}

impl OutboxDatabase for MySql {
    type Batch = Option<Transaction<'static, MySql>>;
    type Listener = ();
    type Extra = Claim;
    const SEQ_IN: &'static str =
        "IN (SELECT value FROM JSON_TABLE($2, '$[*]' COLUMNS (value BIGINT PATH '$')) AS s)";
    const STAGE_TAKES_CHANNEL: bool = false;

    fn key_as_text(column: &str) -> String {
        format!("CONVERT({column} USING utf8mb4)")
    }

    /// `INSERT IGNORE`: every value of a valid message fits its column, so nothing is
    /// cut short; a taken id inserts nothing.
    fn stage_statement(insert: String) -> String {
        insert
    }

    fn extra_tables(_: &str) -> Vec<String> {
        Vec::new()
    }

    fn extra(t: &str) -> Claim {
        let pending = "published_at IS NULL AND parked_at IS NULL";
        let columns = claim_columns(Self::key_as_text);
        Claim {
            lock: format!(
                "SELECT seq FROM {t} WHERE {pending} AND next_attempt_at <= ? \
                 ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            read: format!(
                "SELECT {columns} FROM {t} o WHERE o.seq IN ({SEQS}) \
                 AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM {t} e \
                 WHERE e.ordering_key = o.ordering_key AND e.seq < o.seq \
                 AND e.published_at IS NULL AND e.parked_at IS NULL \
                 AND e.seq NOT IN ({SEQS}))) ORDER BY o.seq"
            ),
        }
    }

    fn bind_seqs(
        query: Query<'_, MySql, MySqlArguments>,
        seqs: Vec<i64>,
    ) -> Query<'_, MySql, MySqlArguments> {
        query.bind(serde_json::to_string(&seqs).expect("integers serialise"))
    }

    async fn claim(
        outbox: &MySqlOutbox,
        _relay: &str,
        max: usize,
    ) -> Result<(Self::Batch, Vec<StagedMessage>)> {
        let mut conn = outbox.pool.acquire().await?;
        // For the next transaction of this session only.
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await?;
        let mut tx = Transaction::begin(conn, None).await?;
        let seqs: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(outbox.sql.extra.lock.as_str()))
            .bind(now_ms())
            .bind(limit(max))
            .fetch_all(&mut *tx)
            .await?;
        if seqs.is_empty() {
            tx.rollback().await?;
            return Ok((None, Vec::new()));
        }
        let seqs = serde_json::to_string(&seqs).expect("integers serialise");
        let rows: Vec<ClaimRow> = sqlx::query_as(AssertSqlSafe(outbox.sql.extra.read.as_str()))
            .bind(&seqs)
            .bind(&seqs)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok((None, Vec::new()));
        }
        let staged = rows.into_iter().map(staged).collect::<Result<Vec<_>>>()?;
        Ok((Some(tx), staged))
    }

    async fn settling(
        _: &Pool<MySql>,
        batch: Self::Batch,
    ) -> Result<Option<Transaction<'static, MySql>>> {
        Ok(batch)
    }

    async fn listen(_: &MySqlOutbox) -> Result<()> {
        Ok(())
    }

    async fn wait_for_work(_: &MySqlOutbox, (): &mut (), timeout: Duration) {
        // No notifications in MySQL: the poll interval is the wait.
        tokio::time::sleep(timeout).await;
    }
}
