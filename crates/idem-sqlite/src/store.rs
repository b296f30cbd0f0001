//! [`SqliteStore`]: records in one table of a SQLite database.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::codec::{decode_headers, encode_headers};
use idem_core::{
    FencingToken, Fingerprint, Lease, Record, RecordState, Reservation, ReserveRequest, Scope,
    SharedClock, Store, StoreError, StoreMetric, StoredResponse, SystemClock, Timestamp,
    duration_millis,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row, SqliteConnection};

use crate::error::{Error, Result, store_error};
use crate::schema::{self, DEFAULT_TABLE, Statements};
use crate::writer::{
    DEFAULT_WRITE_BATCH, DEFAULT_WRITE_QUEUE, Done, Op, Target, Writer, WriterConfig, WriterStats,
};

/// How long a connection waits for another's write lock before the operation fails
/// (and middleware answers 503) unless configured otherwise.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections in the pool [`SqliteStore::connect`] opens unless configured otherwise.
/// The pool serves reads and the application's own queries; the store's writes go
/// through one connection of its own, outside the pool.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// A [`Store`] in one table of a SQLite database file: the embedded default (SPEC S10).
///
/// Cloning is cheap and clones share the pool and the writer. Open it with
/// [`SqliteStore::connect`], [`SqliteStore::from_pool`] or [`SqliteStore::builder`];
/// every constructor runs the embedded migration first.
///
/// Writes (`reserve`, `complete`, `renew`, `release`, `remove`, `purge_expired`) are
/// queued for one writer thread that owns one connection and commits what queued
/// meanwhile in one transaction; each caller is answered once that transaction has
/// committed. Reads (`get`, `ping`) use the pool. The writer ends, closing its
/// connection, when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    clock: SharedClock,
    table: Arc<str>,
    sql: Arc<Statements>,
    writer: Writer,
    /// Whether the store opened its pool (and so closes it on [`Store::close`]), rather
    /// than being given the application's.
    owns_pool: bool,
    /// Whether its commits to a file are never synced (`synchronous = OFF`).
    never_syncs: bool,
}

/// Settings for opening a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    clock: SharedClock,
    table: String,
    max_connections: u32,
    busy_timeout: Duration,
    writer: WriterConfig,
}

impl Default for SqliteStoreBuilder {
    fn default() -> Self {
        SqliteStoreBuilder {
            clock: Arc::new(SystemClock),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            writer: WriterConfig {
                max_batch: DEFAULT_WRITE_BATCH,
                queue: DEFAULT_WRITE_QUEUE,
            },
        }
    }
}

impl SqliteStoreBuilder {
    /// Reads the current time from `clock` instead of the system clock (tests use a
    /// `ManualClock`). Every timestamp the store writes or compares comes from it, never
    /// from SQLite's own clock.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Keeps records in `table` instead of `idem_records`. Checked when the store opens:
    /// 1 to 63 ASCII letters, digits and `_`, not starting with a digit or `sqlite_`.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The pool size for [`connect`](Self::connect) (default
    /// [`DEFAULT_MAX_CONNECTIONS`], at least 1).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long a write waits for the lock held by another connection or process
    /// (default [`DEFAULT_BUSY_TIMEOUT`]).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// At most `n` writes per transaction (default [`DEFAULT_WRITE_BATCH`], at least 1).
    /// Larger batches commit less often; each caller waits for its whole batch.
    pub fn write_batch(mut self, n: usize) -> Self {
        self.writer.max_batch = n.max(1);
        self
    }

    /// At most `n` writes wait for the writer (default [`DEFAULT_WRITE_QUEUE`], at
    /// least 1); further callers wait to queue, which slows them instead of growing
    /// memory without bound.
    pub fn write_queue(mut self, n: usize) -> Self {
        self.writer.queue = n.max(1);
        self
    }

