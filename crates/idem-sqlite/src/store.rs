//! [`SqliteStore`]: records in one table of a SQLite database.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::codec::{decode_headers, encode_headers};
use idem_core::{
    FencingToken, Fingerprint, Lease, Record, RecordState, Reservation, ReserveRequest, Scope,
    SharedClock, Store, StoreError, StoredResponse, SystemClock, Timestamp,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row, SqliteConnection};

use crate::error::{Result, store_error};
use crate::schema::{self, DEFAULT_TABLE, Statements};

/// How long a connection waits for another's write lock before the operation fails
/// (and middleware answers 503) unless configured otherwise.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections in the pool [`SqliteStore::connect`] opens unless configured otherwise.
/// SQLite runs one writer at a time, so more connections only add readers.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// A [`Store`] in one table of a SQLite database file: the embedded default (SPEC S10).
///
/// Cloning is cheap and clones share the pool. Open it with [`SqliteStore::connect`],
/// [`SqliteStore::from_pool`] or [`SqliteStore::builder`]; every constructor runs the
/// embedded migration first.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    clock: SharedClock,
    table: Arc<str>,
    sql: Arc<Statements>,
}

/// Settings for opening a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    clock: SharedClock,
    table: String,
    max_connections: u32,
    busy_timeout: Duration,
}

