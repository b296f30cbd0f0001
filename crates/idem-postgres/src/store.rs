//! `PgStore`: the [`Store`] on PostgreSQL.

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::codec::{decode_headers, encode_headers};
use idem_core::{
    FencingToken, Fingerprint, Lease, Record, RecordState, Reservation, ReserveRequest, Scope,
    SharedClock, Store, StoreError, StoreMetric, StoredResponse, Sweeper, SweeperConfig,
    SystemClock, Timestamp, duration_millis, release_unconfirmed_with,
};
use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Row};

use crate::error::{Error, store_error};
use crate::handoff::Handoff;
use crate::schema::{self, DEFAULT_TABLE};

/// How long `reserve` keeps retrying when its statement saw neither its own insert nor
/// the existing row (a row committed by a concurrent transaction after the statement's
/// snapshot). Each retry takes a new snapshot, so two or three suffice in practice.
const RESERVE_ROUNDS: usize = 16;

/// Settings for a [`PgStore`]; start from [`PgStore::options`].
#[derive(Clone)]
pub struct PgStoreOptions {
    table: String,
    clock: SharedClock,
    acquire_timeout: Duration,
    operation_timeout: Duration,
    max_connections: u32,
    migrate: bool,
}

impl fmt::Debug for PgStoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStoreOptions")
            .field("table", &self.table)
            .field("clock", &self.clock)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("max_connections", &self.max_connections)
            .field("migrate", &self.migrate)
            .finish()
    }
}

impl Default for PgStoreOptions {
    fn default() -> Self {
        PgStoreOptions {
            table: DEFAULT_TABLE.to_owned(),
            clock: Arc::new(SystemClock),
            acquire_timeout: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(5),
            max_connections: 10,
            migrate: true,
        }
    }
}

impl PgStoreOptions {
    /// The table records live in (default `idem_records`). It must be a plain
    /// lower-case identifier; see [`validate_table_name`](crate::validate_table_name).
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The clock every statement's "now" comes from (default: the system clock). The
    /// server's own `now()` is never used, so tests move time by hand and several
    /// instances agree as far as their clocks do.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long an operation waits for a pooled connection, including opening a new
    /// one, before failing with [`StoreError::Unavailable`] (default 2 s). Only used
    /// when this crate builds the pool ([`connect`](Self::connect)).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The bound on one store operation, round trips and retries included (default
    /// 5 s). A server that accepts connections but stops answering yields
    /// [`StoreError::Unavailable`] after this long instead of a hung request.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The pool size when this crate builds the pool (default 10).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Whether to run the embedded migration when the store is built (default true).
    /// Turn it off where the application's role may not create tables, and run
    /// [`PgStore::migrate`] from a role that may.
    pub fn migrate(mut self, run: bool) -> Self {
        self.migrate = run;
        self
    }

    /// Connects to `url` (`postgres://user@host:port/db`), builds a pool and runs the
    /// migration (or, when that is turned off, checks that the server answers), then
    /// reads the server's durability settings ([`PgStore::durability_risk`]). An
    /// unreachable server is [`Error::Store`]`(`[`StoreError::Unavailable`]`)`.
    pub async fn connect(self, url: &str) -> Result<PgStore, Error> {
        let pool = self.pool_options().connect_lazy_with(parse_url(url)?);
        let check = !self.migrate;
        let mut store = self.from_pool(pool).await?;
        if check {
            store.ping().await?;
            store.durability = durability_risk(&store.pool).await.map(Arc::new);
        }
        Ok(store)
    }

    /// Like [`connect`](Self::connect) but touches neither the server nor the schema:
    /// the first operation connects. For processes that must start while the database
    /// is down; operations fail with [`StoreError::Unavailable`] until it is up.
    pub fn connect_lazy(self, url: &str) -> Result<PgStore, Error> {
        let pool = self.pool_options().connect_lazy_with(parse_url(url)?);
        self.build(pool)
    }

    /// Uses an existing pool (its own acquire timeout and size apply) and, unless
    /// turned off, runs the migration and reads the server's durability settings
    /// ([`PgStore::durability_risk`]); with the migration off, nothing is sent to the
    /// server yet.
    pub async fn from_pool(self, pool: PgPool) -> Result<PgStore, Error> {
        let run = self.migrate;
        let mut store = self.build(pool)?;
        if run {
            store.migrate().await?;
            store.durability = durability_risk(&store.pool).await.map(Arc::new);
        }
        Ok(store)
    }

