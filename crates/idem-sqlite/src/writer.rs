//! The writer: every write of a [`SqliteStore`](crate::SqliteStore) goes through one
//! connection owned by one thread, which commits the operations queued meanwhile in one
//! transaction (group commit).
//!
//! SQLite admits one writer at a time. With every pooled connection writing on its own,
//! the connections that lost the race for the lock slept in SQLite's busy handler (1, 2,
//! 5, … up to 100 ms between tries) while the lock sat free, so throughput fell as
//! concurrency rose. One writer never waits for itself, and a batch writes each page it
//! touches to the WAL once per batch instead of once per operation.
//!
//! The writer drives its connection synchronously (rusqlite, linked to the same SQLite
//! as sqlx) on a thread of its own: through sqlx every statement is a round trip to the
//! connection's worker thread, two thread wake-ups that cost more than SQLite's work on
//! a small row. Here a batch costs one wake-up to start and one per caller answered.
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
//! In WAL mode the writer does not checkpoint: SQLite would copy the WAL back into the
//! database file (and, with `synchronous = NORMAL`, sync both) inside the commit that
//! crosses 1000 WAL pages, stalling every write queued behind it. A second thread with
//! its own connection runs a passive checkpoint instead, at most every
//! [`CHECKPOINT_EVERY`] while writes flow, concurrently with the writer. Should it stop,
//! the writer checkpoints for itself again.
//!
//! A checkpoint that runs beside a busy writer never reaches the end of the WAL (frames
//! arrive while it copies), and SQLite starts the WAL over only once all of it is in
//! the database file: under steady load the WAL grew by every page written, without
//! bound, and each new WAL block cost the kernel a zeroed page. So after each of its
//! rounds the checkpoint thread asks the writer to finish the job: before its next
//! transaction the writer checkpoints what the round left (a few frames, with no write
//! running alongside), and that transaction starts the WAL over. `journal_size_limit`
//! then trims a WAL that a burst made larger than [`WAL_SIZE_LIMIT`].
//!
//! Other writers on the same file (another process's store, the application's own
//! transactions such as [`complete_in`](crate::SqliteStore::complete_in)) contend with
//! this one for SQLite's lock, and the writer waits out `busy_timeout` for it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Clock, FencingToken, Lease, Reservation, ReserveRequest, Scope, SharedClock, StoreError,
    duration_millis,
};
use rusqlite::{OpenFlags, OptionalExtension, params};
use sqlx::SqliteConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use crate::schema::Statements;
use crate::store::{StoredRow, corrupt};

/// Operations per transaction, at most, unless configured otherwise.
pub const DEFAULT_WRITE_BATCH: usize = 128;

/// Operations that may wait for the writer before callers wait to queue, unless
/// configured otherwise.
pub const DEFAULT_WRITE_QUEUE: usize = 1024;

/// The least time between two checkpoints of the checkpoint thread.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// WAL pages after which a writer that checkpoints for itself does so (SQLite's default).
const AUTOCHECKPOINT_PAGES: i64 = 1000;

/// The size, in bytes, that a WAL larger than it is cut back to when it starts over.
const WAL_SIZE_LIMIT: i64 = 64 << 20;

/// A write, as queued for the writer.
#[derive(Debug)]
pub(crate) enum Op {
    Reserve(ReserveRequest),
    /// The response as the row keeps it: status, `encode_headers`, body.
    Complete(Lease, u16, Vec<u8>, bytes::Bytes),
    Renew(Lease, Duration),
    Release(Lease),
    Remove(Scope),
    Purge(usize),
    /// Ends the writer once what was queued before it is written (see [`Writer::close`]).
    Close,
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
    source: Arc<dyn std::error::Error + Send + Sync>,
}

/// The writer stopped: every store handle was dropped.
#[derive(Debug, thiserror::Error)]
#[error("the SQLite store's writer has stopped")]
struct WriterStopped;

/// The store's pool was closed, which closes the store.
#[derive(Debug, thiserror::Error)]
#[error("the SQLite store was closed")]
struct StoreClosed;

/// How the writer is configured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterConfig {
    pub(crate) max_batch: usize,
    pub(crate) queue: usize,
}

/// Where and how the writer opens its connection: the pool's database, with the
/// settings a pooled connection has.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    path: PathBuf,
    memory: bool,
    busy_timeout: Duration,
    synchronous: i64,
    foreign_keys: bool,
    journal_mode: String,
}

