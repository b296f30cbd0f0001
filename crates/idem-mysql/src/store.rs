//! `MySqlStore`: the [`Store`] on MySQL or MariaDB.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Ambiguity, Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest, Scope, SetupError,
    SharedClock, Store, StoreError, StoreMetric, StoredResponse, Sweeper, SweeperConfig, Watch,
};
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, MySqlPool};

use crate::batch::{BatchStats, Batcher};
use crate::error::{DUPLICATE_KEY, number, store_error};
use crate::poller::Poller;
use crate::schema;
use crate::statements::{Extra, Statements, record_from_row, row_id};

/// A [`Store`] on MySQL or MariaDB, shared by every instance that points at the same
/// table.
///
/// Each operation is one to three statements on pooled connections, each in autocommit,
/// or, for reserves and completions, a share of a batch's
/// ([`batching`](crate::MySqlStoreBuilder::batching)); "now" comes from the injected
/// clock. Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct MySqlStore {
    pub(crate) pool: MySqlPool,
    pub(crate) clock: SharedClock,
    pub(crate) operation_timeout: Duration,
    pub(crate) sql: Arc<Statements>,
    /// Statements InnoDB rolled back for a lock (1213, 1205) and the store ran again.
    pub(crate) lock_retries: Arc<AtomicU64>,
    /// What wakes waiting duplicates ([`crate::poller`]); `None` when turned off, or
    /// when the store was built outside a tokio runtime: its waiters poll.
    pub(crate) poller: Option<Arc<Poller>>,
    /// The queue that writes reserves and completions in shared statements
    /// ([`crate::batch`]); `None` when batching is off.
    pub(crate) batch: Option<Arc<Batcher>>,
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.sql.table)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl MySqlStore {
    /// The pool, for the caller's own transactions (see
    /// [`complete_in`](Self::complete_in)).
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Counters of the batching since the store was built (all zero when it is off):
    /// how many batches and statements carried how many operations.
    pub fn batch_stats(&self) -> BatchStats {
        self.batch
            .as_ref()
            .map_or_else(BatchStats::default, |b| b.stats())
    }

    /// The records table.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Runs the embedded migration for this store's table (idempotent). A table of a
    /// newer build's schema is [`SetupError::SchemaVersion`], and left as it is.
    pub async fn migrate(&self) -> Result<(), SetupError> {
        schema::migrate(&self.pool, &self.sql.table).await
    }

    /// Starts a background [`Sweeper`] that deletes expired records in bounded batches
    /// (SPEC S8). It stops when dropped.
    pub fn spawn_sweeper(&self, config: SweeperConfig) -> Sweeper {
        Sweeper::spawn(Arc::new(self.clone()), config)
    }

    /// Completes `lease` with `response` on the caller's connection, typically inside
    /// the transaction that holds the handler's business writes (SPEC S9): both commit
    /// together or neither does. Until the transaction ends the record's row stays
    /// locked. Fails with [`StoreError::Fenced`] unless `lease` is the record's current
    /// attempt; the caller should then roll back. A deadlock is not retried here (the
    /// transaction is the caller's): it is [`StoreError::Unavailable`].
    pub async fn complete_in(
        &self,
        conn: &mut MySqlConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.bounded(async {
            match self.complete_on(conn, lease, response).await {
                Ok(()) => Ok(()),
                Err(sqlx::Error::RowNotFound) => Err(StoreError::Fenced),
                Err(e) => Err(store_error(e)),
            }
        })
        .await
    }

    pub(crate) async fn bounded<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::unavailable(format!(
                "no answer from MySQL within {:?}",
                self.operation_timeout
            ))),
        }
    }
}

