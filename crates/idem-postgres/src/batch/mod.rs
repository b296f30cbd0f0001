//! Shared commits: the reserves, completions and releases of a [`PgStore`](crate::PgStore) that queue
//! while others are being written go to PostgreSQL together, one statement (and so one
//! synced commit) per kind of operation for the whole batch.
//!
//! Without it every keyed request pays two commits of its own, a reserve and a
//! completion, each a WAL flush and a round trip; one server then caps every gateway
//! that shares it at its rate of commits. With it, the commits are shared by as many
//! requests as queued meanwhile.
//!
//! - **No added latency when idle.** An operation is queued and, if fewer than the
//!   configured number of batches are being written, a drainer starts at once: a lone
//!   operation is written alone, straight away, in one statement as before. Only what
//!   queues while every drainer is busy waits, and it goes in the next batch.
//! - **A drainer lingers a moment.** One whose queue ran empty keeps its connection
//!   for 2 ms and is woken by the next operation, so a request's completion and the
//!   next request are written on it with no connection taken from the pool and given
//!   back (which sqlx pings). It does not linger while an operation of the store waits
//!   for a connection, nor on a connection a statement broke.
//! - **Exactly the single-row semantics.** Each batch statement is the single-row
//!   statement over arrays (see `sql.rs`), with at most one member per scope in it; a
//!   second reserve of one scope in the same batch is answered from the row the first
//!   one's statement returned, as a statement run right after it would have been
//!   (`InProgress`, `Mismatch` or `Replay`; never a second `Acquired`). A scope the
//!   statement saw no row for (committed by another writer after its snapshot) is
//!   looked up again by the next statement of the batch, as a single reserve would.
//! - **One bad row never fails its neighbours.** A batch statement that fails in the
//!   database (a constraint, a trigger, a deadlock) rolled back as a whole, so its
//!   members are written again one by one, each in a statement of its own: only the
//!   bad one fails. A connection that breaks mid-statement answers every member of
//!   that statement `Unavailable`, and reserves then release what they may have
//!   written, fenced by their own tokens, as a single reserve does.
//! - **Bounded waits.** An operation that no drainer has taken within the pool's
//!   acquire timeout gives up (`Unavailable`, certainly not written), as one waiting for
//!   a connection does; once taken, the store's operation timeout bounds it. A caller
//!   that gives up before its operation is taken is skipped; one whose reserve was
//!   written after it gave up has it released.
//!
//! Renewals, reads, removals, purges and [`complete_in`](crate::PgStore::complete_in) (the
//! caller's own transaction) run on their own, as before.
//!
//! The batcher is [`PgStore`](crate::PgStore)'s own write path: the queue is here, and
//! the drain is written as `impl PgStore` blocks in files of their own (`run.rs` the
//! loop and the queueing, `reserve.rs` and `complete.rs` the statements). This file
//! knows nothing of the store, so that the store can hold a [`Batcher`] without the two
//! importing each other.

mod complete;
mod reserve;
mod run;
pub(crate) mod sql;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use idem_core::{FencingToken, Lease, Reservation, ReserveRequest, StoreError, StoreMetric};
use tokio::sync::oneshot;

/// The most operations one batch statement carries, unless configured otherwise.
pub const DEFAULT_MAX_BATCH: usize = 64;

/// What an operation's caller hears: its result, or why not and whether the operation
/// may have been written all the same.
pub(crate) type Answer<T> = Result<T, Failure>;

/// A failed operation.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: StoreError,
    /// The statement was sent and its outcome is unknown (the connection broke, the
    /// reply could not be read).
    pub(crate) may_have_run: bool,
}

impl Failure {
    pub(crate) fn not_written(error: StoreError) -> Failure {
        Failure {
            error,
            may_have_run: false,
        }
    }
}

/// A reserve, with the token its reservation is written under.
pub(crate) struct ReserveOp {
    pub(crate) req: ReserveRequest,
    pub(crate) token: FencingToken,
    pub(crate) reply: oneshot::Sender<Answer<Reservation>>,
}