impl Target {
    /// Reads the settings from `conn`, a connection of the pool opened with `options`.
    pub(crate) async fn of(
        conn: &mut SqliteConnection,
        options: &SqliteConnectOptions,
    ) -> Result<Target, sqlx::Error> {
        let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *conn)
            .await?;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await?;
        let foreign_keys: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
            .fetch_one(&mut *conn)
            .await?;
        let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await?;
        // An in-memory database has no file; sqlx names it so that its connections
        // share it through SQLite's shared cache, and so can the writer.
        let file: String =
            sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                .fetch_one(&mut *conn)
                .await?;
        Ok(Target {
            path: options.get_filename().to_owned(),
            memory: file.is_empty(),
            busy_timeout: Duration::from_millis(u64::try_from(busy).unwrap_or(0)),
            synchronous,
            foreign_keys: foreign_keys != 0,
            journal_mode,
        })
    }

    fn open(&self) -> rusqlite::Result<rusqlite::Connection> {
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if self.memory {
            flags |= OpenFlags::SQLITE_OPEN_MEMORY | OpenFlags::SQLITE_OPEN_SHARED_CACHE;
        }
        let conn = rusqlite::Connection::open_with_flags(&self.path, flags)?;
        conn.busy_timeout(self.busy_timeout)?;
        conn.pragma_update(None, "synchronous", self.synchronous)?;
        conn.pragma_update(None, "foreign_keys", self.foreign_keys)?;
        // WAL is a property of the file; the rollback-journal modes are per connection.
        if !self.journal_mode.eq_ignore_ascii_case("wal") {
            conn.pragma_update_and_check(None, "journal_mode", &self.journal_mode, |_| Ok(()))?;
        }
        if self.wal() {
            conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        }
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }

    /// Whether the database has a WAL to checkpoint.
    fn wal(&self) -> bool {
        !self.memory && self.journal_mode.eq_ignore_ascii_case("wal")
    }

    /// Whether commits to a file skip syncing altogether (`synchronous = OFF`), so that
    /// a machine crash or power loss may lose or corrupt the database.
    pub(crate) fn never_syncs(&self) -> bool {
        !self.memory && self.synchronous == 0
    }
}

/// Checkpoints on `conn` each time the writer nudges, at most every
/// [`CHECKPOINT_EVERY`], and then sets `finish` for the writer to copy the frames that
/// arrived meanwhile; ends when the writer drops its end.
fn checkpoint(
    conn: rusqlite::Connection,
    nudges: std::sync::mpsc::Receiver<()>,
    finish: Arc<AtomicBool>,
) {
    while nudges.recv().is_ok() {
        // Passive: copies what it can without waiting for readers or the writer; what
        // it cannot yet copy waits for the writer's finishing checkpoint or the next
        // nudge.
        match passive_checkpoint(&conn) {
            Ok(()) => finish.store(true, Ordering::Release),
            Err(e) => {
                tracing::debug!(error = %e, "checkpointing the idempotency store's WAL failed");
            }
        }
        std::thread::sleep(CHECKPOINT_EVERY);
    }
}