#[async_trait]
impl Store for MySqlStore {
    /// A plain insert, a plain read, a fenced takeover: see the crate's docs for why no
    /// statement takes a gap lock.
    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation, StoreError> {
        if let Some(batch) = &self.batch {
            return self.bounded(self.reserve_batched(batch, req)).await;
        }
        // Boxed: its state (a pooled connection's acquire, three statements) is
        // kilobytes, which the batched path above would otherwise carry and copy.
        Box::pin(self.reserve_record(req)).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        if let Some(batch) = &self.batch {
            return self
                .bounded(self.complete_batched(batch, lease, response))
                .await;
        }
        Box::pin(self.complete_pooled(lease, response)).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<(), StoreError> {
        let until = self.clock.now().plus(lease_for).as_millis();
        let sql = self.sql.renew.as_str();
        self.fenced(sql, lease, &[Extra::Int(until), Extra::Int(until)])
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.fenced(self.sql.release.as_str(), lease, &[]).await
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: Ambiguity) -> Result<(), StoreError> {
        let sql = self.sql.mark.as_str();
        self.fenced(sql, lease, &[Extra::Text(Some(reason.as_str()))])
            .await
    }

    /// Through the pool, in primary-key order (the scope's digest): each page is one
    /// range scan.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.list_page(query).await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let id = row_id(scope);
        let row = self
            .retrying(|| {
                sqlx::query(AssertSqlSafe(self.sql.get.as_str()))
                    .bind(&id)
                    .fetch_optional(&self.pool)
            })
            .await?;
        row.map(|r| record_from_row(scope, &r)).transpose()
    }

    async fn remove(&self, scope: &Scope) -> Result<bool, StoreError> {
        let id = row_id(scope);
        let done = self
            .retrying(|| {
                sqlx::query(AssertSqlSafe(self.sql.remove.as_str()))
                    .bind(&id)
                    .execute(&self.pool)
            })
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// At most `limit` rows in all: completed records whose tombstone outlives them
    /// compacted into it first (SPEC S16), then expired rows deleted, each through the
    /// `expires_at` index, oldest first; then up to `limit` full key-rate buckets, which
    /// are not counted.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let mut left = u64::try_from(limit).unwrap_or(u64::MAX);
        for sql in [&self.sql.compact, &self.sql.purge] {
            if left == 0 {
                break;
            }
            let now = self.clock.now().as_millis();
            let done = self
                .retrying(|| {
                    sqlx::query(AssertSqlSafe(sql.as_str()))
                        .bind(now)
                        .bind(now)
                        .bind(left)
                        .execute(&self.pool)
                })
                .await?;
            left -= done.rows_affected().min(left);
        }
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        // Full rate buckets go too, as many again at most; they are no records, and not
        // counted.
        let now = self.clock.now().as_millis();
        self.retrying(|| {
            sqlx::query(AssertSqlSafe(self.sql.purge_buckets.as_str()))
                .bind(now)
                .bind(limit)
                .execute(&self.pool)
        })
        .await?;
        Ok(usize::try_from(limit - left).unwrap_or(usize::MAX))
    }

