//! `PgOutbox`: the outbox table in PostgreSQL, shared by several relays.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, PgPool, Postgres, Transaction};

use crate::outbox::{ms, now_ms};
use crate::sql::{self, CLAIM_COLUMNS, ClaimRow, DEFAULT_TABLE, PARKED_COLUMNS, ParkedRow};
use crate::{Message, Outbox, OutboxStats, ParkedMessage, Result, Settlement, StagedMessage};

/// An [`Outbox`] whose table lives in PostgreSQL, next to the business tables:
/// [`stage`](Outbox::stage) runs in the caller's transaction and notifies the relays
/// on commit (`NOTIFY`, delivered only if the transaction commits).
///
/// Any number of relays may share the table. A relay claims its batch with
/// `FOR UPDATE SKIP LOCKED` and holds the rows' locks until it marked them, so that
/// two relays never publish the same message while both are alive; a message whose
/// ordering key has an earlier message claimed by another relay waits for it.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), idem_outbox::Error> {
/// use idem_outbox::{Destination, Message, Outbox, PgOutbox};
///
/// let outbox = PgOutbox::new(pool.clone());
/// outbox.migrate().await?;
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// let event = Message::with_id("order-42.created", Destination::subject("orders.created"), "{}")
///     .ordering_key("order-42");
/// outbox.stage(&mut tx, &event).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgOutbox {
    pool: PgPool,
    table: Arc<str>,
    sql: Arc<Statements>,
}

#[derive(Debug)]
struct Statements {
    create: Vec<String>,
    insert: String,
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
                     seq BIGSERIAL PRIMARY KEY, \
                     id TEXT NOT NULL UNIQUE, \
                     destination TEXT NOT NULL, \
                     routing_key TEXT, \
                     headers TEXT NOT NULL, \
                     body BYTEA NOT NULL, \
                     ordering_key TEXT, \
                     staged_at BIGINT NOT NULL, \
                     attempts BIGINT NOT NULL DEFAULT 0, \
                     next_attempt_at BIGINT NOT NULL, \
                     published_at BIGINT, \
                     parked_at BIGINT, \
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
            ],
            // One round trip: the insert, and the notification the commit delivers.
            insert: format!(
                "WITH ins AS (INSERT INTO {t} (id, destination, routing_key, headers, body, \
                 ordering_key, staged_at, next_attempt_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
                 ON CONFLICT (id) DO NOTHING RETURNING seq) \
                 SELECT count(*) FROM ins, LATERAL (SELECT pg_notify($8, '')) n"
            ),
            // The CTE locks the due rows no other relay holds; a message then waits for
            // every earlier unfinished message of its ordering key outside this batch
            // (locked by another relay, or in backoff).
            claim: format!(
                "WITH c AS MATERIALIZED (SELECT seq FROM {t} WHERE {pending} \
                 AND next_attempt_at <= $1 ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 SELECT {CLAIM_COLUMNS} FROM {t} o JOIN c ON c.seq = o.seq \
                 WHERE o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM {t} e \
                 WHERE e.ordering_key = o.ordering_key AND e.seq < o.seq \
                 AND e.published_at IS NULL AND e.parked_at IS NULL \
                 AND e.seq NOT IN (SELECT seq FROM c)) ORDER BY o.seq"
            ),
            published: format!("UPDATE {t} SET published_at = $1 WHERE seq = ANY($2)"),
            retry: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, next_attempt_at = $3 \
                 WHERE seq = $1"
            ),
            park: format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, parked_at = $3 \
                 WHERE seq = $1"
            ),
            unpublished: format!("SELECT count(*), min(staged_at) FROM {t} WHERE {pending}"),
            parked_count: format!("SELECT count(*) FROM {t} WHERE parked_at IS NOT NULL"),
            published_count: format!("SELECT count(*) FROM {t} WHERE published_at IS NOT NULL"),
            purge: format!(
                "DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} \
                 WHERE published_at IS NOT NULL AND published_at < $1 LIMIT $2)"
            ),
            parked: format!(
                "SELECT {PARKED_COLUMNS} FROM {t} o WHERE o.parked_at IS NOT NULL \
                 ORDER BY o.seq LIMIT $1"
            ),
            requeue: format!(
                "UPDATE {t} SET parked_at = NULL, attempts = 0, next_attempt_at = $2 \
                 WHERE id = $1 AND parked_at IS NOT NULL"
            ),
        }
    }
}

