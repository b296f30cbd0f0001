//! `PgStore`: the [`Store`] on PostgreSQL.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::codec::encode_response_headers;
use idem_core::{
    Ambiguity, ChangeFeed, Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest, Scope,
    SetupError, SharedClock, Store, StoreError, StoreMetric, StoredResponse, Sweeper,
    SweeperConfig, Watch,
};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::batch::{BatchStats, Batcher, CompleteOp, Op, ReleaseOp};
use crate::durability::DurabilityRisk;
use crate::error::{fenced_unless_one, store_error};
use crate::handoff::Handoff;
use crate::schema;
use crate::statements::{Statements, record_from_row};

/// A [`Store`] on PostgreSQL, shared by every instance that points at the same table.
///
/// Every operation is one statement on one pooled connection (reserve may repeat its
/// statement in a rare race; see [`Store::reserve`] below), and reads "now" from the
/// injected clock. Cloning is cheap and shares the pool.
///
/// TLS is not enabled in this build: connect over loopback or a private network.
#[derive(Clone)]
pub struct PgStore {
    pub(crate) pool: PgPool,
    pub(crate) clock: SharedClock,
    pub(crate) operation_timeout: Duration,
    pub(crate) sql: Arc<Statements>,
    pub(crate) handoff: Arc<Handoff>,
    /// What the server's settings risk, as read when the store connected.
    pub(crate) durability: Option<Arc<DurabilityRisk>>,
    /// Where reserves, completions and releases queue to be written together; `None`
    /// when batching is off.
    pub(crate) batch: Option<Arc<Batcher>>,
    /// The `LISTEN` connection that tells waiting duplicates of completions and
    /// releases (SPEC S15); `None` when the store was built outside a tokio runtime.
    pub(crate) listener: Option<Arc<ChangeFeed>>,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.sql.table)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// The pool, for the caller's own transactions (SPEC S9, see
    /// [`complete_in`](Self::complete_in)).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The records table.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The server's settings if, when the store connected, they let a crash lose
    /// acknowledged records (see [`DurabilityRisk`]); `None` when they did not, could
    /// not be read, or were not read ([`connect_lazy`](crate::PgStoreBuilder::connect_lazy),
    /// or [`from_pool`](crate::PgStoreBuilder::from_pool) with the migration off). The store
    /// logs a warning when it finds them.
    pub fn durability_risk(&self) -> Option<&DurabilityRisk> {
        self.durability.as_deref()
    }

    /// Counters of the batching since the store was built (all zero when it is off):
    /// how many batches and statements carried how many operations.
    pub fn batch_stats(&self) -> BatchStats {
        self.batch
            .as_ref()
            .map_or_else(BatchStats::default, |b| b.stats())
    }

    /// Waits up to `within` for the store's `LISTEN` connection to listen, so that a
    /// duplicate waiting from now on hears of completions rather than polling; whether
    /// it does.
    pub async fn listening(&self, within: Duration) -> bool {
        match &self.listener {
            Some(listener) => listener.ready(within).await,
            None => false,
        }
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
    /// locked, so a concurrent retry of the same key waits for the commit; keep the
    /// transaction short.
    ///
    /// Fails with [`StoreError::Fenced`] unless `lease` is the record's current attempt;
    /// the caller should then roll back. Completing again afterwards (the middleware
    /// does) succeeds and keeps this response.
    ///
    /// ```no_run
    /// # async fn demo(store: idem_postgres::PgStore, lease: idem_core::Lease)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.pool().begin().await?;
    /// sqlx::query("INSERT INTO orders (id, amount) VALUES ($1, $2)")
    ///     .bind("ord_1")
    ///     .bind(100_i64)
    ///     .execute(&mut *tx)
    ///     .await?;
    /// let response = idem_core::StoredResponse::new(201, r#"{"id":"ord_1"}"#);
    /// store.complete_in(&mut tx, &lease, &response).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.bounded(self.complete_on(conn, lease, response)).await
    }

    pub(crate) async fn bounded<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::unavailable(format!(
                "no answer from PostgreSQL within {:?}",
                self.operation_timeout
            ))),
        }
    }
}

#[async_trait]
impl Store for PgStore {
    /// One statement: insert the record, or take over an expired record or a lapsed
    /// lease, or else read the existing row. The insert half's `ON CONFLICT … WHERE`
    /// holds exactly `decide`'s `Execute` rows; a row it did not take is interpreted by
    /// [`Reservation::from_existing`].
    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation, StoreError> {
        self.reserve_record(req).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        if let Some(batch) = &self.batch {
            let op = |reply| {
                Op::Complete(CompleteOp {
                    lease: lease.clone(),
                    status: i32::from(response.status),
                    headers: encode_response_headers(response, false),
                    body: response.body.clone(),
                    ambiguity: response.ambiguity().map(|a| a.as_str()),
                    reply,
                })
            };
            return self
                .bounded(async { self.submit(batch, op).await.map_err(|f| f.error) })
                .await;
        }
        // Boxed, as the unbatched reserve: its kilobytes of state would otherwise be
        // carried and copied by the batched path above.
        self.bounded(Box::pin(async {
            let mut conn = self.handoff.acquire(&self.pool).await?;
            let completed = self.complete_on(&mut conn.conn, lease, response).await;
            // Fenced is an answer: the statements ran to the end.
            if matches!(completed, Ok(()) | Err(StoreError::Fenced)) {
                self.handoff.release(conn);
            }
            completed
        }))
        .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<(), StoreError> {
        let now = self.clock.now();
        let scope = &lease.scope;
        let done = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(self.sql.renew.clone()))
                    .bind(scope.tenant().as_str())
                    .bind(scope.endpoint_str())
                    .bind(scope.key().as_str())
                    .bind(lease.token.as_i64())
                    .bind(now.as_millis())
                    .bind(now.plus(lease_for).as_millis())
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        fenced_unless_one(done.rows_affected())
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        if let Some(batch) = &self.batch {
            let op = |reply| {
                Op::Release(ReleaseOp {
                    lease: lease.clone(),
                    reply,
                })
            };
            return self
                .bounded(async { self.submit(batch, op).await.map_err(|f| f.error) })
                .await;
        }
        self.delete_in_progress(&self.sql.release, lease).await
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: Ambiguity) -> Result<(), StoreError> {
        self.mark_row(lease, reason).await
    }