    /// In `TABLE_rate` (migration 2), with the store's clock, as the records: an
    /// `UPDATE` by primary key that refills the bucket and takes a token only where one
    /// is there; where it matches nothing, a plain `INSERT` of a full bucket less the
    /// token; where that finds the bucket made meanwhile (duplicate key), the `UPDATE`
    /// again. One statement for a bucket in use, never a lock held past its statement:
    /// two instances making one bucket at once both answer, neither deadlocks.
    async fn take_rate_token(
        &self,
        bucket: &str,
        rate: &idem_core::KeyRate,
    ) -> Result<Option<bool>, StoreError> {
        let now = self.clock.now();
        let keep_until = now
            .plus(rate.refill())
            .plus(Duration::from_secs(1))
            .as_millis();
        let (now, burst, per_second) =
            (now.as_millis(), f64::from(rate.burst()), rate.per_second());
        let take = || {
            sqlx::query(AssertSqlSafe(self.sql.take_token.as_str()))
                .bind(burst)
                .bind(now)
                .bind(per_second)
                .bind(now)
                .bind(keep_until)
                .bind(bucket)
                .bind(burst)
                .bind(now)
                .bind(per_second)
                .execute(&self.pool)
        };
        let taken = self
            .retrying(|| async {
                if take().await?.rows_affected() == 1 {
                    return Ok(true);
                }
                let inserted = sqlx::query(AssertSqlSafe(self.sql.new_bucket.as_str()))
                    .bind(bucket)
                    .bind(burst)
                    .bind(now)
                    .bind(keep_until)
                    .execute(&self.pool)
                    .await;
                match inserted {
                    Ok(_) => Ok(true),
                    Err(e) if number(&e) == Some(DUPLICATE_KEY) => {
                        Ok(take().await?.rows_affected() == 1)
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        Ok(Some(taken))
    }

    /// From the store's poller, which looks once per interval for every scope this
    /// instance's waiters watch, whichever instance completes the record; [`Watch::poll`]
    /// when the poller is off.
    fn watch(&self, scope: &Scope) -> Watch {
        match &self.poller {
            Some(poller) => poller.watch(scope),
            None => Watch::poll(),
        }
    }

    /// Stops the poller; the pool stays the caller's to close.
    async fn close(&self) {
        if let Some(poller) = &self.poller {
            poller.stop();
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.retrying(|| sqlx::query("SELECT 1").execute(&self.pool))
            .await
            .map(drop)
    }

    /// In `TABLE_meta`: a plain insert, refused where the secret exists, then a read of
    /// the stored one.
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.retrying(|| async {
            let inserted = sqlx::query(AssertSqlSafe(self.sql.init_secret.as_str()))
                .bind(name)
                .bind(candidate)
                .execute(&self.pool)
                .await;
            match inserted {
                Ok(_) => {}
                Err(e) if number(&e) == Some(DUPLICATE_KEY) => {}
                Err(e) => return Err(e),
            }
            sqlx::query_scalar(AssertSqlSafe(self.sql.secret.as_str()))
                .bind(name)
                .fetch_optional(&self.pool)
                .await
        })
        .await?
        .ok_or_else(|| {
            let meta = schema::meta_table(&self.sql.table);
            StoreError::Corrupt(format!("the secret {name:?} vanished from {meta}"))
        })
    }

    /// The pool's connections: how many are open, idle, and allowed; the statements
    /// run again after a deadlock or a lock wait timeout; and, with the poller on, the
    /// watches waiting and the statements it sent.
    fn metrics(&self) -> Vec<StoreMetric> {
        let mut metrics = vec![
            StoreMetric::gauge(
                "idem_mysql_pool_connections",
                "Connections open in the MySQL pool.",
                u64::from(self.pool.size()),
            ),
            StoreMetric::gauge(
                "idem_mysql_pool_idle_connections",
                "Idle connections in the MySQL pool.",
                self.pool.num_idle() as u64,
            ),
            StoreMetric::gauge(
                "idem_mysql_pool_max_connections",
                "The most connections the MySQL pool opens.",
                u64::from(self.pool.options().get_max_connections()),
            ),
            StoreMetric::counter(
                "idem_mysql_lock_retries_total",
                "Statements InnoDB rolled back for a deadlock or a lock wait timeout, \
                 which the store ran again.",
                self.lock_retries.load(Ordering::Relaxed),
            ),
        ];
        if let Some(batch) = &self.batch {
            metrics.extend(batch.metrics());
        }
        if let Some(poller) = &self.poller {
            metrics.push(StoreMetric::gauge(
                "idem_mysql_watches",
                "Waiting duplicates watching a record through the MySQL store's poller.",
                poller.watches() as u64,
            ));
            metrics.push(StoreMetric::counter(
                "idem_mysql_wait_polls_total",
                "Statements the MySQL store's poller sent to look for completions that \
                 waiting duplicates watch.",
                poller.statements(),
            ));
        }
        metrics
    }
}
