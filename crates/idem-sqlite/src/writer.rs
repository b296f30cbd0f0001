//! The writer: every write of a [`SqliteStore`](crate::SqliteStore) goes through one
//! connection owned by one task, which commits the operations queued meanwhile in one
//! transaction (group commit).
//!
//! SQLite admits one writer at a time. With every pooled connection writing on its own,
//! the connections that lost the race for the lock slept in SQLite's busy handler (1, 2,
//! 5, … up to 100 ms between tries) while the lock sat free, so throughput fell as
//! concurrency rose. One writer never waits for itself, and a batch writes each page it
//! touches to the WAL once per batch instead of once per operation.
//!
//! What each operation may rely on is what the single statements it replaces gave:
//! - it runs alone, in arrival order, reading the clock when it runs, on the writer's
//!   connection inside the batch's `BEGIN IMMEDIATE`, so the reserve's fallback read
//!   sees exactly what its upsert saw;
//! - it is answered only after its batch's `COMMIT` succeeded. When the `COMMIT` fails,
//!   or a statement rolled the whole transaction back (SQLite does so on some I/O and
//!   memory errors), every operation of the batch is answered
//!   [`StoreError::Unavailable`]: nobody hears `Acquired` for a row that was not stored;
//! - a statement that fails on its own (SQLite undoes just that statement) fails only
//!   its operation; the rest of the batch commits.
//!
//! Other writers on the same file (another process's store, the application's own
//! transactions such as [`complete_in`](crate::SqliteStore::complete_in)) contend with
//! this one for SQLite's lock, and the writer waits out `busy_timeout` for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::codec::encode_headers;
use idem_core::{
    Clock, FencingToken, Lease, Reservation, ReserveRequest, Scope, SharedClock, StoreError,
    StoredResponse,
};
use sqlx::sqlite::SqlitePool;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use crate::error::store_error;
use crate::schema::Statements;
use crate::store::record_from_row;

/// Operations per transaction, at most, unless configured otherwise.
pub const DEFAULT_WRITE_BATCH: usize = 128;

/// Operations that may wait for the writer before callers wait to queue, unless
/// configured otherwise.
pub const DEFAULT_WRITE_QUEUE: usize = 1024;

/// Opens each batch. The savepoint costs nothing to keep and tells, after a failed
/// statement, whether the transaction is still open: SQLite rolls the whole transaction
/// back on some errors, and then the savepoint is gone with it.
const BEGIN: &str = "BEGIN IMMEDIATE; SAVEPOINT idem_batch";
const STILL_OPEN: &str = "RELEASE idem_batch; SAVEPOINT idem_batch";

/// A write, as queued for the writer.
#[derive(Debug)]
pub(crate) enum Op {
    Reserve(ReserveRequest),
    Complete(Lease, StoredResponse),
    Renew(Lease, Duration),
    Release(Lease),
    Remove(Scope),
    Purge(usize),
}

/// What a write returns.
#[derive(Debug)]
pub(crate) enum Done {
    Reserved(Reservation),
    Unit,
    Removed(bool),
    Purged(usize),
}

type Reply = oneshot::Sender<idem_core::Result<Done>>;

struct Pending {
    op: Op,
    reply: Reply,
}

/// Counters of a store's writer, for metrics and for seeing how well writes batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterStats {
    /// Transactions committed.
    pub batches: u64,
    /// Operations answered from committed transactions.
    pub operations: u64,
    /// The most operations one committed transaction held.
    pub largest_batch: u64,
    /// Transactions that did not commit; every operation in them was answered
    /// `Unavailable`.
    pub failed_batches: u64,
}

#[derive(Debug, Default)]
struct Counters {
    /// Submitted and not yet answered: queued, or in the transaction being written.
    pending: AtomicUsize,
    batches: AtomicU64,
    operations: AtomicU64,
    largest_batch: AtomicU64,
    failed_batches: AtomicU64,
}

/// Why a batch did not commit; every operation in it gets this as its `Unavailable`.
#[derive(Debug, thiserror::Error)]
#[error("the write was not committed ({stage}): {source}")]
struct BatchFailed {
    stage: &'static str,
    #[source]
    source: Arc<sqlx::Error>,
}

