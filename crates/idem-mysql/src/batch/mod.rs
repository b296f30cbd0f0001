//! Shared commits: the reserves and completions of a [`MySqlStore`](crate::MySqlStore)
//! that queue while others are being written go to the server together, in one
//! multi-row statement per kind of operation, each its own autocommit: one redo-log
//! write, one round trip and one statement's work shared by the whole batch.
//!
//! Without it every keyed request pays two statements and two commits of its own (and
//! the pool's ping of each connection given back), which caps every gateway that shares
//! a server at the server's rate of commits and statements.
//!
//! - **No added latency when idle.** An operation is queued and, if fewer than the
//!   configured number of batches are being written, a drainer starts for it at once:
//!   a lone operation is written alone, straight away. Only what queues while every
//!   drainer is busy waits, and goes in the next batch.
//! - **A drainer keeps its connection while batches keep coming**, and a moment after
//!   (`run::LINGER`), so that a request's completion and the next request are written
//!   with no connection taken from the pool and given back (which sqlx pings).
//! - **A reserve batch** is one `INSERT IGNORE` of every scope's fresh record, in the
//!   scopes' primary-key order (the same in every batch, so that two batches lock what
//!   they share in one order), which inserts what is absent and passes over what is
//!   there; where it inserted fewer rows than it carried, one plain read of the batch's
//!   rows, which tells each member's own insert (its fencing token) from a record that
//!   was there, which [`Reservation::from_existing`] interprets. A record that may be
//!   taken over is taken over by the single-row statement, fenced as before. Neither
//!   statement takes a lock past its own end; `IGNORE` passes over duplicate keys only,
//!   since every other error it would turn into a warning (a value too long for its
//!   column) is ruled out before the batch is written.
//! - **A completion batch** is one `UPDATE` joined to the batch's rows, fenced row by
//!   row as the single-row completion; where it matched fewer rows than it carried, one
//!   read tells completed from fenced.
//! - **A failed batch never fails its members.** A batch statement the server refused
//!   (a deadlock, a lock wait timeout, anything) rolled back as a whole, so its members
//!   are written again one by one through the single-row path, whose retries and fences
//!   are the store's own: a deadlock is retried, never answered as an outcome. A
//!   connection that broke mid-statement answers its members `Unavailable`, and
//!   reserves then release what they may have written, fenced by their own tokens, as a
//!   single reserve does.
//! - **Bounded waits.** An operation no drainer has taken within the pool's acquire
//!   timeout gives up, certainly not written; once taken, the store's operation timeout
//!   bounds it.
//!
//! Renewals, releases, reads, purges and [`complete_in`](crate::MySqlStore::complete_in)
//! (the caller's own transaction) run on their own, as before.

mod complete;
mod reserve;
mod run;
pub(crate) mod sql;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use idem_core::StoredResponse;
use idem_core::{FencingToken, Lease, Reservation, ReserveRequest, StoreError, StoreMetric};
use tokio::sync::oneshot;

/// The most operations one batch statement carries, unless configured otherwise.
pub const DEFAULT_MAX_BATCH: usize = 64;

/// The most a store lets one batch carry, whatever it is told: each size up to it is a
/// prepared statement on every connection that wrote one.
pub(crate) const MOST_BATCH: usize = 256;

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

/// A completion.
pub(crate) struct CompleteOp {
    pub(crate) lease: Lease,
    pub(crate) response: StoredResponse,
    pub(crate) reply: oneshot::Sender<Answer<()>>,
}

/// One queued operation.
pub(crate) enum Op {
    Reserve(ReserveOp),
    Complete(CompleteOp),
}

impl Op {
    /// Whether its caller stopped waiting for the answer.
    fn abandoned(&self) -> bool {
        match self {
            Op::Reserve(op) => op.reply.is_closed(),
            Op::Complete(op) => op.reply.is_closed(),
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
    /// Batches written.
    pub batches: u64,
    /// Statements the batches sent (round trips): the batch statements, their reads,
    /// and the takeovers of records that could be taken over.
    pub statements: u64,
    /// Operations answered from batches.
    pub operations: u64,
    /// The most operations one batch held.
    pub largest_batch: u64,
    /// Batch statements the server refused, whose members were written again one by
    /// one.
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

/// A store's queue, its drainers' count and its batch statements.
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
    /// Drainers lingering: their queue ran empty, and each waits a moment on its
    /// connection for more before it stops.
    lingering: usize,
    /// Lingering drainers no operation has claimed yet.
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
        let max_batch = config.max_batch.clamp(1, MOST_BATCH);
        Batcher {
            sql: sql::BatchStatements::for_table(table, max_batch),
            queue: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            config: BatchConfig {
                max_batch,
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

    /// The next batch: what is queued, up to the most a batch holds, less the
    /// operations whose callers stopped waiting.
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
    /// holds a sound connection).
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
                "idem_mysql_batches_total",
                "Batches of reserves and completions written together, one statement \
                 and one commit per kind of operation.",
                s.batches,
            ),
            StoreMetric::counter(
                "idem_mysql_batch_statements_total",
                "Statements (round trips) the batches sent.",
                s.statements,
            ),
            StoreMetric::counter(
                "idem_mysql_batched_operations_total",
                "Reserves and completions answered from batches.",
                s.operations,
            ),
            StoreMetric::gauge(
                "idem_mysql_largest_batch",
                "The most operations one batch held.",
                s.largest_batch,
            ),
            StoreMetric::counter(
                "idem_mysql_split_batches_total",
                "Batch statements the server refused, whose operations were written \
                 again one at a time.",
                s.split_batches,
            ),
            StoreMetric::gauge(
                "idem_mysql_queued_operations",
                "Operations waiting for a batch.",
                self.queue().pending.len() as u64,
            ),
        ]
    }
}
