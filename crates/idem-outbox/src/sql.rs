//! [`SqlOutbox`]: the outbox table over sqlx, one implementation for SQLite,
//! PostgreSQL and MySQL. Their dialects (column types, placeholders, row locks, the migration
//! lock) are `idem-sql`'s [`SqlDatabase`]; what else differs (how a relay claims and is
//! woken, how a list of `seq`s binds) is an [`OutboxDatabase`]'s few items, in
//! `sqlite.rs`, `postgres.rs` and `mysql.rs`; the rows are read in `table.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_sql::{MigrationLock, SqlDatabase};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Encode, Executor, FromRow, Pool, Transaction, Type};

use crate::outbox::{ms, now_ms};
use crate::table::{
    ClaimRow, DEFAULT_TABLE, ParkedRow, affected, claim_columns, limit, parked, parked_columns,
    staged, stats, validate_table,
};
use crate::{
    MAX_ID_LEN, Message, Outbox, OutboxStats, ParkedMessage, Result, Settlement, StagedMessage,
};

/// A sqlx database a [`SqlOutbox`] can keep its table in: `sqlx::Sqlite` (feature
/// `sqlite`), `sqlx::Postgres` (feature `postgres`) or `sqlx::MySql` (feature `mysql`). Sealed: its items are how the
/// two differ as an outbox (claiming, waking a relay); how they differ as SQL is their
/// [`SqlDatabase`].
pub trait OutboxDatabase: SqlDatabase + sealed::Sealed {
    /// A claimed batch ([`Outbox::Batch`]).
    #[doc(hidden)]
    type Batch: Send;
    /// What a relay waits on ([`Outbox::Listener`]).
    #[doc(hidden)]
    type Listener: Send;
    /// Statements of this dialect alone.
    #[doc(hidden)]
    type Extra: fmt::Debug + Send + Sync;
    /// How `seq` is matched against `$2`, the published list as
    /// [`bind_seqs`](OutboxDatabase::bind_seqs) binds it.
    #[doc(hidden)]
    const SEQ_IN: &'static str;
    /// `column`, a key column, as a text sqlx decodes into a `String`: itself where
    /// keys are text; MySQL's are `VARBINARY`, which it converts.
    #[doc(hidden)]
    fn key_as_text(column: &str) -> String {
        column.to_owned()
    }
    /// Whether the staging statement also takes the table's name as `$9`.
    #[doc(hidden)]
    const STAGE_TAKES_CHANNEL: bool;
    /// The staging statement around the plain insert `insert`; it reports one row
    /// affected when it inserted.
    #[doc(hidden)]
    fn stage_statement(insert: String) -> String;
    /// Tables beside the outbox table.
    #[doc(hidden)]
    fn extra_tables(table: &str) -> Vec<String>;
    /// This dialect's own statements.
    #[doc(hidden)]
    fn extra(table: &str) -> Self::Extra;
    /// Binds the published messages' `seq`s as [`SEQ_IN`](OutboxDatabase::SEQ_IN) reads
    /// them.
    #[doc(hidden)]
    fn bind_seqs(
        query: Query<'_, Self, Self::Arguments>,
        seqs: Vec<i64>,
    ) -> Query<'_, Self, Self::Arguments>;
    /// [`Outbox::claim`].
    #[doc(hidden)]
    fn claim(
        outbox: &SqlOutbox<Self>,
        relay: &str,
        limit: usize,
    ) -> impl Future<Output = Result<(Self::Batch, Vec<StagedMessage>)>> + Send;
    /// The transaction that settles `batch`: its own, or a new one; `None` when the
    /// batch holds nothing.
    #[doc(hidden)]
    fn settling(
        pool: &Pool<Self>,
        batch: Self::Batch,
    ) -> impl Future<Output = Result<Option<Transaction<'static, Self>>>> + Send;
    /// [`Outbox::listen`].
    #[doc(hidden)]
    fn listen(outbox: &SqlOutbox<Self>) -> impl Future<Output = Result<Self::Listener>> + Send;
    /// [`Outbox::wait_for_work`].
    #[doc(hidden)]
    fn wait_for_work(
        outbox: &SqlOutbox<Self>,
        listener: &mut Self::Listener,
        timeout: Duration,
    ) -> impl Future<Output = ()> + Send;
}