    /// Through the pool, in primary-key order: each page is one range scan.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.list_page(query).await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let row = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(self.sql.get.clone()))
                    .bind(scope.tenant().as_str())
                    .bind(scope.endpoint_str())
                    .bind(scope.key().as_str())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        row.map(|r| record_from_row(scope, &r)).transpose()
    }

    async fn remove(&self, scope: &Scope) -> Result<bool, StoreError> {
        let done = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(self.sql.remove.clone()))
                    .bind(scope.tenant().as_str())
                    .bind(scope.endpoint_str())
                    .bind(scope.key().as_str())
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        if limit == 0 {
            return Ok(0);
        }
        let now = self.clock.now();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let done: i64 = self
            .bounded(async {
                sqlx::query_scalar(AssertSqlSafe(self.sql.purge.clone()))
                    .bind(now.as_millis())
                    .bind(limit)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        // Full rate buckets go too; they are no records, and not counted.
        self.bounded(async {
            sqlx::query(AssertSqlSafe(self.sql.purge_buckets.clone()))
                .bind(now.as_millis())
                .bind(limit)
                .execute(&self.pool)
                .await
                .map_err(store_error)
        })
        .await?;
        Ok(usize::try_from(done).unwrap_or(0))
    }

    /// One statement on `TABLE_rate` (migration 5), with the store's clock: an insert
    /// of a full bucket less one token, or an update that refills the bucket and takes
    /// a token only where one is there. The table is unlogged, so the statement waits
    /// for no WAL flush.
    async fn take_rate_token(
        &self,
        bucket: &str,
        rate: &idem_core::KeyRate,
    ) -> Result<Option<bool>, StoreError> {
        let now = self.clock.now();
        let keep_until = now.plus(rate.refill()).plus(Duration::from_secs(1));
        let taken: Option<i32> = self
            .bounded(async {
                sqlx::query_scalar(AssertSqlSafe(self.sql.take_token.clone()))
                    .bind(bucket)
                    .bind(f64::from(rate.burst()))
                    .bind(rate.per_second())
                    .bind(now.as_millis())
                    .bind(keep_until.as_millis())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        Ok(Some(taken.is_some()))
    }

    /// From the store's `LISTEN` connection: it fires when any instance on this table
    /// completes, releases or removes the record. While that connection is down,
    /// [`Watch::poll`].
    fn watch(&self, scope: &Scope) -> Watch {
        match &self.listener {
            Some(listener) => listener.hub().watch(scope),
            None => Watch::poll(),
        }
    }

    /// Stops the `LISTEN` connection; the pool stays the caller's to close.
    async fn close(&self) {
        if let Some(listener) = &self.listener {
            listener.stop();
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query("SELECT 1")
                .execute(&self.pool)
                .await
                .map_err(store_error)
                .map(drop)
        })
        .await
    }

    /// In `TABLE_meta` (created by migration 2). Two statements, not one: under READ
    /// COMMITTED an `INSERT … ON CONFLICT DO NOTHING` that waited for another
    /// caller's insert does not see its row in the same statement; the `SELECT` after
    /// it, a statement of its own, does.
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.bounded(async {
            sqlx::query(AssertSqlSafe(self.sql.init_secret.clone()))
                .bind(name)
                .bind(candidate)
                .execute(&self.pool)
                .await
                .map_err(store_error)?;
            sqlx::query_scalar(AssertSqlSafe(self.sql.secret.clone()))
                .bind(name)
                .fetch_optional(&self.pool)
                .await
                .map_err(store_error)?
                .ok_or_else(|| {
                    let meta = crate::schema::meta_table(&self.sql.table);
                    StoreError::Corrupt(format!("the secret {name:?} vanished from {meta}"))
                })
        })
        .await
    }

    /// The pool's connections: how many are open, idle, and allowed; and the
    /// batching's counters.
    fn metrics(&self) -> Vec<StoreMetric> {
        let mut metrics = vec![
            StoreMetric::gauge(
                "idem_postgres_pool_connections",
                "Connections open in the PostgreSQL pool.",
                u64::from(self.pool.size()),
            ),
            StoreMetric::gauge(
                "idem_postgres_pool_idle_connections",
                "Idle connections in the PostgreSQL pool.",
                self.pool.num_idle() as u64,
            ),
            StoreMetric::gauge(
                "idem_postgres_pool_max_connections",
                "The most connections the PostgreSQL pool opens.",
                u64::from(self.pool.options().get_max_connections()),
            ),
            StoreMetric::counter(
                "idem_postgres_connection_handoffs_total",
                "Connections handed from one operation straight to the next waiting one, \
                 skipping the pool's check on return.",
                self.handoff.handed(),
            ),
            StoreMetric::gauge(
                "idem_postgres_commits_may_be_lost",
                "1 when, as the store connected, the server's settings (synchronous_commit \
                 or fsync off) let a crash lose acknowledged records; else 0.",
                u64::from(self.durability.is_some()),
            ),
        ];
        if let Some(batch) = &self.batch {
            metrics.extend(batch.metrics());
        }
        metrics
    }
}