impl PgOutbox {
    /// An outbox on `pool` with the table [`DEFAULT_TABLE`]. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: PgPool) -> PgOutbox {
        PgOutbox {
            pool,
            table: DEFAULT_TABLE.into(),
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
        }
    }

    /// Uses the table `table` (a plain SQL identifier of at most 40 bytes). Its name is
    /// also the notification channel.
    pub fn with_table(mut self, table: &str) -> Result<PgOutbox> {
        sql::validate_table(table)?;
        self.table = table.into();
        self.sql = Arc::new(Statements::new(table));
        Ok(self)
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The outbox table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the outbox table and its indexes if they do not exist. Services starting
    /// together serialise on an advisory lock, since concurrent `CREATE TABLE IF NOT
    /// EXISTS` can still collide in PostgreSQL's catalog.
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("idem-outbox:{}", self.table))
            .execute(&mut *tx)
            .await?;
        for stmt in &self.sql.create {
            sqlx::query(AssertSqlSafe(stmt.as_str()))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn q(sql: &str) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(AssertSqlSafe(sql))
    }
}

impl Outbox for PgOutbox {
    type Tx = Transaction<'static, Postgres>;
    type Batch = Option<Transaction<'static, Postgres>>;
    type Listener = Option<PgListener>;

    async fn stage(&self, tx: &mut Self::Tx, message: &Message) -> Result<bool> {
        message.validate()?;
        let (destination, routing_key) = message.destination.columns();
        let inserted: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.insert.as_str()))
            .bind(&message.id)
            .bind(destination)
            .bind(routing_key)
            .bind(message.headers_json())
            .bind(&message.body)
            .bind(message.ordering_key.as_deref())
            .bind(now_ms())
            .bind(&*self.table)
            .fetch_one(&mut **tx)
            .await?;
        Ok(inserted == 1)
    }

    async fn claim(&self, _relay: &str, limit: usize) -> Result<(Self::Batch, Vec<StagedMessage>)> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<ClaimRow> = sqlx::query_as(AssertSqlSafe(self.sql.claim.as_str()))
            .bind(now_ms())
            .bind(sql::limit(limit))
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok((None, Vec::new()));
        }
        let staged = rows.into_iter().map(sql::staged).collect::<Result<_>>()?;
        Ok((Some(tx), staged))
    }

    async fn settle(&self, batch: Self::Batch, outcomes: Vec<(i64, Settlement)>) -> Result<()> {
        let Some(mut tx) = batch else {
            return Ok(());
        };
        let now = now_ms();
        let published: Vec<i64> = outcomes
            .iter()
            .filter(|(_, s)| *s == Settlement::Published)
            .map(|(seq, _)| *seq)
            .collect();
        if !published.is_empty() {
            Self::q(&self.sql.published)
                .bind(now)
                .bind(published)
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

    async fn listen(&self) -> Result<Option<PgListener>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(&self.table).await?;
        Ok(Some(listener))
    }

    async fn wait_for_work(&self, listener: &mut Option<PgListener>, timeout: Duration) {
        let Some(l) = listener else {
            tokio::time::sleep(timeout).await;
            if let Ok(again) = self.listen().await {
                *listener = again;
            }
            return;
        };
        match tokio::time::timeout(timeout, l.recv()).await {
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => {
                // Polling covers the gap: the next wait listens again.
                tracing::warn!(error = %e, "outbox LISTEN connection failed; polling");
                *listener = None;
            }
        }
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