    fn pool_options(&self) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            // sqlx's default pings every connection it hands out: one extra round trip
            // per operation. Only connections that sat idle are checked; a busy one
            // that broke fails its operation (Unavailable, fail-closed) and is dropped.
            .test_before_acquire(false)
            .before_acquire(ping_if_idle)
    }

    fn build(self, pool: PgPool) -> Result<PgStore, Error> {
        schema::validate_table_name(&self.table)?;
        Ok(PgStore {
            sql: Arc::new(Statements::for_table(&self.table)),
            pool,
            clock: self.clock,
            operation_timeout: self.operation_timeout,
            handoff: Arc::default(),
            durability: None,
        })
    }
}

/// Server settings under which PostgreSQL can lose records it acknowledged:
/// `synchronous_commit = off` answers a commit before its WAL reaches the disk, so a
/// server crash forgets the last fraction of a second of records (a retry of one of
/// those keys executes again); `fsync = off` may lose or corrupt anything written
/// since the last checkpoint when the machine crashes or loses power.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurabilityRisk {
    /// The store's sessions run with `synchronous_commit = off`.
    pub synchronous_commit_off: bool,
    /// The server runs with `fsync = off`.
    pub fsync_off: bool,
}

impl DurabilityRisk {
    /// The risk the two settings make, if any.
    fn from_settings(fsync: &str, synchronous_commit: &str) -> Option<DurabilityRisk> {
        let risk = DurabilityRisk {
            synchronous_commit_off: synchronous_commit.eq_ignore_ascii_case("off"),
            fsync_off: fsync.eq_ignore_ascii_case("off"),
        };
        (risk.synchronous_commit_off || risk.fsync_off).then_some(risk)
    }
}

/// Reads, on a connection of the store's pool (so with the URL's session options), the
/// settings that decide whether an acknowledged commit survives a crash, and warns when
/// it may not. A server that cannot be asked is not checked.
async fn durability_risk(pool: &PgPool) -> Option<DurabilityRisk> {
    let settings: Result<(String, String), sqlx::Error> =
        sqlx::query_as("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
            .fetch_one(pool)
            .await;
    let (fsync, synchronous_commit) = match settings {
        Ok(settings) => settings,
        Err(e) => {
            tracing::debug!(error = %e, "could not read the PostgreSQL server's durability settings");
            return None;
        }
    };
    let risk = DurabilityRisk::from_settings(&fsync, &synchronous_commit)?;
    if risk.fsync_off {
        tracing::warn!(
            "PostgreSQL runs with fsync = off: a machine crash or power loss can lose or \
             corrupt idempotency records, and a retry of a lost key executes again"
        );
    }
    if risk.synchronous_commit_off {
        tracing::warn!(
            "the idempotency store's PostgreSQL sessions run with synchronous_commit = off: \
             a server crash can forget the last records written, and a retry of one of \
             those keys executes again"
        );
    }
    Some(risk)
}

/// Connections idle at least this long are pinged before use.
const IDLE_CHECK: Duration = Duration::from_secs(1);

fn ping_if_idle(
    conn: &mut PgConnection,
    meta: PoolConnectionMetadata,
) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + '_>> {
    Box::pin(async move {
        if meta.idle_for >= IDLE_CHECK {
            conn.ping().await?;
        }
        Ok(true)
    })
}

fn parse_url(url: &str) -> Result<PgConnectOptions, Error> {
    PgConnectOptions::from_str(url).map_err(Error::Config)
}

