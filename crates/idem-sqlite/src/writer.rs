//! The writer: every write of a [`SqliteStore`](crate::SqliteStore) goes through one
//! connection owned by one thread, which commits the operations queued meanwhile in one
//! transaction (group commit).
//!
//! SQLite admits one writer at a time. Were every pooled connection to write on its
//! own, those that lost the race for the lock would sleep in SQLite's busy handler (1,
//! 2, 5, … up to 100 ms between tries) while the lock sat free, and throughput would
//! fall as concurrency rose. One writer never waits for itself, and a batch writes each page it
//! touches to the WAL once per batch instead of once per operation.
//!
//! The writer drives its connection synchronously (rusqlite, linked to the same SQLite
//! as sqlx) on a thread of its own: through sqlx every statement is a round trip to the
//! connection's worker thread, two thread wake-ups that cost more than SQLite's work on
//! a small row. Here a batch costs one wake-up to start and one per caller answered.
//!
//! What each operation may rely on is what a statement of its own would give:
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
//! The writer does not checkpoint the WAL itself while a thread beside it does (see
//! `connection.rs`); each write's statements are in `write.rs`.
//!
//! Other writers on the same file (another process's store, the application's own
//! transactions such as [`complete_in`](crate::SqliteStore::complete_in)) contend with
//! this one for SQLite's lock, and the writer waits out `busy_timeout` for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use idem_core::{SharedClock, StoreError};
use sqlx::sqlite::SqlitePool;
use tokio::sync::{mpsc, oneshot};

use crate::connection::{Checkpoints, Target, checkpoint, passive_checkpoint};
use crate::schema::Statements;
use crate::write::{Done, Op, execute, run_cached, store_error};

/// Operations per transaction, at most, unless configured otherwise.
pub const DEFAULT_WRITE_BATCH: usize = 128;

/// Operations that may wait for the writer before callers wait to queue, unless
/// configured otherwise.
pub const DEFAULT_WRITE_QUEUE: usize = 1024;

/// WAL pages after which a writer that checkpoints for itself does so (SQLite's default).
const AUTOCHECKPOINT_PAGES: i64 = 1000;

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