pub(crate) mod sealed {
    /// Keeps [`OutboxDatabase`](super::OutboxDatabase) to the databases this crate knows.
    pub trait Sealed {}
}

/// An [`Outbox`] whose table lives in a SQL database next to the business tables:
/// [`stage`](Outbox::stage) runs in the caller's transaction. Used through its aliases,
/// [`SqliteOutbox`](crate::SqliteOutbox), [`PgOutbox`](crate::PgOutbox) and
/// `MySqlOutbox` (feature `mysql`).
#[derive(Debug)]
pub struct SqlOutbox<DB: OutboxDatabase> {
    pub(crate) pool: Pool<DB>,
    pub(crate) table: Arc<str>,
    pub(crate) sql: Arc<Statements<DB>>,
    /// How long a SQLite relay's claim on the file lasts without renewal.
    pub(crate) relay_lease: Duration,
}

impl<DB: OutboxDatabase> Clone for SqlOutbox<DB> {
    fn clone(&self) -> Self {
        SqlOutbox {
            pool: self.pool.clone(),
            table: self.table.clone(),
            sql: self.sql.clone(),
            relay_lease: self.relay_lease,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Statements<DB: OutboxDatabase> {
    create: Vec<String>,
    stage: String,
    pub(crate) claim: String,
    published: String,
    retry: String,
    park: String,
    unpublished: String,
    parked_count: String,
    published_count: String,
    purge: String,
    parked: String,
    requeue: String,
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "mysql")),
        expect(
            dead_code,
            reason = "only SQLite and MySQL have statements of their own"
        )
    )]
    pub(crate) extra: DB::Extra,
}

