//! [`SqliteStore`]: records in one table of a SQLite database.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::codec::encode_response_headers;
use idem_core::{
    Ambiguity, ChangeHub, Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest, Scope,
    SharedClock, Store, StoreError, StoreMetric, StoredResponse, Watch, duration_millis,
};
use sqlx::sqlite::SqlitePool;
use sqlx::{AssertSqlSafe, SqliteConnection};

use crate::error::store_error;
use crate::row::StoredRow;
use crate::schema::Statements;
use crate::write::{Done, Op};
use crate::writer::{Writer, WriterStats};

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
///
/// Its [`Store::watch`]es fire on its own (and its clones') completions, releases and
/// removals, in process (SPEC S15); another process writing the same file is not heard,
/// and a duplicate waiting on that process's attempt finds the answer by polling.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(crate) pool: SqlitePool,
    pub(crate) clock: SharedClock,
    pub(crate) table: Arc<str>,
    pub(crate) sql: Arc<Statements>,
    pub(crate) writer: Writer,
    /// Whether the store opened its pool (and so closes it on [`Store::close`]), rather
    /// than being given the application's.
    pub(crate) owns_pool: bool,
    /// Whether its commits to a file are never synced (`synchronous = OFF`).
    pub(crate) never_syncs: bool,
    /// The watches of duplicates waiting for an attempt (SPEC S15), fired in process:
    /// another process on the same file is not heard, and its waiters poll.
    pub(crate) changes: ChangeHub,
}

impl SqliteStore {
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
            .bind(encode_response_headers(response, false))
            .bind(&response.body[..])
            .bind(duration_millis(lease.ttl))
            .bind(duration_millis(lease.tombstone))
            .bind(response.ambiguity().map(|a| a.as_str()))
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

#[async_trait]
impl Store for SqliteStore {
    fn watch(&self, scope: &Scope) -> Watch {
        self.changes.watch(scope)
    }

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
            encode_response_headers(response, false),
            response.body.clone(),
            response.ambiguity().map(|a| a.as_str()),
        );
        self.writer.submit(op).await?;
        self.changes.notify(&lease.scope);
        Ok(())
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> idem_core::Result<()> {
        let op = Op::Renew(lease.clone(), lease_for);
        self.writer.submit(op).await.map(drop)
    }

    async fn release(&self, lease: &Lease) -> idem_core::Result<()> {
        self.writer.submit(Op::Release(lease.clone())).await?;
        self.changes.notify(&lease.scope);
        Ok(())
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: Ambiguity) -> idem_core::Result<()> {
        let op = Op::Mark(lease.clone(), reason.as_str());
        self.writer.submit(op).await.map(drop)
    }

    async fn get(&self, scope: &Scope) -> idem_core::Result<Option<Record>> {
        self.read(scope).await
    }

    async fn remove(&self, scope: &Scope) -> idem_core::Result<bool> {
        match self.writer.submit(Op::Remove(scope.clone())).await? {
            Done::Removed(existed) => {
                if existed {
                    self.changes.notify(scope);
                }
                Ok(existed)
            }
            other => unreachable!("remove answered {other:?}"),
        }
    }

    async fn purge_expired(&self, limit: usize) -> idem_core::Result<usize> {
        match self.writer.submit(Op::Purge(limit)).await? {
            Done::Purged(n) => Ok(n),
            other => unreachable!("purge answered {other:?}"),
        }
    }

    /// Through the pool, in primary-key order: each page is one range scan.
    async fn list(&self, query: &ListQuery) -> idem_core::Result<ListPage> {
        self.list_page(query).await
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
    /// [`from_pool`](crate::SqliteStoreBuilder::from_pool)). The database's last connection
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