    /// The connection options [`connect`](Self::connect) uses for `url`: the file is
    /// created if missing, WAL journal, `synchronous = NORMAL`, this builder's
    /// `busy_timeout`. Useful to build a pool of one's own for
    /// [`from_pool`](Self::from_pool) that the application shares.
    ///
    /// `url` is `sqlite://path`, `sqlite:path` or a bare path, with SQLite's URI
    /// parameters (`?mode=ro`, …) if wanted, and `synchronous=full` (or `normal`,
    /// `extra`, `off`) to choose how commits reach the disk: with `full`, every commit
    /// is synced, so not even a power loss or an OS crash loses a record, at the cost
    /// of an fsync per group commit; with `off`, nothing is ever synced, so either may
    /// lose or corrupt records, and the store logs a warning. `page_size=1024` (a power of two from 512 to
    /// 65536) sets the page size of a database file this call creates; a file that
    /// exists keeps its own. Each new key writes a whole page of the key index to the
    /// WAL, and each checkpoint writes it again, so smaller pages write less: in a load
    /// run of small answers, 1 KiB pages wrote about half the bytes per request that
    /// SQLite's default 4 KiB did, at the same throughput. A large body then spans
    /// more pages.
    pub fn connect_options(&self, url: &str) -> Result<SqliteConnectOptions> {
        let (url, params) = split_params(url)?;
        let options = SqliteConnectOptions::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(params.synchronous.unwrap_or(SqliteSynchronous::Normal))
            .busy_timeout(self.busy_timeout);
        Ok(match params.page_size {
            Some(bytes) => options.page_size(bytes),
            None => options,
        })
    }

    /// Opens (creating if missing) the database at `url` and migrates it.
    ///
    /// A missing database file is created first with mode 0600, so it and its `-wal`
    /// and `-shm` (which SQLite gives the database's mode) are readable by their owner
    /// only, whatever the umask. A file that exists keeps its mode; if every user may
    /// read or write it, or its `-wal` or `-shm`, a warning says so.
    pub async fn connect(self, url: &str) -> Result<SqliteStore> {
        let options = self.connect_options(url)?;
        schema::validate_table_name(&self.table)?;
        crate::file::prepare(url, &options);
        self.connect_with(options).await
    }

    /// Opens a pool with `options` as given and migrates it. A file SQLite creates
    /// here gets SQLite's mode (0644 less the umask): create it beforehand with the
    /// mode wanted, as [`connect`](Self::connect) does.
    pub async fn connect_with(self, options: SqliteConnectOptions) -> Result<SqliteStore> {
        schema::validate_table_name(&self.table)?;
        // Two processes opening one new file at once both switch it to WAL; SQLite
        // answers one of them SQLITE_BUSY at once instead of waiting out busy_timeout
        // (waiting could deadlock). Opening again succeeds once the other is done.
        let deadline = std::time::Instant::now() + self.busy_timeout;
        let pool = loop {
            match SqlitePoolOptions::new()
                .max_connections(self.max_connections)
                .connect_with(options.clone())
                .await
            {
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                result => break result?,
            }
        };
        let store = self.from_pool(pool).await?;
        Ok(SqliteStore {
            owns_pool: true,
            ..store
        })
    }

    /// Uses an existing pool (shared with the application's own tables, for
    /// [`SqliteStore::complete_in`]) and migrates it. The pool's connection settings are
    /// left as they are; [`connect_options`](Self::connect_options) gives the
    /// recommended ones. The store's writes go through one more connection of its own
    /// to the pool's database, opened with the pool's file and the `busy_timeout`,
    /// `synchronous`, `foreign_keys` and journal mode its connections have (hooks such as
    /// `after_connect` do not run on it).
    pub async fn from_pool(self, pool: SqlitePool) -> Result<SqliteStore> {
        schema::validate_table_name(&self.table)?;
        let mut conn = pool.acquire().await?;
        schema::migrate(&mut conn, &self.table).await?;
        let target = Target::of(&mut conn, &pool.connect_options()).await?;
        drop(conn);
        let never_syncs = target.never_syncs();
        if never_syncs {
            tracing::warn!(
                "the SQLite idempotency store runs with synchronous = off: a machine crash \
                 or power loss can lose or corrupt its records, and a retry of a lost key \
                 executes again; use normal (the default) or full"
            );
        }
        let sql = Arc::new(Statements::new(&self.table));
        let writer = Writer::start(
            target,
            pool.clone(),
            self.clock.clone(),
            sql.clone(),
            self.writer,
        )
        .await
        .map_err(Error::Writer)?;
        Ok(SqliteStore {
            sql,
            table: self.table.into(),
            pool,
            clock: self.clock,
            writer,
            owns_pool: false,
            never_syncs,
        })
    }
}