impl BatchFailed {
    fn store_error(stage: &'static str, source: &Arc<sqlx::Error>) -> StoreError {
        StoreError::unavailable(BatchFailed {
            stage,
            source: source.clone(),
        })
    }
}

/// The writer stopped: every store handle was dropped, or the runtime it ran on shut
/// down.
#[derive(Debug, thiserror::Error)]
#[error("the SQLite store's writer has stopped")]
struct WriterStopped;

/// How the writer is configured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterConfig {
    pub(crate) max_batch: usize,
    pub(crate) queue: usize,
}

/// A store handle's end of the writer. When the last one drops, the queue closes and
/// the writer finishes what was queued, closes its connection and ends.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    queue: mpsc::Sender<Pending>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer task on the current tokio runtime. `conn` is its connection;
    /// `pool` gives the settings to reopen it after a failure, and its closing stops
    /// the writes too.
    pub(crate) fn spawn(
        conn: SqliteConnection,
        pool: SqlitePool,
        clock: SharedClock,
        sql: Arc<Statements>,
        config: WriterConfig,
    ) -> Writer {
        let (queue, rx) = mpsc::channel(config.queue.max(1));
        let counters = Arc::new(Counters::default());
        let task = Task {
            queue: rx,
            conn: Some(conn),
            pool,
            clock,
            sql,
            max_batch: config.max_batch.max(1),
            counters: counters.clone(),
        };
        tokio::spawn(task.run());
        Writer { queue, counters }
    }

    /// Queues `op` (waiting while the queue is full) and waits for its committed
    /// answer.
    pub(crate) async fn submit(&self, op: Op) -> idem_core::Result<Done> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending { op, reply })
            .await
            .map_err(|_| StoreError::unavailable(WriterStopped))?;
        // Counted once queued, until answered or abandoned.
        self.counters.pending.fetch_add(1, Ordering::Relaxed);
        let _answered = Answered(&self.counters.pending);
        answer
            .await
            .map_err(|_| StoreError::unavailable(WriterStopped))?
    }

    /// Operations queued or in the transaction being written, not yet answered.
    pub(crate) fn pending(&self) -> usize {
        self.counters.pending.load(Ordering::Relaxed)
    }

    pub(crate) fn stats(&self) -> WriterStats {
        let c = &self.counters;
        WriterStats {
            batches: c.batches.load(Ordering::Relaxed),
            operations: c.operations.load(Ordering::Relaxed),
            largest_batch: c.largest_batch.load(Ordering::Relaxed),
            failed_batches: c.failed_batches.load(Ordering::Relaxed),
        }
    }
}

struct Answered<'a>(&'a AtomicUsize);

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Task {
    queue: mpsc::Receiver<Pending>,
    /// `None` after a failure left the connection in doubt; reopened for the next batch.
    conn: Option<SqliteConnection>,
    pool: SqlitePool,
    clock: SharedClock,
    sql: Arc<Statements>,
    max_batch: usize,
    counters: Arc<Counters>,
}