impl<DB: OutboxDatabase> Statements<DB> {
    fn new(t: &str) -> Statements<DB> {
        let pending = "published_at IS NULL AND parked_at IS NULL";
        let (seq, bytes, int, long) = (DB::SERIAL_KEY, DB::BYTES, DB::INTEGER, DB::LONG_TEXT);
        // Ids and ordering keys are keys (of a unique constraint, of an index) of at
        // most MAX_ID_LEN bytes; headers and errors have no bound.
        let key = DB::byte_key(MAX_ID_LEN);
        let index = |name: &str, columns, filter| {
            DB::create_index(&format!("{t}_{name}"), t, columns, Some(filter))
        };
        let mut create = vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 seq {seq}, \
                 id {key} NOT NULL UNIQUE, \
                 destination TEXT NOT NULL, \
                 routing_key TEXT, \
                 headers {long} NOT NULL, \
                 body {bytes} NOT NULL, \
                 ordering_key {key}, \
                 staged_at {int} NOT NULL, \
                 attempts {int} NOT NULL DEFAULT 0, \
                 next_attempt_at {int} NOT NULL, \
                 published_at {int}, \
                 parked_at {int}, \
                 last_error {long})"
            ),
            index("pending", "seq", pending),
            index("ordering", "ordering_key, seq", pending),
            index("published", "published_at", "published_at IS NOT NULL"),
        ];
        create.extend(DB::extra_tables(t));
        let sql = |template: String| DB::statement(&template);
        let insert = format!(
            "INSERT INTO {t} (id, destination, routing_key, headers, body, ordering_key, \
             staged_at, next_attempt_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        );
        let (cte, lock, seq_in) = (DB::MATERIALIZED, DB::SKIP_LOCKED, DB::SEQ_IN);
        let (claimed, parked) = (
            claim_columns(DB::key_as_text),
            parked_columns(DB::key_as_text),
        );
        Statements {
            create,
            stage: DB::stage_statement(DB::insert_if_absent(&sql(insert), "id")),
            // The CTE takes the due rows (in PostgreSQL, the ones no other relay holds,
            // locked); a message then waits for every earlier unfinished message of its
            // ordering key outside this batch (another relay's, or one in backoff).
            claim: sql(format!(
                "WITH c AS{cte} (SELECT seq FROM {t} WHERE {pending} \
                 AND next_attempt_at <= $1 ORDER BY seq LIMIT $2{lock}) \
                 SELECT {claimed} FROM {t} o JOIN c ON c.seq = o.seq \
                 WHERE o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM {t} e \
                 WHERE e.ordering_key = o.ordering_key AND e.seq < o.seq \
                 AND e.published_at IS NULL AND e.parked_at IS NULL \
                 AND e.seq NOT IN (SELECT seq FROM c)) ORDER BY o.seq"
            )),
            published: sql(format!(
                "UPDATE {t} SET published_at = $1 WHERE seq {seq_in}"
            )),
            retry: sql(format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $1, next_attempt_at = $2 \
                 WHERE seq = $3"
            )),
            park: sql(format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $1, parked_at = $2 \
                 WHERE seq = $3"
            )),
            unpublished: format!("SELECT count(*), min(staged_at) FROM {t} WHERE {pending}"),
            parked_count: format!("SELECT count(*) FROM {t} WHERE parked_at IS NOT NULL"),
            published_count: format!("SELECT count(*) FROM {t} WHERE published_at IS NOT NULL"),
            purge: sql(DB::delete_limited(
                t,
                "seq",
                "published_at IS NOT NULL AND published_at < $1",
                "$2",
            )),
            parked: sql(format!(
                "SELECT {parked} FROM {t} o WHERE o.parked_at IS NOT NULL \
                 ORDER BY o.seq LIMIT $1"
            )),
            requeue: sql(format!(
                "UPDATE {t} SET parked_at = NULL, attempts = 0, next_attempt_at = $1 \
                 WHERE id = $2 AND parked_at IS NOT NULL"
            )),
            extra: DB::extra(t),
        }
    }
}

/// How long a SQLite relay's claim on the file lasts without renewal, unless
/// [`SqliteOutbox::with_relay_lease`](crate::SqliteOutbox) says otherwise: another relay
/// (a second process on the same file) waits that long after the first one died.
pub const SQLITE_RELAY_LEASE: Duration = Duration::from_secs(15);

impl<DB: OutboxDatabase> SqlOutbox<DB> {
    /// An outbox on `pool` with the table [`DEFAULT_TABLE`]. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: Pool<DB>) -> SqlOutbox<DB> {
        SqlOutbox {
            pool,
            table: DEFAULT_TABLE.into(),
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
            relay_lease: SQLITE_RELAY_LEASE,
        }
    }

    /// Uses the table `table` (a plain SQL identifier of at most 40 bytes). In
    /// PostgreSQL its name is also the notification channel.
    pub fn with_table(mut self, table: &str) -> Result<SqlOutbox<DB>> {
        validate_table(table)?;
        self.table = table.into();
        self.sql = Arc::new(Statements::new(table));
        Ok(self)
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The outbox table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl<DB: OutboxDatabase> SqlOutbox<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Creates the outbox table, its indexes and, for SQLite, the relay lease table if
    /// they do not exist. In PostgreSQL, services starting together serialise on an
    /// advisory lock, since concurrent `CREATE TABLE IF NOT EXISTS` can still collide in
    /// its catalog.
    pub async fn migrate(&self) -> Result<()> {
        let lock = format!("idem-outbox:{}", self.table);
        idem_sql::migrate(&self.pool, MigrationLock::Named(&lock), &self.sql.create).await?;
        Ok(())
    }
}

