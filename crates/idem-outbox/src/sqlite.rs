//! `SqliteOutbox`: the outbox table in SQLite, next to the business tables.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, Sqlite, SqlitePool, Transaction};

use crate::outbox::{ms, now_ms};
use crate::sql::{self, CLAIM_COLUMNS, ClaimRow, DEFAULT_TABLE, PARKED_COLUMNS, ParkedRow};
use crate::{Message, Outbox, OutboxStats, ParkedMessage, Result, Settlement, StagedMessage};

/// How long a SQLite relay's claim on the file lasts without renewal, unless
/// [`SqliteOutbox::with_relay_lease`] says otherwise: another relay (a second process
/// on the same file) waits that long after the first one died.
pub const SQLITE_RELAY_LEASE: Duration = Duration::from_secs(15);

/// An [`Outbox`] whose table lives in a SQLite file, next to the business tables:
/// [`stage`](Outbox::stage) runs in the caller's transaction on the same pool.
///
/// One relay per file: a relay claims the file with a lease
/// ([`SQLITE_RELAY_LEASE`] by default), renewed at every batch; another relay on the same file
/// stays idle while that lease lives, so a standby may take over after a crash.
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
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    pool: SqlitePool,
    table: Arc<str>,
    sql: Arc<Statements>,
    relay_lease: Duration,
}

#[derive(Debug)]
struct Statements {
    create: Vec<String>,
    insert: String,
    lease: String,
    claim: String,
    published: String,
    retry: String,
    park: String,
    unpublished: String,
    parked_count: String,
    published_count: String,
    purge: String,
    parked: String,
    requeue: String,
}

impl Statements {
    fn new(t: &str) -> Statements {
        let pending = "published_at IS NULL AND parked_at IS NULL";
        Statements {
            create: vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     seq INTEGER PRIMARY KEY AUTOINCREMENT, \
                     id TEXT NOT NULL UNIQUE, \
                     destination TEXT NOT NULL, \
                     routing_key TEXT, \
                     headers TEXT NOT NULL, \
                     body BLOB NOT NULL, \
                     ordering_key TEXT, \
                     staged_at INTEGER NOT NULL, \
                     attempts INTEGER NOT NULL DEFAULT 0, \
                     next_attempt_at INTEGER NOT NULL, \
                     published_at INTEGER, \
                     parked_at INTEGER, \
                     last_error TEXT)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_pending ON {t} (seq) WHERE {pending}"),
                format!(
                    "CREATE INDEX IF NOT EXISTS {t}_ordering ON {t} (ordering_key, seq) WHERE {pending}"
                ),
                format!(
                    "CREATE INDEX IF NOT EXISTS {t}_published ON {t} (published_at) \
                     WHERE published_at IS NOT NULL"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_relay (\
                     id INTEGER PRIMARY KEY CHECK (id = 1), \
                     holder TEXT NOT NULL, \
                     until INTEGER NOT NULL)"
                ),
            ],
            insert: format!(
                "INSERT INTO {t} (id, destination, routing_key, headers, body, ordering_key, \
                 staged_at, next_attempt_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            lease: format!(
                "INSERT INTO {t}_relay (id, holder, until) VALUES (1, ?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, until = excluded.until \
                 WHERE {t}_relay.holder = excluded.holder OR {t}_relay.until < ?3"
            ),
            // A message waits for every earlier unfinished message of its ordering key
            // that is not in this batch (one in backoff, say).
            claim: format!(
                "WITH c AS (SELECT seq FROM {t} WHERE {pending} AND next_attempt_at <= ?1 \
                 ORDER BY seq LIMIT ?2) \
                 SELECT {CLAIM_COLUMNS} FROM {t} o JOIN c ON c.seq = o.seq \
                 WHERE o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM {t} e \
                 WHERE e.ordering_key = o.ordering_key AND e.seq < o.seq \
                 AND e.published_at IS NULL AND e.parked_at IS NULL \
                 AND e.seq NOT IN (SELECT seq FROM c)) ORDER BY o.seq"
            ),
            published: format!(
                "UPDATE {t} SET published_at = ?1 WHERE seq IN (SELECT value FROM json_each(?2))"
            ),
            retry: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = ?2, next_attempt_at = ?3 \
                 WHERE seq = ?1"
            ),
            park: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = ?2, parked_at = ?3 \
                 WHERE seq = ?1"
            ),
            unpublished: format!("SELECT count(*), min(staged_at) FROM {t} WHERE {pending}"),
            parked_count: format!("SELECT count(*) FROM {t} WHERE parked_at IS NOT NULL"),
            published_count: format!("SELECT count(*) FROM {t} WHERE published_at IS NOT NULL"),
            purge: format!(
                "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} \
                 WHERE published_at IS NOT NULL AND published_at < ?1 LIMIT ?2)"
            ),
            parked: format!(
                "SELECT {PARKED_COLUMNS} FROM {t} o WHERE o.parked_at IS NOT NULL \
                 ORDER BY o.seq LIMIT ?1"
            ),
            requeue: format!(
                "UPDATE {t} SET parked_at = NULL, attempts = 0, next_attempt_at = ?2 \
                 WHERE id = ?1 AND parked_at IS NOT NULL"
            ),
        }
    }
}

