//! `PgStore`: the [`Store`] on PostgreSQL.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::codec::encode_response_headers;
use idem_core::{
    Ambiguity, FencingToken, Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest,
    Scope, SharedClock, Store, StoreError, StoreMetric, StoredResponse, Sweeper, SweeperConfig,
    Timestamp, Watch, duration_millis, release_unconfirmed_with,
};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use crate::batch::{BatchStats, Batcher, CompleteOp, Failure, Op, ReleaseOp, ReserveOp};
use crate::durability::DurabilityRisk;
use crate::error::{Error, store_error};
use crate::handoff::Handoff;
use crate::listen::Listener;
use crate::schema;
use crate::statements::{RowAnswer, Statements, record_from_row};

/// How long `reserve` keeps retrying when its statement saw neither its own insert nor
/// the existing row (a row committed by a concurrent transaction after the statement's
/// snapshot). Each retry takes a new snapshot, so two or three suffice in practice.
pub(crate) const RESERVE_ROUNDS: usize = 16;

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
    pub(crate) listener: Option<Arc<Listener>>,
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
    /// not be read, or were not read ([`connect_lazy`](crate::PgStoreOptions::connect_lazy),
    /// or [`from_pool`](crate::PgStoreOptions::from_pool) with the migration off). The store
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

    /// Runs the embedded migration for this store's table (idempotent).
    pub async fn migrate(&self) -> Result<(), Error> {
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

    /// Deletes `lease`'s in-progress record with `sql` (`release`, or
    /// `release_unconfirmed`, which also requires attempt 1); fenced.
    pub(crate) async fn delete_in_progress(
        &self,
        sql: &Arc<str>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let scope = &lease.scope;
        let done = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(scope.tenant().as_str())
                    .bind(scope.endpoint_str())
                    .bind(scope.key().as_str())
                    .bind(lease.token.as_i64())
                    .bind(now.as_millis())
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        fenced_unless_one(done.rows_affected())
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

    /// A reserve through the batch queue, under a token drawn here so that a
    /// reservation written but not confirmed is released by it.
    async fn reserve_batched(
        &self,
        batch: &Arc<Batcher>,
        req: &ReserveRequest,
    ) -> Result<Reservation, StoreError> {
        let token = FencingToken::generate();
        let mut unconfirmed = Unconfirmed::new(self, req, token);
        let op = |reply| {
            Op::Reserve(ReserveOp {
                req: req.clone(),
                token,
                reply,
            })
        };
        match self.submit(batch, op).await {
            Ok(r) => {
                unconfirmed.disarm();
                Ok(r)
            }
            Err(f) => {
                if !f.may_have_run {
                    unconfirmed.disarm();
                }
                Err(f.error)
            }
        }
    }

    async fn reserve_once(&self, req: &ReserveRequest) -> Result<Option<Reservation>, StoreError> {
        // Taken before the statement is armed in `reserve_on`: waiting for a connection
        // sends nothing, so running out of time there leaves nothing to release.
        let mut conn = self.handoff.acquire(&self.pool).await?;
        let reserved = self.reserve_on(&mut conn.conn, req).await;
        if reserved.is_ok() {
            self.handoff.release(conn);
        }
        reserved
    }

    async fn reserve_on(
        &self,
        conn: &mut PgConnection,
        req: &ReserveRequest,
    ) -> Result<Option<Reservation>, StoreError> {
        let token = FencingToken::generate();
        // Armed until the outcome is known: if the statement fails in a way that leaves
        // open whether it committed, or this future is dropped mid-flight (the
        // operation timeout), the reservation it may have written is released. Release
        // matches on the token alone; the attempt (unknown: the statement may have taken
        // over) only shows in logs.
        let mut unconfirmed = Unconfirmed::new(self, req, token);
        let reserved = self.reserve_row(conn, req, token, self.clock.now()).await;
        match reserved {
            Ok(r) => {
                unconfirmed.disarm();
                Ok(r)
            }
            Err(f) => {
                if !f.may_have_run {
                    unconfirmed.disarm();
                }
                Err(f.error)
            }
        }
    }

    /// The single-row reserve of `req` under `token` at `now`: `None` when the
    /// statement saw neither its own insert nor the existing row, to be tried again.
    /// An error says whether the reservation may have been written all the same.
    pub(crate) async fn reserve_row(
        &self,
        conn: &mut PgConnection,
        req: &ReserveRequest,
        token: FencingToken,
        now: Timestamp,
    ) -> Result<Option<Reservation>, Failure> {
        let lease_until = now.plus(req.lease);
        let scope = &req.scope;
        let row = sqlx::query(AssertSqlSafe(self.sql.reserve.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(&req.fingerprint.as_bytes()[..])
            .bind(now.as_millis())
            .bind(req.expires_at(now).as_millis())
            .bind(token.as_i64())
            .bind(lease_until.as_millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| Failure {
                may_have_run: may_have_run(&e),
                error: store_error(e),
            })?;
        let Some(row) = row else {
            // The row exists (the insert conflicted) but was committed after this
            // statement's snapshot, so the read half could not see it: look again.
            return Ok(None);
        };
        // From here on a row came back: an error decoding it may hide that the row is
        // this reservation's.
        let written = |error| Failure {
            error,
            may_have_run: true,
        };
        let acquired: bool = row
            .try_get("acquired")
            .map_err(|e| written(store_error(e)))?;
        let existing = record_from_row(scope, &row).map_err(written)?;
        reservation_from(req, token, acquired, existing, now).map_err(written)
    }

    async fn complete_on(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let headers = encode_response_headers(response, false);
        let answer = RowAnswer {
            status: i32::from(response.status),
            headers: &headers,
            body: &response.body,
            ambiguity: response.ambiguity().map(|a| a.as_str()),
        };
        self.complete_row(conn, lease, answer, self.clock.now())
            .await
    }

    /// The single-row completion of `lease` at `now`, its response encoded for the row.
    pub(crate) async fn complete_row(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        answer: RowAnswer<'_>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        if self.complete_update(conn, lease, answer, now).await? {
            return Ok(());
        }
        self.completed_by(conn, lease, now).await
    }

    /// The completion's update alone: whether it completed the record (else it is
    /// completed already, or fenced: see [`completed_by`](Self::completed_by)).
    pub(crate) async fn complete_update(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        answer: RowAnswer<'_>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let scope = &lease.scope;
        let done = sqlx::query(AssertSqlSafe(self.sql.complete.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .bind(answer.status)
            .bind(answer.headers)
            .bind(answer.body)
            .bind(duration_millis(lease.ttl))
            .bind(duration_millis(lease.tombstone))
            .bind(answer.ambiguity)
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(done.rows_affected() == 1)
    }

    /// After a completion that found `lease`'s record not in progress under its token:
    /// completing twice with one lease is fine (the first response stays); anything
    /// else is fenced. This read runs as its own statement so that it sees a
    /// completion committed while the update waited for the row.
    pub(crate) async fn completed_by(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let scope = &lease.scope;
        let already: Option<i32> = sqlx::query_scalar(AssertSqlSafe(self.sql.completed_by.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        match already {
            Some(_) => Ok(()),
            None => Err(StoreError::Fenced),
        }
    }

    /// The single-row release of `lease`'s in-progress record at `now`; fenced.
    pub(crate) async fn release_row(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let scope = &lease.scope;
        let done = sqlx::query(AssertSqlSafe(self.sql.release.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        fenced_unless_one(done.rows_affected())
    }
}

/// What a reserve statement's row means for `req`, written under `token`: `acquired`
/// says the insert half wrote `row`; otherwise `row` is the existing record, and `None`
/// means it may now be taken (look again).
pub(crate) fn reservation_from(
    req: &ReserveRequest,
    token: FencingToken,
    acquired: bool,
    row: Record,
    now: Timestamp,
) -> Result<Option<Reservation>, StoreError> {
    if acquired {
        if row.token != token {
            return Err(StoreError::Corrupt(
                "reserve returned another attempt's token".into(),
            ));
        }
        return Ok(Some(Reservation::Acquired(
            req.lease_for(token, row.attempt),
        )));
    }
    // `None`: the row read was an older version that may now be taken (its lease or
    // life ran out, or another writer changed it after the snapshot). Try again.
    Ok(Reservation::from_existing(row, &req.fingerprint, now))
}

/// A reservation whose outcome is not known yet; dropped while armed, it is released in
/// the background ([`idem_core::release_unconfirmed`]), fenced by its token and only if
/// it is a first attempt: a retry of the key then executes, rather than answering 409
/// until a lease no one holds lapses. (The statement may have taken a record over
/// without the store learning it; such a record lapses, so that the next attempt still
/// runs as a recovered one.)
pub(crate) struct Unconfirmed<'a> {
    store: &'a PgStore,
    lease: Option<Lease>,
}

impl Unconfirmed<'_> {
    /// Armed for `req`'s reservation under `token`, as a first attempt.
    pub(crate) fn new<'a>(
        store: &'a PgStore,
        req: &ReserveRequest,
        token: FencingToken,
    ) -> Unconfirmed<'a> {
        Unconfirmed {
            store,
            lease: Some(req.lease_for(token, 1)),
        }
    }

    /// The outcome is known: the reservation was acquired and handed out, or it was
    /// certainly not written.
    pub(crate) fn disarm(&mut self) {
        self.lease = None;
    }
}

impl Drop for Unconfirmed<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let store = self.store.clone();
            release_unconfirmed_with(move || {
                let (store, lease) = (store.clone(), lease.clone());
                async move {
                    store
                        .delete_in_progress(&store.sql.release_unconfirmed, &lease)
                        .await
                }
            });
        }
    }
}

/// Whether a statement that failed with `e` may still have committed: the connection
/// broke or the conversation went wrong after it was sent. A database error means it
/// failed and rolled back; a pool error means it was never sent.
pub(crate) fn may_have_run(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
    )
}