/// Claims the due rows with the statement `claim` through `executor`.
pub(crate) async fn claim_rows<'c, DB, E>(
    claim: &str,
    executor: E,
    now: i64,
    max: usize,
) -> Result<Vec<StagedMessage>>
where
    DB: OutboxDatabase,
    E: Executor<'c, Database = DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
    ClaimRow: for<'r> FromRow<'r, DB::Row>,
{
    let rows: Vec<ClaimRow> = sqlx::query_as(AssertSqlSafe(claim))
        .bind(now)
        .bind(limit(max))
        .fetch_all(executor)
        .await?;
    rows.into_iter().map(staged).collect()
}

fn q<DB: OutboxDatabase>(sql: &str) -> Query<'_, DB, DB::Arguments> {
    sqlx::query(AssertSqlSafe(sql))
}

impl<DB: OutboxDatabase> Outbox for SqlOutbox<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
    (i64,): for<'r> FromRow<'r, DB::Row>,
    (i64, Option<i64>): for<'r> FromRow<'r, DB::Row>,
    ParkedRow: for<'r> FromRow<'r, DB::Row>,
{
    type Tx = Transaction<'static, DB>;
    type Batch = DB::Batch;
    type Listener = DB::Listener;

    async fn stage(&self, tx: &mut Self::Tx, message: &Message) -> Result<bool> {
        message.validate()?;
        let (destination, routing_key) = message.destination.columns();
        let headers = message.headers_json();
        let now = now_ms();
        let mut query = q(&self.sql.stage)
            .bind(message.id.as_str())
            .bind(destination)
            .bind(routing_key)
            .bind(headers.as_str())
            .bind(message.body.as_slice())
            .bind(message.ordering_key.as_deref())
            .bind(now)
            .bind(now);
        if DB::STAGE_TAKES_CHANNEL {
            query = query.bind(&*self.table);
        }
        let done = query.execute(&mut **tx).await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn claim(&self, relay: &str, limit: usize) -> Result<(DB::Batch, Vec<StagedMessage>)> {
        DB::claim(self, relay, limit).await
    }

    async fn settle(&self, batch: DB::Batch, outcomes: Vec<(i64, Settlement)>) -> Result<()> {
        let Some(mut tx) = DB::settling(&self.pool, batch).await? else {
            return Ok(());
        };
        let now = now_ms();
        let published: Vec<i64> = outcomes
            .iter()
            .filter(|(_, s)| *s == Settlement::Published)
            .map(|(seq, _)| *seq)
            .collect();
        if !published.is_empty() {
            DB::bind_seqs(q(&self.sql.published).bind(now), published)
                .execute(&mut *tx)
                .await?;
        }
        for (seq, settlement) in &outcomes {
            let (statement, error, at) = match settlement {
                Settlement::Retry { error, after } => {
                    (&self.sql.retry, error, now.saturating_add(ms(*after)))
                }
                Settlement::Park { error } => (&self.sql.park, error, now),
                Settlement::Published | Settlement::Untouched => continue,
            };
            q(statement)
                .bind(error.as_str())
                .bind(at)
                .bind(*seq)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn listen(&self) -> Result<DB::Listener> {
        DB::listen(self).await
    }

    async fn wait_for_work(&self, listener: &mut DB::Listener, timeout: Duration) {
        DB::wait_for_work(self, listener, timeout).await;
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
        Ok(stats(unpublished, oldest, parked, published))
    }

    async fn purge_published(&self, retention: Duration, max: usize) -> Result<usize> {
        let done = q(&self.sql.purge)
            .bind(now_ms().saturating_sub(ms(retention)))
            .bind(limit(max))
            .execute(&self.pool)
            .await?;
        Ok(affected(DB::rows_affected(&done)))
    }

    async fn parked(&self, max: usize) -> Result<Vec<ParkedMessage>> {
        let rows: Vec<ParkedRow> = sqlx::query_as(AssertSqlSafe(self.sql.parked.as_str()))
            .bind(limit(max))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(parked).collect()
    }

    async fn requeue(&self, id: &str) -> Result<bool> {
        let done = q(&self.sql.requeue)
            .bind(now_ms())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