/// A [`Store`] on PostgreSQL, shared by every instance that points at the same table.
///
/// Every operation is one statement on one pooled connection (reserve may repeat its
/// statement in a rare race; see [`Store::reserve`] below), and reads "now" from the
/// injected clock. Cloning is cheap and shares the pool.
///
/// TLS is not enabled in this build: connect over loopback or a private network.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    clock: SharedClock,
    operation_timeout: Duration,
    sql: Arc<Statements>,
    handoff: Arc<Handoff>,
    /// What the server's settings risk, as read when the store connected.
    durability: Option<Arc<DurabilityRisk>>,
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
    /// Default settings, to adjust before connecting.
    pub fn options() -> PgStoreOptions {
        PgStoreOptions::default()
    }

    /// Connects with default settings and runs the migration.
    pub async fn connect(url: &str) -> Result<PgStore, Error> {
        PgStore::options().connect(url).await
    }

    /// Uses `pool` with default settings and runs the migration.
    pub async fn from_pool(pool: PgPool) -> Result<PgStore, Error> {
        PgStore::options().from_pool(pool).await
    }

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
    /// not be read, or were not read ([`connect_lazy`](PgStoreOptions::connect_lazy),
    /// or [`from_pool`](PgStoreOptions::from_pool) with the migration off). The store
    /// logs a warning when it finds them.
    pub fn durability_risk(&self) -> Option<&DurabilityRisk> {
        self.durability.as_deref()
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
    async fn delete_in_progress(&self, sql: &Arc<str>, lease: &Lease) -> Result<(), StoreError> {
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

    async fn bounded<T>(
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
        let now = self.clock.now();
        let token = FencingToken::generate();
        let lease_until = now.plus(req.lease);
        let scope = &req.scope;
        // Armed until the outcome is known: if the statement fails in a way that leaves
        // open whether it committed, or this future is dropped mid-flight (the
        // operation timeout), the reservation it may have written is released. Release
        // matches on the token alone; the attempt (unknown: the statement may have taken
        // over) only shows in logs.
        let mut unconfirmed = Unconfirmed {
            store: self,
            lease: Some(Lease {
                scope: scope.clone(),
                token,
                attempt: 1,
                ttl: req.ttl,
            }),
        };
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
            .map_err(|e| {
                if !may_have_run(&e) {
                    unconfirmed.disarm();
                }
                store_error(e)
            })?;
        let Some(row) = row else {
            // The row exists (the insert conflicted) but was committed after this
            // statement's snapshot, so the read half could not see it: look again.
            unconfirmed.disarm();
            return Ok(None);
        };
        // From here on a row came back: an error decoding it leaves the release armed,
        // since the row may be this reservation's.
        let acquired: bool = row.try_get("acquired").map_err(store_error)?;
        if acquired {
            let stored = FencingToken::from_i64(row.try_get("token").map_err(store_error)?);
            if stored != token {
                return Err(StoreError::Corrupt(
                    "reserve returned another attempt's token".into(),
                ));
            }
            let attempt = attempt_from(&row)?;
            unconfirmed.disarm();
            return Ok(Some(Reservation::Acquired(Lease {
                scope: scope.clone(),
                token,
                attempt,
                ttl: req.ttl,
            })));
        }
        unconfirmed.disarm();
        let existing = record_from_row(scope, &row)?;
        // `None`: the row read was an older version that may now be taken (its lease or
        // life ran out, or another writer changed it after the snapshot). Try again.
        Ok(Reservation::from_existing(existing, &req.fingerprint, now))
    }

    async fn complete_on(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let scope = &lease.scope;
        let done = sqlx::query(AssertSqlSafe(self.sql.complete.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .bind(i32::from(response.status))
            .bind(encode_headers(&response.headers))
            .bind(&response.body[..])
            .bind(duration_millis(lease.ttl))
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // Not in progress under this token. Completing twice with one lease is fine
        // (the first response stays); anything else is fenced. This read runs as its
        // own statement so that it sees a completion committed while the update
        // waited for the row.
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
}

/// A reservation whose outcome is not known yet; dropped while armed, it is released in
/// the background ([`idem_core::release_unconfirmed`]), fenced by its token and only if
/// it is a first attempt: a retry of the key then executes, rather than answering 409
/// until a lease no one holds lapses. (The statement may have taken a record over
/// without the store learning it; such a record lapses, so that the next attempt still
/// runs as a recovered one.)
struct Unconfirmed<'a> {
    store: &'a PgStore,
    lease: Option<Lease>,
}

impl Unconfirmed<'_> {
    /// The outcome is known: the reservation was acquired and handed out, or it was
    /// certainly not written.
    fn disarm(&mut self) {
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
fn may_have_run(e: &sqlx::Error) -> bool {
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
        self.delete_in_progress(&self.sql.release, lease).await
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
        let done = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(self.sql.purge.clone()))
                    .bind(now.as_millis())
                    .bind(limit)
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
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

    /// The pool's connections: how many are open, idle, and allowed.
    fn metrics(&self) -> Vec<StoreMetric> {
        vec![
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
        ]
    }
}

fn fenced_unless_one(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    }
}

fn attempt_from(row: &PgRow) -> Result<u32, StoreError> {
    let attempt: i32 = row.try_get("attempt").map_err(store_error)?;
    u32::try_from(attempt).map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))
}