#[async_trait]
impl Store for PgStore {
    /// One statement: insert the record, or take over an expired record or a lapsed
    /// lease, or else read the existing row. The insert half's `ON CONFLICT … WHERE`
    /// holds exactly `decide`'s `Execute` rows; a row it did not take is interpreted by
    /// [`Reservation::from_existing`].
    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation, StoreError> {
        if let Some(batch) = &self.batch {
            return self.bounded(self.reserve_batched(batch, req)).await;
        }
        self.bounded(async {
            for _ in 0..RESERVE_ROUNDS {
                if let Some(r) = self.reserve_once(req).await? {
                    return Ok(r);
                }
            }
            Err(StoreError::unavailable(
                "reserve kept racing concurrent writers; try again",
            ))
        })
        .await
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
        self.bounded(async {
            let mut conn = self.handoff.acquire(&self.pool).await?;
            let completed = self.complete_on(&mut conn.conn, lease, response).await;
            // Fenced is an answer: the statements ran to the end.
            if matches!(completed, Ok(()) | Err(StoreError::Fenced)) {
                self.handoff.release(conn);
            }
            completed
        })
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
            Some(listener) => listener.hub.watch(scope),
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
        let meta = crate::schema::meta_table(&self.sql.table);
        self.bounded(async {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {meta} (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING"
            )))
            .bind(name)
            .bind(candidate)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
            sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT value FROM {meta} WHERE name = $1"
            )))
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?
            .ok_or_else(|| StoreError::Corrupt(format!("the secret {name:?} vanished from {meta}")))
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