fn passive_checkpoint(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

/// The writer's end of the checkpoint thread.
#[derive(Debug)]
struct Checkpoints {
    /// Wakes the thread after a commit; full while it sleeps or copies.
    nudge: std::sync::mpsc::SyncSender<()>,
    /// Set by the thread after a round: the writer copies the rest before it next
    /// writes.
    finish: Arc<AtomicBool>,
    /// Joined on close, so that the thread's connection is closed before the writer's.
    thread: std::thread::JoinHandle<()>,
}

/// A store handle's end of the writer. When the last one drops, the queue closes and
/// the writer finishes what was queued, closes its connection and ends.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    queue: mpsc::Sender<Pending>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer thread and opens its connection. `pool`'s closing stops the
    /// writes too.
    pub(crate) async fn start(
        target: Target,
        pool: SqlitePool,
        clock: SharedClock,
        sql: Arc<Statements>,
        config: WriterConfig,
    ) -> Result<Writer, Box<dyn std::error::Error + Send + Sync>> {
        let (queue, rx) = mpsc::channel(config.queue.max(1));
        let counters = Arc::new(Counters::default());
        let (opened_tx, opened) = oneshot::channel();
        let mut task = Task {
            queue: rx,
            conn: None,
            checkpoints: None,
            closing: None,
            target,
            pool,
            clock,
            sql,
            max_batch: config.max_batch.max(1),
            counters: counters.clone(),
        };
        std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || match task.open() {
                Ok(()) => {
                    if opened_tx.send(Ok(())).is_ok() {
                        task.run();
                    }
                }
                Err(e) => {
                    opened_tx.send(Err(e)).ok();
                }
            })?;
        opened.await.map_err(|_| WriterStopped)??;
        Ok(Writer { queue, counters })
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

    /// Ends the writer once everything queued before this call is written: it stops
    /// the checkpoint thread and closes its connections. Later operations fail with
    /// `Unavailable`. Closing again does nothing.
    pub(crate) async fn close(&self) {
        // A writer already stopped has nothing left to close.
        self.submit(Op::Close).await.ok();
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
    conn: Option<rusqlite::Connection>,
    /// The checkpoint thread; `None` when the writer checkpoints for itself.
    checkpoints: Option<Checkpoints>,
    /// A close taken from the queue, answered once the batch before it is written.
    closing: Option<Reply>,
    target: Target,
    pool: SqlitePool,
    clock: SharedClock,
    sql: Arc<Statements>,
    max_batch: usize,
    counters: Arc<Counters>,
}

impl Task {
    /// Opens the writer's connection, and the checkpoint thread's.
    fn open(&mut self) -> rusqlite::Result<()> {
        let conn = self.target.open()?;
        self.start_checkpoints();
        self.self_checkpoint(&conn)?;
        self.conn = Some(conn);
        Ok(())
    }

    /// Hands checkpoints to a thread of their own, if the database has a WAL and that
    /// thread can open its connection.
    fn start_checkpoints(&mut self) {
        if !self.target.wal() {
            return;
        }
        let Ok(conn) = self.target.open() else {
            return;
        };
        let (nudge, nudges) = std::sync::mpsc::sync_channel(1);
        let finish = Arc::new(AtomicBool::new(false));
        let theirs = finish.clone();
        let started = std::thread::Builder::new()
            .name("idem-sqlite-checkpoint".into())
            .spawn(move || checkpoint(conn, nudges, theirs));
        if let Ok(thread) = started {
            self.checkpoints = Some(Checkpoints {
                nudge,
                finish,
                thread,
            });
        }
    }

    /// Sets whether the writer's own commits checkpoint.
    fn self_checkpoint(&self, conn: &rusqlite::Connection) -> rusqlite::Result<()> {
        let pages = if self.checkpoints.is_some() {
            0
        } else {
            AUTOCHECKPOINT_PAGES
        };
        conn.pragma_update(None, "wal_autocheckpoint", pages)
    }

    /// After a commit: lets the checkpoint thread know, or takes checkpoints back if
    /// it has stopped.
    fn committed(&mut self, conn: &rusqlite::Connection) {
        if let Some(checkpoints) = &self.checkpoints
            && let Err(std::sync::mpsc::TrySendError::Disconnected(())) =
                checkpoints.nudge.try_send(())
        {
            self.checkpoints = None;
            self.self_checkpoint(conn).ok();
        }
    }

    fn run(mut self) {
        let mut batch = Vec::with_capacity(self.max_batch);
        // Ends when every store handle (every sender) is gone and the queue is empty,
        // or on close.
        while let Some(first) = self.queue.blocking_recv() {
            self.take(first, &mut batch);
            self.fill(&mut batch);
            if !batch.is_empty() {
                self.write(&mut batch);
            }
            debug_assert!(batch.is_empty());
            if let Some(reply) = self.closing.take() {
                self.close(reply);
                return;
            }
        }
    }

    /// Adds `p` to the batch, or keeps it aside if it closes the writer.
    fn take(&mut self, p: Pending, batch: &mut Vec<Pending>) {
        match p.op {
            Op::Close => self.closing = Some(p.reply),
            _ => batch.push(p),
        }
    }

    /// Takes what is queued now, up to the batch bound and not past a close, without
    /// waiting.
    fn fill(&mut self, batch: &mut Vec<Pending>) {
        while batch.len() < self.max_batch && self.closing.is_none() {
            match self.queue.try_recv() {
                Ok(p) => self.take(p, batch),
                Err(_) => break,
            }
        }
    }

    /// Stops the checkpoint thread and closes both connections, the writer's last: the
    /// database's last connection to close copies the WAL into the file and deletes
    /// it, so the file alone holds every record. Operations queued after the close fail
    /// when this task, and with it the queue, is dropped.
    fn close(&mut self, reply: Reply) {
        if let Some(Checkpoints { nudge, thread, .. }) = self.checkpoints.take() {
            drop(nudge);
            thread.join().ok();
        }
        if let Some(conn) = self.conn.take()
            && let Err((_, e)) = conn.close()
        {
            tracing::warn!(error = %e, "closing the idempotency store's writer connection failed");
        }
        reply.send(Ok(Done::Unit)).ok();
    }

    /// Runs `batch` in one transaction and answers every operation in it.
    fn write(&mut self, batch: &mut Vec<Pending>) {
        let conn = match self.begin() {
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
            match execute(&conn, &self.sql, &*self.clock, op) {
                Ok(result) => answers.push((reply, result)),
                // SQLite undid just the failed statement: only this operation fails.
                Err(e) if !conn.is_autocommit() => answers.push((reply, Err(store_error(e)))),
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
            None => run_cached(&conn, "COMMIT").map_err(|e| (None, "commit", e)),
        };
        match committed {
            Ok(()) => {
                self.committed(&conn);
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
                // A failed COMMIT leaves the transaction open: roll it back and keep the
                // connection. If even that fails, its state is unknown: open a new one.
                if conn.is_autocommit() || conn.execute_batch("ROLLBACK").is_ok() {
                    self.conn = Some(conn);
                }
                let replies = answers
                    .into_iter()
                    .map(|(reply, _)| reply)
                    .chain(failed)
                    .chain(unrun);
                self.fail(replies, stage, e.into());
            }
        }
    }

    /// The connection, inside a new `BEGIN IMMEDIATE` transaction.
    fn begin(&mut self) -> Result<rusqlite::Connection, Box<dyn std::error::Error + Send + Sync>> {
        // Closing the pool closes the store: writes fail as reads do.
        if self.pool.is_closed() {
            self.conn = None;
            return Err(StoreClosed.into());
        }
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                let conn = self.target.open()?;
                self.self_checkpoint(&conn)?;
                conn
            }
        };
        // The checkpoint thread's round is over: copy the frames written since, with
        // nothing writing alongside, so that this transaction starts the WAL over.
        if let Some(checkpoints) = &self.checkpoints
            && checkpoints.finish.swap(false, Ordering::Acquire)
            && let Err(e) = passive_checkpoint(&conn)
        {
            tracing::debug!(error = %e, "finishing the idempotency store's checkpoint failed");
        }
        // On failure (the lock stayed busy past busy_timeout, or the connection broke)
        // the connection is dropped; the next batch opens a new one.
        run_cached(&conn, "BEGIN IMMEDIATE")?;
        Ok(conn)
    }

    fn fail(
        &self,
        replies: impl IntoIterator<Item = Reply>,
        stage: &'static str,
        e: Box<dyn std::error::Error + Send + Sync>,
    ) {
        self.counters.failed_batches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(stage, error = %e, "idempotency record writes were not committed");
        let source: Arc<dyn std::error::Error + Send + Sync> = Arc::from(e);
        for reply in replies {
            let e = BatchFailed {
                stage,
                source: source.clone(),
            };
            reply.send(Err(StoreError::unavailable(e))).ok();
        }
    }
}