impl SqliteOutbox {
    /// An outbox on `pool` with the table [`DEFAULT_TABLE`]. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: SqlitePool) -> SqliteOutbox {
        SqliteOutbox {
            pool,
            table: DEFAULT_TABLE.into(),
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
            relay_lease: SQLITE_RELAY_LEASE,
        }
    }

    /// How long a relay's claim on the file lasts without renewal (it renews at every
    /// round, so keep it well above the relay's poll interval).
    pub fn with_relay_lease(mut self, lease: Duration) -> SqliteOutbox {
        self.relay_lease = lease;
        self
    }

    /// Uses the table `table` (a plain SQL identifier of at most 40 bytes).
    pub fn with_table(mut self, table: &str) -> Result<SqliteOutbox> {
        sql::validate_table(table)?;
        self.table = table.into();
        self.sql = Arc::new(Statements::new(table));
        Ok(self)
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The outbox table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the outbox table, its indexes and the relay lease table if they do not
    /// exist.
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for stmt in &self.sql.create {
            sqlx::query(AssertSqlSafe(stmt.as_str()))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn q(sql: &str) -> sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments> {
        sqlx::query(AssertSqlSafe(sql))
    }
}

impl Outbox for SqliteOutbox {
    type Tx = Transaction<'static, Sqlite>;
    type Batch = ();
    type Listener = ();

    async fn stage(&self, tx: &mut Self::Tx, message: &Message) -> Result<bool> {
        message.validate()?;
        let (destination, routing_key) = message.destination.columns();
        let done = Self::q(&self.sql.insert)
            .bind(&message.id)
            .bind(destination)
            .bind(routing_key)
            .bind(message.headers_json())
            .bind(&message.body)
            .bind(message.ordering_key.as_deref())
            .bind(now_ms())
            .execute(&mut **tx)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn claim(&self, relay: &str, limit: usize) -> Result<((), Vec<StagedMessage>)> {
        let now = now_ms();
        let held = Self::q(&self.sql.lease)
            .bind(relay)
            .bind(now.saturating_add(ms(self.relay_lease)))
            .bind(now)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if held == 0 {
            tracing::debug!(relay, table = %self.table, "another relay holds this SQLite file");
            return Ok(((), Vec::new()));
        }
        let rows: Vec<ClaimRow> = sqlx::query_as(AssertSqlSafe(self.sql.claim.as_str()))
            .bind(now)
            .bind(sql::limit(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok((
            (),
            rows.into_iter().map(sql::staged).collect::<Result<_>>()?,
        ))
    }

    async fn settle(&self, (): (), outcomes: Vec<(i64, Settlement)>) -> Result<()> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let published: Vec<i64> = outcomes
            .iter()
            .filter(|(_, s)| *s == Settlement::Published)
            .map(|(seq, _)| *seq)
            .collect();
        if !published.is_empty() {
            let json = serde_json::to_string(&published).expect("integers serialise");
            Self::q(&self.sql.published)
                .bind(now)
                .bind(json)
                .execute(&mut *tx)
                .await?;
        }
        for (seq, settlement) in &outcomes {
            match settlement {
                Settlement::Retry { error, after } => {
                    Self::q(&self.sql.retry)
                        .bind(seq)
                        .bind(error)
                        .bind(now.saturating_add(ms(*after)))
                        .execute(&mut *tx)
                        .await?;
                }
                Settlement::Park { error } => {
                    Self::q(&self.sql.park)
                        .bind(seq)
                        .bind(error)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
                Settlement::Published | Settlement::Untouched => {}
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn listen(&self) -> Result<()> {
        Ok(())
    }

    async fn wait_for_work(&self, (): &mut (), timeout: Duration) {
        // No notifications across processes in SQLite: the poll interval is the wait.
        tokio::time::sleep(timeout).await;
    }

    async fn stats(&self) -> Result<OutboxStats> {
        let (unpublished, oldest): (i64, Option<i64>) =
            sqlx::query_as(AssertSqlSafe(self.sql.unpublished.as_str()))
                .fetch_one(&self.pool)
                .await?;
        let parked: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.parked_count.as_str()))
            .fetch_one(&self.pool)
            .await?;
        let published: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.published_count.as_str()))
            .fetch_one(&self.pool)
            .await?;
        Ok(crate::outbox::stats(unpublished, oldest, parked, published))
    }

    async fn purge_published(&self, retention: Duration, limit: usize) -> Result<usize> {
        let done = Self::q(&self.sql.purge)
            .bind(now_ms().saturating_sub(ms(retention)))
            .bind(sql::limit(limit))
            .execute(&self.pool)
            .await?;
        Ok(sql::affected(done.rows_affected()))
    }

    async fn parked(&self, limit: usize) -> Result<Vec<ParkedMessage>> {
        let rows: Vec<ParkedRow> = sqlx::query_as(AssertSqlSafe(self.sql.parked.as_str()))
            .bind(sql::limit(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(sql::parked).collect()
    }

    async fn requeue(&self, id: &str) -> Result<bool> {
        let done = Self::q(&self.sql.requeue)
            .bind(id)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