/// A record from the columns every query below selects.
fn record_from_row(scope: &Scope, row: &PgRow) -> Result<Record, StoreError> {
    let ms = |col: &str| -> Result<Timestamp, StoreError> {
        Ok(Timestamp::from_millis(
            row.try_get::<i64, _>(col).map_err(store_error)?,
        ))
    };
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(store_error)?;
    let fingerprint = Fingerprint::from_slice(&fingerprint)
        .ok_or_else(|| StoreError::Corrupt("fingerprint is not 32 bytes".into()))?;
    let state: String = row.try_get("state").map_err(store_error)?;
    let state = match state.as_str() {
        "in_progress" => RecordState::InProgress {
            lease_until: ms("lease_until")?,
        },
        "completed" => {
            let status: i32 = row.try_get("status").map_err(store_error)?;
            let status = u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
            let headers: Vec<u8> = row.try_get("headers").map_err(store_error)?;
            let body: Vec<u8> = row.try_get("body").map_err(store_error)?;
            RecordState::Completed {
                response: StoredResponse {
                    status,
                    headers: decode_headers(&headers)?,
                    body: Bytes::from(body),
                },
                completed_at: ms("completed_at")?,
            }
        }
        other => return Err(StoreError::Corrupt(format!("unknown state {other:?}"))),
    };
    Ok(Record {
        scope: scope.clone(),
        fingerprint,
        created_at: ms("created_at")?,
        expires_at: ms("expires_at")?,
        attempt: attempt_from(row)?,
        token: FencingToken::from_i64(row.try_get("token").map_err(store_error)?),
        state,
    })
}

/// Every statement, spelled once for the configured table. The table name was validated
/// as a plain identifier, so splicing it is safe; all values are bound parameters.
struct Statements {
    table: String,
    reserve: Arc<str>,
    complete: Arc<str>,
    completed_by: Arc<str>,
    renew: Arc<str>,
    release: Arc<str>,
    release_unconfirmed: Arc<str>,
    get: Arc<str>,
    remove: Arc<str>,
    purge: Arc<str>,
}

/// The columns a record is read from, in the order both halves of `reserve` return them.
const RECORD_COLUMNS: &str = "attempt, token, fingerprint, created_at, expires_at, state, \
                              lease_until, status, headers, body, completed_at";

/// The scope's primary key, as parameters $1..$3.
const BY_SCOPE: &str = "tenant = $1 AND endpoint = $2 AND idem_key = $3";