impl SqliteStore {
    /// Settings to open a store with.
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder::default()
    }

    /// Opens (creating if missing) the database at `url` (`sqlite://idem.db`, or a
    /// path) with the default settings, and migrates it.
    pub async fn connect(url: &str) -> Result<SqliteStore> {
        SqliteStore::builder().connect(url).await
    }

    /// Uses an existing pool with the default settings, and migrates it.
    pub async fn from_pool(pool: SqlitePool) -> Result<SqliteStore> {
        SqliteStore::builder().from_pool(pool).await
    }

    /// The pool, for the application's own queries and transactions.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The records table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Writes submitted and not yet answered: queued for the writer, or in the
    /// transaction it is writing (a gauge for metrics). Callers waiting for room in a
    /// full queue are not counted.
    pub fn pending_writes(&self) -> usize {
        self.writer.pending()
    }

    /// Counters of the writer since the store opened: transactions, operations, the
    /// largest batch, failed transactions. Shared by every clone.
    pub fn writer_stats(&self) -> WriterStats {
        self.writer.stats()
    }

    /// Completes the record inside the caller's transaction (SPEC S9), so that the
    /// business writes made in it and the completion commit together or not at all.
    ///
    /// Pass the transaction's connection (`&mut *tx`). Same rules as
    /// [`Store::complete`]: fails with [`StoreError::Fenced`] unless `lease` still holds
    /// the record, in which case the caller must roll back, since another attempt owns
    /// the key now. A later `complete` with the same lease (the middleware's, after the
    /// handler returns) succeeds and keeps this response.
    ///
    /// Until the transaction commits, the record stays in progress to everyone else; if
    /// it rolls back (or the process dies), it stays in progress until the lease lapses,
    /// and the retry then takes it over as the next attempt.
    ///
    /// SQLite allows one writer at a time: start the transaction with
    /// `pool.begin_with("BEGIN IMMEDIATE")` if it reads before it writes, so that it
    /// takes the write lock up front rather than failing with `SQLITE_BUSY` when it
    /// first writes.
    pub async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> idem_core::Result<()> {
        let now = self.clock.now().as_millis();
        let scope = &lease.scope;
        let done = sqlx::query(AssertSqlSafe(self.sql.complete.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now)
            .bind(i64::from(response.status))
            .bind(encode_headers(&response.headers))
            .bind(&response.body[..])
            .bind(duration_millis(lease.ttl))
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // No in-progress record under this token. Completed by this very attempt is
        // success (the first response stays); anything else is fenced.
        let completed = sqlx::query(AssertSqlSafe(self.sql.completed_by.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now)
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        match completed {
            Some(_) => Ok(()),
            None => Err(StoreError::Fenced),
        }
    }

    async fn read(&self, scope: &Scope) -> idem_core::Result<Option<Record>> {
        let row = sqlx::query(AssertSqlSafe(self.sql.select.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        row.map(|row| {
            StoredRow::from_sqlx(&row)
                .map_err(store_error)?
                .into_record(scope)
        })
        .transpose()
    }
}

pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("idem-sqlite record: {what}"))
}

/// A row's columns in [`RECORD_COLUMNS`](crate::schema::RECORD_COLUMNS) order, as read
/// by either connection type, before they are checked.
pub(crate) struct StoredRow {
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) created_at: i64,
    pub(crate) expires_at: i64,
    pub(crate) attempt: i64,
    pub(crate) token: i64,
    pub(crate) state: String,
    pub(crate) lease_until: Option<i64>,
    pub(crate) status: Option<i64>,
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) completed_at: Option<i64>,
}