/// A completion, its response already encoded for the row.
pub(crate) struct CompleteOp {
    pub(crate) lease: Lease,
    pub(crate) status: i32,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: Bytes,
    pub(crate) ambiguity: Option<&'static str>,
    pub(crate) reply: oneshot::Sender<Answer<()>>,
}

impl CompleteOp {
    /// The answer as the single-row statement writes it.
    pub(crate) fn row_answer(&self) -> crate::statements::RowAnswer<'_> {
        crate::statements::RowAnswer {
            status: self.status,
            headers: &self.headers,
            body: &self.body,
            ambiguity: self.ambiguity,
        }
    }
}

/// A release.
pub(crate) struct ReleaseOp {
    pub(crate) lease: Lease,
    pub(crate) reply: oneshot::Sender<Answer<()>>,
}

/// One queued operation.
pub(crate) enum Op {
    Reserve(ReserveOp),
    Complete(CompleteOp),
    Release(ReleaseOp),
}

impl Op {
    /// Whether its caller stopped waiting for the answer.
    fn abandoned(&self) -> bool {
        match self {
            Op::Reserve(op) => op.reply.is_closed(),
            Op::Complete(op) => op.reply.is_closed(),
            Op::Release(op) => op.reply.is_closed(),
        }
    }
}

/// How a store batches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchConfig {
    /// The most operations in one batch.
    pub(crate) max_batch: usize,
    /// The most batches written at once, each on a connection of its own.
    pub(crate) in_flight: usize,
}

/// Counters of a store's batching, since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchStats {
    /// Batches written: each is one statement, one round trip and one commit per kind
    /// of operation in it.
    pub batches: u64,
    /// Statements the batches sent (round trips, commits): the batch statements, their
    /// second looks, and the single-row statements of batches written again one by one.
    pub statements: u64,
    /// Operations answered.
    pub operations: u64,
    /// The most operations one batch held.
    pub largest_batch: u64,
    /// Batch statements that failed in the database and whose members were written
    /// again one by one.
    pub split_batches: u64,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    statements: AtomicU64,
    operations: AtomicU64,
    largest_batch: AtomicU64,
    split_batches: AtomicU64,
}

/// A store's queue and its drainers' count.
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    /// Wakes a lingering drainer for an operation.
    wake: tokio::sync::Notify,
    config: BatchConfig,
    counters: Counters,
    sql: sql::BatchStatements,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<(u64, Op)>,
    /// Drainers running, lingering ones included.
    running: usize,
    /// Drainers lingering: the queue was empty, and each waits a moment on its
    /// connection for more before it stops.
    lingering: usize,
    /// Lingering drainers no operation has claimed yet; `lingering - idle` have been
    /// woken for an operation and have yet to take it.
    idle: usize,
    next_id: u64,
}

/// What a drainer that found the queue empty does.
pub(crate) enum Empty {
    /// Something was queued meanwhile: take again.
    TakeAgain,
    /// Wait a moment for more ([`Batcher::woken`] then says what next).
    Linger,
    /// Stop (no longer counted).
    Stop,
}