impl Task {
    async fn run(mut self) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while self.queue.recv_many(&mut batch, self.max_batch).await > 0 {
            self.write(&mut batch).await;
            debug_assert!(batch.is_empty());
        }
        if let Some(conn) = self.conn.take() {
            conn.close().await.ok();
        }
    }

    /// Takes what is queued now, up to the batch bound, without waiting.
    fn fill(&mut self, batch: &mut Vec<Pending>) {
        while batch.len() < self.max_batch {
            match self.queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
    }

    /// Runs `batch` in one transaction and answers every operation in it.
    async fn write(&mut self, batch: &mut Vec<Pending>) {
        let mut conn = match self.begin().await {
            Ok(conn) => conn,
            Err(e) => {
                self.fail(batch.drain(..).map(|p| p.reply), "begin", e);
                return;
            }
        };
        // Operations that queued while BEGIN waited for the lock join this batch.
        self.fill(batch);

        let mut answers: Vec<(Reply, idem_core::Result<Done>)> = Vec::with_capacity(batch.len());
        let mut lost = None;
        let mut ops = batch.drain(..);
        for Pending { op, reply } in ops.by_ref() {
            match execute(&mut conn, &self.sql, &*self.clock, op).await {
                Ok(result) => answers.push((reply, result)),
                // SQLite undid just the failed statement: only this operation fails.
                Err(e) if sqlx::query(STILL_OPEN).execute(&mut conn).await.is_ok() => {
                    answers.push((reply, Err(store_error(e))));
                }
                // The failed statement took the transaction with it: what ran before it
                // in this batch is gone, and nothing after it may run outside a
                // transaction.
                Err(e) => {
                    lost = Some((reply, e));
                    break;
                }
            }
        }
        let unrun: Vec<Reply> = ops.map(|p| p.reply).collect();

        let committed = match lost {
            Some((reply, e)) => Err((Some(reply), "a statement rolled the transaction back", e)),
            None => sqlx::query("COMMIT")
                .execute(&mut conn)
                .await
                .map(drop)
                .map_err(|e| (None, "commit", e)),
        };
        match committed {
            Ok(()) => {
                self.conn = Some(conn);
                let n = answers.len() as u64;
                self.counters.batches.fetch_add(1, Ordering::Relaxed);
                self.counters.operations.fetch_add(n, Ordering::Relaxed);
                self.counters.largest_batch.fetch_max(n, Ordering::Relaxed);
                for (reply, result) in answers {
                    reply.send(result).ok();
                }
            }
            Err((failed, stage, e)) => {
                // A failed COMMIT leaves the transaction open; roll it back and keep the
                // connection. If even that fails, its state is unknown: open a new one.
                if sqlx::query("ROLLBACK").execute(&mut conn).await.is_ok() {
                    self.conn = Some(conn);
                }
                let replies = answers
                    .into_iter()
                    .map(|(reply, _)| reply)
                    .chain(failed)
                    .chain(unrun);
                self.fail(replies, stage, e);
            }
        }
    }

    /// The connection, inside a new `BEGIN IMMEDIATE` transaction.
    async fn begin(&mut self) -> Result<SqliteConnection, sqlx::Error> {
        // Closing the pool closes the store: writes fail as reads do.
        if self.pool.is_closed() {
            if let Some(conn) = self.conn.take() {
                conn.close().await.ok();
            }
            return Err(sqlx::Error::PoolClosed);
        }
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.pool.connect_options().connect().await?,
        };
        // On failure (the lock stayed busy past busy_timeout, or the connection broke)
        // the connection is dropped; the next batch opens a new one.
        sqlx::query(BEGIN).execute(&mut conn).await?;
        Ok(conn)
    }

    fn fail(&self, replies: impl IntoIterator<Item = Reply>, stage: &'static str, e: sqlx::Error) {
        self.counters.failed_batches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(stage, error = %e, "idempotency record writes were not committed");
        let source = Arc::new(e);
        for reply in replies {
            reply
                .send(Err(BatchFailed::store_error(stage, &source)))
                .ok();
        }
    }
}

/// Runs one operation. The outer error is a statement that failed (which may have
/// ended the transaction); the inner result is the operation's answer.
async fn execute(
    conn: &mut SqliteConnection,
    sql: &Statements,
    clock: &dyn Clock,
    op: Op,
) -> Result<idem_core::Result<Done>, sqlx::Error> {
    Ok(match op {
        Op::Reserve(req) => reserve(conn, sql, clock, &req).await?.map(Done::Reserved),
        Op::Complete(lease, response) => complete(conn, sql, clock, &lease, &response)
            .await?
            .map(|()| Done::Unit),
        Op::Renew(lease, lease_for) => {
            let until = clock.now().plus(lease_for);
            fenced(conn, &sql.renew, clock, &lease, Some(until.as_millis()))
                .await?
                .map(|()| Done::Unit)
        }
        Op::Release(lease) => fenced(conn, &sql.release, clock, &lease, None)
            .await?
            .map(|()| Done::Unit),
        Op::Remove(scope) => {
            let done = sqlx::query(AssertSqlSafe(sql.remove.clone()))
                .bind(scope.tenant().as_str())
                .bind(scope.endpoint_str())
                .bind(scope.key().as_str())
                .execute(&mut *conn)
                .await?;
            Ok(Done::Removed(done.rows_affected() > 0))
        }
        Op::Purge(limit) => {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let done = sqlx::query(AssertSqlSafe(sql.purge.clone()))
                .bind(clock.now().as_millis())
                .bind(limit)
                .execute(&mut *conn)
                .await?;
            Ok(Done::Purged(
                usize::try_from(done.rows_affected()).unwrap_or(usize::MAX),
            ))
        }
    })
}