impl Statements {
    fn for_table(t: &str) -> Statements {
        // reserve: $1 tenant, $2 endpoint, $3 key, $4 fingerprint, $5 now, $6 expires_at
        // of a fresh record, $7 the new token, $8 lease_until.
        //
        // The DO UPDATE's WHERE is decide()'s Execute rows and nothing else: the record
        // expired (any payload: start afresh as attempt 1, new creation time and
        // expiry), or it is in progress, its lease lapsed, and the payload is the same
        // (take over as attempt n+1, keeping the creation time; expiry never before the
        // new lease ends). When the insert took nothing, the second half reads the row.
        let reserve = format!(
            "WITH ins AS (
                INSERT INTO {t} AS r (tenant, endpoint, idem_key, fingerprint, created_at,
                                      expires_at, attempt, token, state, lease_until)
                VALUES ($1, $2, $3, $4, $5::BIGINT, $6::BIGINT, 1, $7::BIGINT,
                        'in_progress', $8::BIGINT)
                ON CONFLICT (tenant, endpoint, idem_key) DO UPDATE SET
                    fingerprint  = EXCLUDED.fingerprint,
                    created_at   = CASE WHEN r.expires_at <= $5 THEN EXCLUDED.created_at
                                        ELSE r.created_at END,
                    expires_at   = CASE WHEN r.expires_at <= $5 THEN EXCLUDED.expires_at
                                        ELSE GREATEST(r.expires_at, EXCLUDED.lease_until) END,
                    attempt      = CASE WHEN r.expires_at <= $5 THEN 1
                                        ELSE LEAST(r.attempt, 2147483646) + 1 END,
                    token        = EXCLUDED.token,
                    state        = 'in_progress',
                    lease_until  = EXCLUDED.lease_until,
                    status       = NULL,
                    headers      = NULL,
                    body         = NULL,
                    completed_at = NULL
                WHERE r.expires_at <= $5
                   OR (r.state = 'in_progress' AND r.lease_until <= $5
                       AND r.fingerprint = EXCLUDED.fingerprint)
                RETURNING {RECORD_COLUMNS}
            )
            SELECT TRUE AS acquired, {RECORD_COLUMNS} FROM ins
            UNION ALL
            SELECT FALSE AS acquired, {RECORD_COLUMNS} FROM {t}
             WHERE {BY_SCOPE} AND NOT EXISTS (SELECT 1 FROM ins)"
        );
        // complete: $4 token, $5 now, $6 status, $7 headers, $8 body, $9 the TTL in ms.
        // A completed record expires at creation + TTL, as `Lease::completed_expires_at`
        // says: the lease may have kept it alive longer while in progress. A CASE, so
        // that a TTL of i64::MAX ms never overflows the sum.
        let complete = format!(
            "UPDATE {t} SET state = 'completed', lease_until = NULL, status = $6,
                    headers = $7, body = $8, completed_at = $5,
                    expires_at = CASE WHEN $9::BIGINT < expires_at - created_at
                                      THEN created_at + $9::BIGINT ELSE expires_at END
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'in_progress'"
        );
        let completed_by = format!(
            "SELECT 1 FROM {t}
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'completed'"
        );
        // renew: $5 now, $6 the new lease_until.
        let renew = format!(
            "UPDATE {t} SET lease_until = $6, expires_at = GREATEST(expires_at, $6)
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'in_progress'"
        );
        let release = format!(
            "DELETE FROM {t}
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'in_progress'"
        );
        // A reservation whose reply was lost, if it is a first attempt: a takeover's
        // record must lapse instead, so that the next attempt runs as a recovered one.
        let release_unconfirmed = format!("{release} AND attempt = 1");
        let get = format!("SELECT {RECORD_COLUMNS} FROM {t} WHERE {BY_SCOPE}");
        let remove = format!("DELETE FROM {t} WHERE {BY_SCOPE}");
        // At most $2 rows, found through the expires_at index; rows another
        // transaction holds (a reserve taking one over) are skipped, not waited for.
        let purge = format!(
            "DELETE FROM {t}
              WHERE ctid = ANY(ARRAY(
                        SELECT ctid FROM {t} WHERE expires_at <= $1
                         ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))
                AND expires_at <= $1"
        );
        Statements {
            table: t.to_owned(),
            reserve: reserve.into(),
            complete: complete.into(),
            completed_by: completed_by.into(),
            renew: renew.into(),
            release: release.into(),
            release_unconfirmed: release_unconfirmed.into(),
            get: get.into(),
            remove: remove.into(),
            purge: purge.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::testing::unique_namespace;
    use idem_test_support::{service_unavailable, service_url};

    #[test]
    fn either_setting_off_is_a_risk() {
        assert_eq!(DurabilityRisk::from_settings("on", "on"), None);
        // Other synchronous_commit levels still wait for the local flush.
        assert_eq!(DurabilityRisk::from_settings("on", "local"), None);
        assert_eq!(DurabilityRisk::from_settings("on", "remote_write"), None);
        assert_eq!(
            DurabilityRisk::from_settings("on", "off"),
            Some(DurabilityRisk {
                synchronous_commit_off: true,
                fsync_off: false
            })
        );
        assert_eq!(
            DurabilityRisk::from_settings("off", "on"),
            Some(DurabilityRisk {
                synchronous_commit_off: false,
                fsync_off: true
            })
        );
    }

    #[tokio::test]
    async fn bad_table_name_or_url_is_rejected_before_connecting() {
        let url = "postgres://postgres@127.0.0.1:5432/test";
        match PgStore::options()
            .table("orders; DROP TABLE x")
            .connect_lazy(url)
        {
            Err(Error::InvalidTableName { name, .. }) => {
                assert_eq!(name, "orders; DROP TABLE x");
            }
            other => panic!("expected InvalidTableName, got {other:?}"),
        }
        match PgStore::options().connect_lazy("postgres://host:notaport/db") {
            Err(Error::Config(_)) => {}
            other => panic!("expected Config, got {other:?}"),
        }
        let store = PgStore::options()
            .table("idem_records_custom")
            .connect_lazy(url)
            .expect("a valid name and URL need no server");
        assert_eq!(store.table(), "idem_records_custom");
    }

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

    /// The plans PostgreSQL picks for the hot statements on a table of realistic size:
    /// the reserve's read and the fenced writes go through the primary key, the purge
    /// through the `expires_at` index; none scans the table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statements_use_the_indexes() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let table = format!("idem_records_{}", unique_namespace("plans"));
        let store = match PgStore::options().table(&table).connect(&url).await {
            Ok(s) => s,
            Err(Error::Store(StoreError::Unavailable(e))) => {
                return service_unavailable("PostgreSQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        let plans = explain_all(&store).await;
        schema::drop_table(store.pool(), &table)
            .await
            .expect("drop table");
        let plans = plans.expect("explain");
        for (name, plan) in &plans {
            eprintln!("{name}:\n{plan}\n");
            assert!(
                !plan.contains("Seq Scan"),
                "{name} scans the table:\n{plan}"
            );
        }
        let uses = |name: &str, index: &str| {
            let plan = &plans.iter().find(|(n, _)| *n == name).expect(name).1;
            assert!(
                plan.contains(&format!("{table}_{index}")),
                "{name} does not use {index}:\n{plan}"
            );
        };
        uses("reserve", "pkey");
        uses("complete", "pkey");
        uses("renew", "pkey");
        uses("release", "pkey");
        uses("release_unconfirmed", "pkey");
        uses("purge", "expires");
    }

    async fn explain_all(store: &PgStore) -> Result<Vec<(&'static str, String)>, sqlx::Error> {
        let t = store.table();
        // 100,000 rows, 1 % of them expired at `now`.
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (tenant, endpoint, idem_key, fingerprint, created_at, expires_at,
                              attempt, token, state, status, headers, body, completed_at)
             SELECT 'tenant-' || (i % 97), 'POST /v1/charges', 'key-' || i,
                    sha256(i::text::bytea), 0, CASE WHEN i % 100 = 0 THEN 5 ELSE 10000 END,
                    1, i, 'completed', 200, '\\x0000'::bytea, 'ok'::bytea, 0
               FROM generate_series(1, 100000) AS i"
        )))
        .execute(&store.pool)
        .await?;
        sqlx::query(AssertSqlSafe(format!("ANALYZE {t}")))
            .execute(&store.pool)
            .await?;
        let sql = &store.sql;
        // For the statements whose parameters are the scope (when `scoped`) and then
        // numbers.
        let explain =
            async |stmt: &Arc<str>, scoped: bool, binds: &[i64]| -> Result<String, sqlx::Error> {
                let text = format!("EXPLAIN {stmt}");
                let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(text));
                if scoped {
                    q = q.bind("tenant-1").bind("POST /v1/charges").bind("key-1");
                }
                for b in binds {
                    q = q.bind(*b);
                }
                Ok(q.fetch_all(&store.pool).await?.join("\n"))
            };
        let reserve = {
            let text = format!("EXPLAIN {}", sql.reserve);
            sqlx::query_scalar::<_, String>(AssertSqlSafe(text))
                .bind("tenant-1")
                .bind("POST /v1/charges")
                .bind("key-1")
                .bind(vec![0_u8; 32])
                .bind(100_i64)
                .bind(200_i64)
                .bind(7_i64)
                .bind(160_i64)
                .fetch_all(&store.pool)
                .await?
                .join("\n")
        };
        let complete = {
            let text = format!("EXPLAIN {}", sql.complete);
            sqlx::query_scalar::<_, String>(AssertSqlSafe(text))
                .bind("tenant-1")
                .bind("POST /v1/charges")
                .bind("key-1")
                .bind(1_i64)
                .bind(100_i64)
                .bind(200_i32)
                .bind(vec![0_u8, 0])
                .bind(vec![1_u8])
                .bind(86_400_000_i64)
                .fetch_all(&store.pool)
                .await?
                .join("\n")
        };
        Ok(vec![
            ("reserve", reserve),
            ("complete", complete),
            ("renew", explain(&sql.renew, true, &[1, 100, 160]).await?),
            ("release", explain(&sql.release, true, &[1, 100]).await?),
            (
                "release_unconfirmed",
                explain(&sql.release_unconfirmed, true, &[1, 100]).await?,
            ),
            ("purge", explain(&sql.purge, false, &[100, 1000]).await?),
        ])
    }
}