pub(crate) fn fenced_unless_one(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::testing::unique_namespace;
    use idem_test_support::{service_unavailable, service_url};

    /// The release of a reservation whose reply was lost deletes a first attempt, and
    /// never a takeover's record: that one lapses, so the next attempt still runs as a
    /// recovered one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unconfirmed_release_deletes_first_attempts_only() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let clock = idem_core::ManualClock::starting_now();
        let table = format!("idem_records_{}", unique_namespace("unconfirmed"));
        let store = match PgStore::options()
            .table(&table)
            .clock(Arc::new(clock.clone()))
            .connect(&url)
            .await
        {
            Ok(s) => s,
            Err(Error::Store(StoreError::Unavailable(e))) => {
                return service_unavailable("PostgreSQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        let acquire = |req: ReserveRequest| {
            let store = store.clone();
            async move {
                match store.reserve(&req).await.expect("reserve") {
                    Reservation::Acquired(lease) => lease,
                    other => panic!("expected to acquire, got {other:?}"),
                }
            }
        };
        let fingerprint = idem_core::testing::test_fingerprint("{}");
        let fresh = ReserveRequest::new(
            idem_core::testing::test_scope("/v1/charges", "fresh"),
            fingerprint,
        );
        let taken = ReserveRequest::new(
            idem_core::testing::test_scope("/v1/charges", "taken-over"),
            fingerprint,
        );
        let first = acquire(fresh.clone()).await;
        acquire(taken.clone()).await;
        clock.advance(taken.lease + Duration::from_secs(1));
        let second = acquire(taken.clone()).await;
        assert_eq!(second.attempt, 2);

        let sql = store.sql.release_unconfirmed.clone();
        let kept = store.delete_in_progress(&sql, &second).await;
        let deleted = store.delete_in_progress(&sql, &first).await;
        let (kept_record, deleted_record) = (
            store.get(&taken.scope).await.expect("get"),
            store.get(&fresh.scope).await.expect("get"),
        );
        schema::drop_table(store.pool(), &table)
            .await
            .expect("drop table");
        assert!(matches!(kept, Err(StoreError::Fenced)), "{kept:?}");
        assert_eq!(kept_record.expect("kept").attempt, 2);
        deleted.expect("a first attempt is released");
        assert!(deleted_record.is_none());
    }
}