/// The one-statement reserve; when it writes nothing, the row it met says the answer.
async fn reserve(
    conn: &mut SqliteConnection,
    sql: &Statements,
    clock: &dyn Clock,
    req: &ReserveRequest,
) -> Result<idem_core::Result<Reservation>, sqlx::Error> {
    let scope = &req.scope;
    loop {
        let now = clock.now();
        let token = FencingToken::generate();
        let lease_until = now.plus(req.lease);
        let attempt: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.reserve.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(&req.fingerprint.as_bytes()[..])
            .bind(now.as_millis())
            .bind(req.expires_at(now).as_millis())
            .bind(token.as_i64())
            .bind(lease_until.as_millis())
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(attempt) = attempt {
            return Ok(match u32::try_from(attempt) {
                Ok(attempt) => Ok(Reservation::Acquired(Lease {
                    scope: scope.clone(),
                    token,
                    attempt,
                })),
                Err(_) => Err(crate::store::corrupt("attempt")),
            });
        }
        // A live record this caller may not take: read it to learn which answer
        // applies. If the clock moved so that it may now be taken (expired, lease
        // lapsed), go round and try the atomic write again.
        let row = sqlx::query(AssertSqlSafe(sql.select.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .fetch_optional(&mut *conn)
            .await?;
        let existing = match row.map(|row| record_from_row(scope, &row)).transpose() {
            Ok(existing) => existing,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(existing) = existing
            && let Some(answer) =
                Reservation::from_existing(existing, &req.fingerprint, clock.now())
        {
            return Ok(Ok(answer));
        }
    }
}

/// Completes on `conn`: the writer's, or the caller's own transaction (SPEC S9).
pub(crate) async fn complete(
    conn: &mut SqliteConnection,
    sql: &Statements,
    clock: &dyn Clock,
    lease: &Lease,
    response: &StoredResponse,
) -> Result<idem_core::Result<()>, sqlx::Error> {
    let now = clock.now();
    let scope = &lease.scope;
    let done = sqlx::query(AssertSqlSafe(sql.complete.clone()))
        .bind(scope.tenant().as_str())
        .bind(scope.endpoint_str())
        .bind(scope.key().as_str())
        .bind(lease.token.as_i64())
        .bind(now.as_millis())
        .bind(i64::from(response.status))
        .bind(encode_headers(&response.headers))
        .bind(&response.body[..])
        .execute(&mut *conn)
        .await?;
    if done.rows_affected() == 1 {
        return Ok(Ok(()));
    }
    // No in-progress record under this token. Completed by this very attempt is
    // success (the first response stays); anything else is fenced.
    let completed = sqlx::query(AssertSqlSafe(sql.completed_by.clone()))
        .bind(scope.tenant().as_str())
        .bind(scope.endpoint_str())
        .bind(scope.key().as_str())
        .bind(lease.token.as_i64())
        .bind(now.as_millis())
        .fetch_optional(&mut *conn)
        .await?;
    Ok(match completed {
        Some(_) => Ok(()),
        None => Err(StoreError::Fenced),
    })
}

/// A fenced single-statement write; no row changed means fenced.
async fn fenced(
    conn: &mut SqliteConnection,
    sql: &Arc<str>,
    clock: &dyn Clock,
    lease: &Lease,
    extra: Option<i64>,
) -> Result<idem_core::Result<()>, sqlx::Error> {
    let scope = &lease.scope;
    let mut q = sqlx::query(AssertSqlSafe(sql.clone()))
        .bind(scope.tenant().as_str())
        .bind(scope.endpoint_str())
        .bind(scope.key().as_str())
        .bind(lease.token.as_i64())
        .bind(clock.now().as_millis());
    if let Some(v) = extra {
        q = q.bind(v);
    }
    let done = q.execute(&mut *conn).await?;
    Ok(if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    })
}