impl Default for SqliteStoreBuilder {
    fn default() -> Self {
        SqliteStoreBuilder {
            clock: Arc::new(SystemClock),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
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

    /// The connection options [`connect`](Self::connect) uses for `url`: the file is
    /// created if missing, WAL journal, `synchronous = NORMAL`, this builder's
    /// `busy_timeout`. Useful to build a pool of one's own for
    /// [`from_pool`](Self::from_pool) that the application shares.
    ///
    /// `url` is `sqlite://path`, `sqlite:path` or a bare path, with SQLite's URI
    /// parameters (`?mode=ro`, …) if wanted.
    pub fn connect_options(&self, url: &str) -> Result<SqliteConnectOptions> {
        Ok(SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(self.busy_timeout))
    }

    /// Opens (creating if missing) the database at `url` and migrates it.
    pub async fn connect(self, url: &str) -> Result<SqliteStore> {
        let options = self.connect_options(url)?;
        self.connect_with(options).await
    }

    /// Opens a pool with `options` as given and migrates it.
    pub async fn connect_with(self, options: SqliteConnectOptions) -> Result<SqliteStore> {
        schema::validate_table_name(&self.table)?;
        let pool = SqlitePoolOptions::new()
            .max_connections(self.max_connections)
            .connect_with(options)
            .await?;
        self.from_pool(pool).await
    }

    /// Uses an existing pool (shared with the application's own tables, for
    /// [`SqliteStore::complete_in`]) and migrates it. The pool's connection settings are
    /// left as they are; [`connect_options`](Self::connect_options) gives the
    /// recommended ones.
    pub async fn from_pool(self, pool: SqlitePool) -> Result<SqliteStore> {
        schema::validate_table_name(&self.table)?;
        let mut conn = pool.acquire().await?;
        schema::migrate(&mut conn, &self.table).await?;
        drop(conn);
        Ok(SqliteStore {
            sql: Arc::new(Statements::new(&self.table)),
            table: self.table.into(),
            pool,
            clock: self.clock,
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
        let now = self.clock.now();
        let scope = &lease.scope;
        let headers = encode_headers(&response.headers);
        let done = sqlx::query(AssertSqlSafe(self.sql.complete.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .bind(i64::from(response.status))
            .bind(headers)
            .bind(&response.body[..])
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
            .bind(now.as_millis())
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
        row.map(|row| record_from_row(scope, &row)).transpose()
    }

    /// Runs a fenced single-statement write; no row changed means fenced.
    async fn fenced_write(
        &self,
        sql: &Arc<str>,
        lease: &Lease,
        extra: Option<i64>,
    ) -> idem_core::Result<()> {
        let scope = &lease.scope;
        let mut q = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(self.clock.now().as_millis());
        if let Some(v) = extra {
            q = q.bind(v);
        }
        let done = q.execute(&self.pool).await.map_err(store_error)?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::Fenced)
        }
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("idem-sqlite record: {what}"))
}

fn record_from_row(scope: &Scope, row: &SqliteRow) -> idem_core::Result<Record> {
    let get_i64 = |i: usize| row.try_get::<i64, _>(i).map_err(store_error);
    let fingerprint: Vec<u8> = row.try_get(0).map_err(store_error)?;
    let fingerprint =
        Fingerprint::from_slice(&fingerprint).ok_or_else(|| corrupt("fingerprint length"))?;
    let state: String = row.try_get(5).map_err(store_error)?;
    let state = match state.as_str() {
        "in_progress" => {
            let lease_until: Option<i64> = row.try_get(6).map_err(store_error)?;
            RecordState::InProgress {
                lease_until: Timestamp::from_millis(
                    lease_until.ok_or_else(|| corrupt("in progress without a lease"))?,
                ),
            }
        }
        "completed" => {
            let status: Option<i64> = row.try_get(7).map_err(store_error)?;
            let headers: Option<Vec<u8>> = row.try_get(8).map_err(store_error)?;
            let body: Option<Vec<u8>> = row.try_get(9).map_err(store_error)?;
            let completed_at: Option<i64> = row.try_get(10).map_err(store_error)?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| corrupt("status"))?;
            RecordState::Completed {
                response: StoredResponse {
                    status,
                    headers: decode_headers(&headers.unwrap_or_default())?,
                    body: Bytes::from(body.unwrap_or_default()),
                },
                completed_at: Timestamp::from_millis(
                    completed_at.ok_or_else(|| corrupt("completed without a time"))?,
                ),
            }
        }
        other => return Err(corrupt(&format!("state {other:?}"))),
    };
    Ok(Record {
        scope: scope.clone(),
        fingerprint,
        created_at: Timestamp::from_millis(get_i64(1)?),
        expires_at: Timestamp::from_millis(get_i64(2)?),
        attempt: u32::try_from(get_i64(3)?).map_err(|_| corrupt("attempt"))?,
        token: FencingToken::from_i64(get_i64(4)?),
        state,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn reserve(&self, req: &ReserveRequest) -> idem_core::Result<Reservation> {
        let scope = &req.scope;
        loop {
            let now = self.clock.now();
            let token = FencingToken::generate();
            let lease_until = now.plus(req.lease);
            let attempt: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.sql.reserve.clone()))
                .bind(scope.tenant().as_str())
                .bind(scope.endpoint_str())
                .bind(scope.key().as_str())
                .bind(&req.fingerprint.as_bytes()[..])
                .bind(now.as_millis())
                .bind(req.expires_at(now).as_millis())
                .bind(token.as_i64())
                .bind(lease_until.as_millis())
                .fetch_optional(&self.pool)
                .await
                .map_err(store_error)?;
            if let Some(attempt) = attempt {
                return Ok(Reservation::Acquired(Lease {
                    scope: scope.clone(),
                    token,
                    attempt: u32::try_from(attempt).map_err(|_| corrupt("attempt"))?,
                }));
            }
            // A live record this caller may not take: read it to learn which answer
            // applies. If it changed in between so that it may now be taken (released,
            // expired, lease lapsed), go round and try the atomic write again.
            if let Some(existing) = self.read(scope).await?
                && let Some(answer) =
                    Reservation::from_existing(existing, &req.fingerprint, self.clock.now())
            {
                return Ok(answer);
            }
        }
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> idem_core::Result<()> {
        let mut conn = self.pool.acquire().await.map_err(store_error)?;
        self.complete_in(&mut conn, lease, response).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> idem_core::Result<()> {
        let until = self.clock.now().plus(lease_for);
        self.fenced_write(&self.sql.renew, lease, Some(until.as_millis()))
            .await
    }

    async fn release(&self, lease: &Lease) -> idem_core::Result<()> {
        self.fenced_write(&self.sql.release, lease, None).await
    }

    async fn get(&self, scope: &Scope) -> idem_core::Result<Option<Record>> {
        self.read(scope).await
    }

    async fn remove(&self, scope: &Scope) -> idem_core::Result<bool> {
        let done = sqlx::query(AssertSqlSafe(self.sql.remove.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(done.rows_affected() > 0)
    }

    async fn purge_expired(&self, limit: usize) -> idem_core::Result<usize> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let done = sqlx::query(AssertSqlSafe(self.sql.purge.clone()))
            .bind(self.clock.now().as_millis())
            .bind(limit)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn ping(&self) -> idem_core::Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }
}