impl Batcher {
    pub(crate) fn new(config: BatchConfig, table: &str) -> Batcher {
        Batcher {
            sql: sql::BatchStatements::for_table(table),
            queue: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            config: BatchConfig {
                max_batch: config.max_batch.max(1),
                in_flight: config.in_flight.max(1),
            },
            counters: Counters::default(),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // The lock guards queue operations that cannot panic half-way.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `op`; its id, and whether a drainer should start for it. A lingering
    /// drainer is woken for it rather than a new one started.
    fn push(&self, op: Op) -> (u64, bool) {
        let mut q = self.queue();
        let id = q.next_id;
        q.next_id += 1;
        q.pending.push_back((id, op));
        if q.idle > 0 {
            q.idle -= 1;
            drop(q);
            self.wake.notify_one();
            return (id, false);
        }
        let start = q.running < self.config.in_flight;
        if start {
            q.running += 1;
        }
        (id, start)
    }

    /// Takes operation `id` back if no drainer has taken it yet.
    fn withdraw(&self, id: u64) -> bool {
        let mut q = self.queue();
        match q.pending.iter().position(|(i, _)| *i == id) {
            Some(at) => {
                q.pending.remove(at);
                true
            }
            None => false,
        }
    }

    /// The next batch for a drainer: what is queued, up to the most a batch holds, less
    /// the operations whose callers stopped waiting. Empty, the drainer calls
    /// [`empty`](Self::empty).
    fn take(&self) -> Vec<Op> {
        let mut q = self.queue();
        let mut batch = Vec::with_capacity(q.pending.len().min(self.config.max_batch));
        while batch.len() < self.config.max_batch {
            let Some((_, op)) = q.pending.pop_front() else {
                break;
            };
            if !op.abandoned() {
                batch.push(op);
            }
        }
        batch
    }

    /// A drainer found the queue empty; `linger` says whether it may wait for more (it
    /// holds a sound connection nobody else waits for).
    fn empty(&self, linger: bool) -> Empty {
        let mut q = self.queue();
        if !q.pending.is_empty() {
            Empty::TakeAgain
        } else if linger {
            q.lingering += 1;
            q.idle += 1;
            Empty::Linger
        } else {
            q.running -= 1;
            Empty::Stop
        }
    }

    /// Waits, lingering, until an operation wakes this drainer or `linger` passes;
    /// whether to take again (else the drainer stops, no longer counted).
    async fn woken(&self, linger: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + linger;
        loop {
            let timed_out = tokio::time::timeout_at(deadline, self.wake.notified())
                .await
                .is_err();
            let mut q = self.queue();
            // Lingering drainers are alike: any one of them may answer a claim.
            if q.lingering > q.idle {
                q.lingering -= 1;
                return true;
            }
            if timed_out {
                q.lingering -= 1;
                q.idle -= 1;
                q.running -= 1;
                return false;
            }
            // A wake-up left over from a claim another drainer answered.
        }
    }

    fn count_batch(&self, size: usize) {
        let c = &self.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.operations.fetch_add(size as u64, Ordering::Relaxed);
        c.largest_batch.fetch_max(size as u64, Ordering::Relaxed);
    }

    fn count_statement(&self) {
        self.counters.statements.fetch_add(1, Ordering::Relaxed);
    }

    fn count_split(&self) {
        self.counters.split_batches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> BatchStats {
        let c = &self.counters;
        BatchStats {
            batches: c.batches.load(Ordering::Relaxed),
            statements: c.statements.load(Ordering::Relaxed),
            operations: c.operations.load(Ordering::Relaxed),
            largest_batch: c.largest_batch.load(Ordering::Relaxed),
            split_batches: c.split_batches.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn metrics(&self) -> Vec<StoreMetric> {
        let s = self.stats();
        vec![
            StoreMetric::counter(
                "idem_postgres_batches_total",
                "Batches of reserves, completions and releases written together, one \
                 statement and one commit per kind of operation.",
                s.batches,
            ),
            StoreMetric::counter(
                "idem_postgres_batch_statements_total",
                "Statements (round trips, commits) the batches sent.",
                s.statements,
            ),
            StoreMetric::counter(
                "idem_postgres_batched_operations_total",
                "Reserves, completions and releases answered from batches.",
                s.operations,
            ),
            StoreMetric::gauge(
                "idem_postgres_largest_batch",
                "The most operations one batch held.",
                s.largest_batch,
            ),
            StoreMetric::counter(
                "idem_postgres_split_batches_total",
                "Batch statements that failed in the database and were written again \
                 one operation at a time.",
                s.split_batches,
            ),
            StoreMetric::gauge(
                "idem_postgres_queued_operations",
                "Operations waiting for a batch.",
                self.queue().pending.len() as u64,
            ),
        ]
    }
}

#[cfg(test)]
mod tests;