impl StoredRow {
    fn from_sqlx(row: &SqliteRow) -> std::result::Result<StoredRow, sqlx::Error> {
        Ok(StoredRow {
            fingerprint: row.try_get(0)?,
            created_at: row.try_get(1)?,
            expires_at: row.try_get(2)?,
            attempt: row.try_get(3)?,
            token: row.try_get(4)?,
            state: row.try_get(5)?,
            lease_until: row.try_get(6)?,
            status: row.try_get(7)?,
            headers: row.try_get(8)?,
            body: row.try_get(9)?,
            completed_at: row.try_get(10)?,
        })
    }

    /// The record, or `Corrupt` if the row holds what this store never writes.
    pub(crate) fn into_record(self, scope: &Scope) -> idem_core::Result<Record> {
        let fingerprint = Fingerprint::from_slice(&self.fingerprint)
            .ok_or_else(|| corrupt("fingerprint length"))?;
        let state = match self.state.as_str() {
            "in_progress" => RecordState::InProgress {
                lease_until: Timestamp::from_millis(
                    self.lease_until
                        .ok_or_else(|| corrupt("in progress without a lease"))?,
                ),
            },
            "completed" => {
                let status = self
                    .status
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or_else(|| corrupt("status"))?;
                RecordState::Completed {
                    response: StoredResponse {
                        status,
                        headers: decode_headers(&self.headers.unwrap_or_default())?,
                        body: Bytes::from(self.body.unwrap_or_default()),
                    },
                    completed_at: Timestamp::from_millis(
                        self.completed_at
                            .ok_or_else(|| corrupt("completed without a time"))?,
                    ),
                }
            }
            other => return Err(corrupt(&format!("state {other:?}"))),
        };
        Ok(Record {
            scope: scope.clone(),
            fingerprint,
            created_at: Timestamp::from_millis(self.created_at),
            expires_at: Timestamp::from_millis(self.expires_at),
            attempt: u32::try_from(self.attempt).map_err(|_| corrupt("attempt"))?,
            token: FencingToken::from_i64(self.token),
            state,
        })
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn reserve(&self, req: &ReserveRequest) -> idem_core::Result<Reservation> {
        match self.writer.submit(Op::Reserve(req.clone())).await? {
            Done::Reserved(r) => Ok(r),
            other => unreachable!("reserve answered {other:?}"),
        }
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> idem_core::Result<()> {
        // Encoded here rather than cloned for the writer: one allocation instead of one
        // per header part.
        let op = Op::Complete(
            lease.clone(),
            response.status,
            encode_headers(&response.headers),
            response.body.clone(),
        );
        self.writer.submit(op).await.map(drop)
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> idem_core::Result<()> {
        let op = Op::Renew(lease.clone(), lease_for);
        self.writer.submit(op).await.map(drop)
    }

    async fn release(&self, lease: &Lease) -> idem_core::Result<()> {
        self.writer
            .submit(Op::Release(lease.clone()))
            .await
            .map(drop)
    }

    async fn get(&self, scope: &Scope) -> idem_core::Result<Option<Record>> {
        self.read(scope).await
    }

    async fn remove(&self, scope: &Scope) -> idem_core::Result<bool> {
        match self.writer.submit(Op::Remove(scope.clone())).await? {
            Done::Removed(existed) => Ok(existed),
            other => unreachable!("remove answered {other:?}"),
        }
    }

    async fn purge_expired(&self, limit: usize) -> idem_core::Result<usize> {
        match self.writer.submit(Op::Purge(limit)).await? {
            Done::Purged(n) => Ok(n),
            other => unreachable!("purge answered {other:?}"),
        }
    }

    async fn ping(&self) -> idem_core::Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// In `TABLE_meta`, through the pool rather than the writer: it runs once per
    /// start. The insert and the read are one transaction under SQLite's write lock,
    /// so callers in other processes on the file wait for it and read its value.
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> idem_core::Result<Vec<u8>> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(store_error)?;
        sqlx::query(AssertSqlSafe(self.sql.init_secret.clone()))
            .bind(name)
            .bind(candidate)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        let stored: Vec<u8> = sqlx::query_scalar(AssertSqlSafe(self.sql.secret.clone()))
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(stored)
    }

    /// Writes what is queued, closes the writer's connections, and then the pool if
    /// the store opened it (not one given to
    /// [`from_pool`](SqliteStoreBuilder::from_pool)). The database's last connection
    /// to close copies the WAL into the database file and deletes it, so a stopped
    /// service leaves one self-contained file to back up or move. Every operation
    /// fails with `Unavailable` afterwards.
    async fn close(&self) {
        // The writer first: with the pool closed, it would refuse what is queued.
        self.writer.close().await;
        if self.owns_pool {
            self.pool.close().await;
        }
    }

    /// The writer's queue and transactions, and the read pool's connections.
    fn metrics(&self) -> Vec<StoreMetric> {
        let w = self.writer_stats();
        vec![
            StoreMetric::gauge(
                "idem_sqlite_pending_writes",
                "Writes queued for the SQLite writer or in the transaction it is writing.",
                self.pending_writes() as u64,
            ),
            StoreMetric::counter(
                "idem_sqlite_write_transactions_total",
                "Transactions the SQLite writer committed.",
                w.batches,
            ),
            StoreMetric::counter(
                "idem_sqlite_writes_total",
                "Writes committed by the SQLite writer.",
                w.operations,
            ),
            StoreMetric::gauge(
                "idem_sqlite_largest_write_transaction",
                "The most writes one committed SQLite transaction held.",
                w.largest_batch,
            ),
            StoreMetric::counter(
                "idem_sqlite_failed_write_transactions_total",
                "SQLite transactions that did not commit; each of their writes failed.",
                w.failed_batches,
            ),
            StoreMetric::gauge(
                "idem_sqlite_pool_connections",
                "Connections open in the SQLite read pool.",
                u64::from(self.pool.size()),
            ),
            StoreMetric::gauge(
                "idem_sqlite_pool_idle_connections",
                "Idle connections in the SQLite read pool.",
                self.pool.num_idle() as u64,
            ),
            StoreMetric::gauge(
                "idem_sqlite_synchronous_off",
                "1 when the store's commits are never synced to disk (synchronous = off), \
                 so a machine crash or power loss can lose or corrupt records; else 0.",
                u64::from(self.never_syncs),
            ),
        ]
    }
}

/// Whether `e` is SQLite's "database is busy" or "locked" (primary codes 5 and 6, in any
/// of their extended forms).
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

/// The query parameters of a store URL that idem reads itself, sqlx does not.
#[derive(Debug, Default)]
struct UrlParams {
    synchronous: Option<SqliteSynchronous>,
    page_size: Option<u32>,
}

/// `url` without the parameters idem reads itself (`synchronous`, `page_size`), and
/// those parameters' values.
fn split_params(url: &str) -> Result<(String, UrlParams)> {
    let mut params = UrlParams::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), params));
    };
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("synchronous") => {
                params.synchronous = Some(SqliteSynchronous::from_str(value)?);
            }
            Some((key, value)) if key.eq_ignore_ascii_case("page_size") => {
                params.page_size = Some(parse_page_size(value)?);
            }
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, params))
}

/// A page size SQLite accepts: a power of two from 512 to 65536 bytes.
fn parse_page_size(value: &str) -> Result<u32> {
    value
        .parse::<u32>()
        .ok()
        .filter(|n| n.is_power_of_two() && (512..=65536).contains(n))
        .ok_or_else(|| Error::InvalidPageSize(value.to_owned()))
}