/// Maps an error of the writer's connection: a value this store never writes is a
/// corrupt record, anything else means the database cannot serve now.
fn store_error(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(other),
    }
}

/// Runs one operation. The outer error is a statement that failed (which may have
/// ended the transaction); the inner result is the operation's answer.
/// Runs a statement that returns no rows, such as `BEGIN IMMEDIATE` and `COMMIT`, from
/// the connection's statement cache. They run once per batch; parsing them afresh each
/// time was 4 % of the writer's instructions at four operations per batch.
fn run_cached(conn: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

fn execute(
    conn: &rusqlite::Connection,
    sql: &Statements,
    clock: &dyn Clock,
    op: Op,
) -> rusqlite::Result<idem_core::Result<Done>> {
    Ok(match op {
        Op::Reserve(req) => reserve(conn, sql, clock, &req)?.map(Done::Reserved),
        Op::Complete(lease, status, headers, body) => {
            complete(conn, sql, clock, &lease, status, &headers, &body)?.map(|()| Done::Unit)
        }
        Op::Renew(lease, lease_for) => {
            let until = clock.now().plus(lease_for);
            fenced(conn, &sql.renew, clock, &lease, Some(until.as_millis()))?.map(|()| Done::Unit)
        }
        Op::Release(lease) => fenced(conn, &sql.release, clock, &lease, None)?.map(|()| Done::Unit),
        Op::Remove(scope) => {
            let n = conn.prepare_cached(&sql.remove)?.execute(params![
                scope.tenant().as_str(),
                scope.endpoint_str(),
                scope.key().as_str(),
            ])?;
            Ok(Done::Removed(n > 0))
        }
        Op::Close => unreachable!("a close is kept out of batches"),
        Op::Purge(limit) => {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let n = conn
                .prepare_cached(&sql.purge)?
                .execute(params![clock.now().as_millis(), limit])?;
            Ok(Done::Purged(n))
        }
    })
}

/// The one-statement reserve; when it writes nothing, the row it met says the answer.
fn reserve(
    conn: &rusqlite::Connection,
    sql: &Statements,
    clock: &dyn Clock,
    req: &ReserveRequest,
) -> rusqlite::Result<idem_core::Result<Reservation>> {
    let scope = &req.scope;
    let (tenant, endpoint, key) = (
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    );
    let mut fresh = true;
    loop {
        let now = clock.now();
        let token = FencingToken::generate();
        let lease_until = now.plus(req.lease);
        let (now_ms, expires_ms, lease_ms) = (
            now.as_millis(),
            req.expires_at(now).as_millis(),
            lease_until.as_millis(),
        );
        // The parameters of both `insert` and `reserve`.
        let values = params![
            tenant,
            endpoint,
            key,
            &req.fingerprint.as_bytes()[..],
            now_ms,
            expires_ms,
            token.as_i64(),
            lease_ms,
        ];
        // First as a plain insert, which only a fresh key passes; the writer holds the
        // write lock, so the row the insert met is still there for the upsert.
        if std::mem::take(&mut fresh) && conn.prepare_cached(&sql.insert)?.execute(values)? == 1 {
            return Ok(Ok(Reservation::Acquired(Lease {
                scope: scope.clone(),
                token,
                attempt: 1,
                ttl: req.ttl,
            })));
        }
        let attempt: Option<i64> = conn
            .prepare_cached(&sql.reserve)?
            .query_row(values, |row| row.get(0))
            .optional()?;
        if let Some(attempt) = attempt {
            return Ok(match u32::try_from(attempt) {
                Ok(attempt) => Ok(Reservation::Acquired(Lease {
                    scope: scope.clone(),
                    token,
                    attempt,
                    ttl: req.ttl,
                })),
                Err(_) => Err(corrupt("attempt")),
            });
        }
        // A live record this caller may not take: read it to learn which answer
        // applies. If the clock moved so that it may now be taken (expired, lease
        // lapsed), go round and try the atomic write again.
        let row = conn
            .prepare_cached(&sql.select)?
            .query_row(params![tenant, endpoint, key], stored_row)
            .optional()?;
        let existing = match row.map(|row| row.into_record(scope)).transpose() {
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

fn stored_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredRow> {
    Ok(StoredRow {
        fingerprint: row.get(0)?,
        created_at: row.get(1)?,
        expires_at: row.get(2)?,
        attempt: row.get(3)?,
        token: row.get(4)?,
        state: row.get(5)?,
        lease_until: row.get(6)?,
        status: row.get(7)?,
        headers: row.get(8)?,
        body: row.get(9)?,
        completed_at: row.get(10)?,
    })
}

/// Records the response, fenced; the same statements as
/// [`complete_in`](crate::SqliteStore::complete_in) runs in the caller's transaction.
fn complete(
    conn: &rusqlite::Connection,
    sql: &Statements,
    clock: &dyn Clock,
    lease: &Lease,
    status: u16,
    headers: &[u8],
    body: &[u8],
) -> rusqlite::Result<idem_core::Result<()>> {
    let now = clock.now().as_millis();
    let scope = &lease.scope;
    let (tenant, endpoint, key) = (
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    );
    let changed = conn.prepare_cached(&sql.complete)?.execute(params![
        tenant,
        endpoint,
        key,
        lease.token.as_i64(),
        now,
        i64::from(status),
        headers,
        body,
        duration_millis(lease.ttl),
    ])?;
    if changed == 1 {
        return Ok(Ok(()));
    }
    // No in-progress record under this token. Completed by this very attempt is
    // success (the first response stays); anything else is fenced.
    let completed = conn
        .prepare_cached(&sql.completed_by)?
        .query_row(
            params![tenant, endpoint, key, lease.token.as_i64(), now],
            |_| Ok(()),
        )
        .optional()?;
    Ok(match completed {
        Some(()) => Ok(()),
        None => Err(StoreError::Fenced),
    })
}

/// A fenced single-statement write; no row changed means fenced.
fn fenced(
    conn: &rusqlite::Connection,
    sql: &str,
    clock: &dyn Clock,
    lease: &Lease,
    extra: Option<i64>,
) -> rusqlite::Result<idem_core::Result<()>> {
    let scope = &lease.scope;
    let mut stmt = conn.prepare_cached(sql)?;
    let (tenant, endpoint, key) = (
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    );
    let (token, now) = (lease.token.as_i64(), clock.now().as_millis());
    let changed = match extra {
        Some(v) => stmt.execute(params![tenant, endpoint, key, token, now, v])?,
        None => stmt.execute(params![tenant, endpoint, key, token, now])?,
    };
    Ok(if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    })
}
