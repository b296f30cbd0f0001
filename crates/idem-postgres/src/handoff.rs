//! [`Handoff`]: passes a connection that just finished an operation straight to an
//! operation waiting for one, instead of through the pool.
//!
//! sqlx pings every connection given back to its pool (a `Sync` and its
//! `ReadyForQuery`) before another task may have it: one extra round trip, and two
//! wake-ups on each side, per statement. When the store's operations hold as many
//! connections as the pool has, a new operation queues here instead of in the pool, and
//! a connection whose statement finished cleanly is handed to the oldest one as it is.
//!
//! What the ping guards against cannot happen on this path: a connection is handed on
//! only by an operation that ran to the end (its future was not dropped mid-statement)
//! and succeeded; anything else drops it, and sqlx checks it as it checks any. sqlx drains any
//! unread reply of the last statement before the next one runs.
//!
//! The pool stays in charge. The store's operations hold at most as many connections
//! as the pool's size, counted in [`Slot`]s: an operation that gets a slot acquires
//! from the pool as usual, and one that does not waits here. A connection goes back to
//! the pool after [`HANDOFFS`] operations in a row, or as soon as nobody here waits;
//! its slot then passes to the oldest waiting operation, which acquires from the pool,
//! behind whoever else waits there (an application sharing the pool, say). An
//! operation waiting here is never also waiting in the pool: an acquire abandoned
//! half-way could drop a connection sqlx was opening for it, and with many such
//! operations the pool kept opening connections and throwing them away.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use idem_core::StoreError;
use sqlx::PgPool;
use sqlx::pool::PoolConnection;
use sqlx::postgres::Postgres;
use tokio::sync::oneshot;

use crate::error::store_error;

/// Operations a connection serves, handed from one to the next, before it goes back to
/// the pool.
const HANDOFFS: u32 = 8;

/// Hands connections between the operations of one store (and its clones).
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    state: Mutex<State>,
    handed: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Slots taken: connections held by operations, or being acquired for them.
    taken: u32,
    /// Operations waiting for a slot or a connection, oldest first. Some may have given
    /// up (their receiver is gone); they are skipped.
    waiting: VecDeque<oneshot::Sender<Grant>>,
}

/// What a waiting operation is given.
#[derive(Debug)]
enum Grant {
    /// A connection, straight from the operation that used it last.
    Handed(Conn),
    /// A slot: acquire from the pool.
    Slot(Slot),
}

/// The right to hold one of the pool's connections. Dropped, it passes to the oldest
/// waiting operation, or frees up.
pub(crate) struct Slot {
    /// `None` once passed on.
    handoff: Option<Arc<Handoff>>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the handoff it points back to, which lists its waiters' slots.
        f.write_str("Slot")
    }
}

impl Slot {
    fn new(handoff: &Arc<Handoff>) -> Slot {
        Slot {
            handoff: Some(handoff.clone()),
        }
    }
}

/// A pooled connection held by an operation, with its slot.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) conn: PoolConnection<Postgres>,
    /// Operations served since it left the pool.
    served: u32,
    _slot: Slot,
}

impl Handoff {
    /// A connection for one operation: from the pool when the store's operations hold
    /// fewer connections than it has, otherwise from the operation that finishes next.
    /// Waiting here and then in the pool takes no longer than the pool's acquire
    /// timeout in all, as waiting in the pool alone did.
    pub(crate) async fn acquire(self: &Arc<Self>, pool: &PgPool) -> Result<Conn, StoreError> {
        let options = pool.options();
        let max = options.get_max_connections();
        let deadline = tokio::time::Instant::now() + options.get_acquire_timeout();
        let waiting = {
            let mut state = self.state();
            if state.taken < max {
                state.taken += 1;
                None
            } else {
                // Operations that gave up waiting left their senders; those at the
                // front go now, the rest as they come to it.
                while state
                    .waiting
                    .front()
                    .is_some_and(oneshot::Sender::is_closed)
                {
                    state.waiting.pop_front();
                }
                let (tx, rx) = oneshot::channel();
                state.waiting.push_back(tx);
                Some(rx)
            }
        };
        let slot = match waiting {
            None => Slot::new(self),
            // The timer is only armed if nothing is handed over at the first poll.
            Some(rx) => match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(Grant::Handed(conn))) => return Ok(conn),
                Ok(Ok(Grant::Slot(slot))) => slot,
                // Only a dropped `Handoff` drops a waiter unanswered.
                Ok(Err(_)) => return Err(StoreError::unavailable("the store was dropped")),
                Err(_) => return Err(timed_out()),
            },
        };
        // Dropping `slot` on failure passes it on. sqlx's acquire is a 4 KiB future:
        // boxed, it is written once, not copied into each future that awaits this one.
        let conn = match tokio::time::timeout_at(deadline, Box::pin(pool.acquire())).await {
            Ok(acquired) => acquired.map_err(store_error)?,
            Err(_) => return Err(timed_out()),
        };
        Ok(Conn {
            conn,
            served: 0,
            _slot: slot,
        })
    }

    /// Hands `conn`, whose operation ran to the end and succeeded, to the oldest waiting
    /// operation. With nobody waiting, or once it has served [`HANDOFFS`] operations, it
    /// goes back to the pool (and its slot to whoever waits).
    pub(crate) fn release(&self, mut conn: Conn) {
        conn.served += 1;
        if conn.served >= HANDOFFS {
            return;
        }
        let mut grant = Grant::Handed(conn);
        loop {
            // Popped in a statement of its own, so that the lock is not held while
            // sending.
            let next = self.state().waiting.pop_front();
            let Some(waiter) = next else {
                break;
            };
            match waiter.send(grant) {
                Ok(()) => {
                    self.handed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // That operation gave up waiting.
                Err(back) => grant = back,
            }
        }
        // Dropped outside the lock: the slot takes it again.
    }

    /// Whether an operation waits here for a connection (one that gave up waiting may
    /// still be counted).
    pub(crate) fn has_waiters(&self) -> bool {
        !self.state().waiting.is_empty()
    }

    /// Connections handed from one operation to the next so far.
    pub(crate) fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The lock guards counts and queue operations that cannot panic half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What an operation that waited out the acquire timeout fails with, in sqlx's words.
fn timed_out() -> StoreError {
    store_error(sqlx::Error::PoolTimedOut)
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(handoff) = self.handoff.take() else {
            return;
        };
        loop {
            let waiter = {
                let mut state = handoff.state();
                match state.waiting.pop_front() {
                    Some(waiter) => waiter,
                    None => {
                        state.taken -= 1;
                        return;
                    }
                }
            };
            match waiter.send(Grant::Slot(Slot::new(&handoff))) {
                Ok(()) => return,
                // That operation gave up waiting: try the next, emptying the returned
                // slot first so that dropping it does not land here again.
                Err(Grant::Slot(mut slot)) => drop(slot.handoff.take()),
                Err(Grant::Handed(_)) => unreachable!("a slot was sent"),
            }
        }
    }
}
