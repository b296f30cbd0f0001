//! The drainer: takes batches off the queue and writes each as one statement per kind
//! of operation, on a connection it keeps while batches keep coming.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::oneshot;

use idem_core::{Reservation, Scope, StoreError, release_unconfirmed_with};
use sqlx::PgConnection;

use super::{Answer, Batcher, Empty, Failure, Op, ReserveOp};
use crate::error::ServerError;
use crate::handoff::Conn;
use crate::store::PgStore;

/// How long a drainer whose queue ran empty keeps its connection and waits for the
/// next operation before it stops. A request's completion follows its reservation by
/// the upstream's answer time, and a client's next request follows that: a drainer
/// still there writes them with no connection taken from the pool, and so none given
/// back (sqlx pings each one it gets back, a round trip and a spawned task), nor a
/// drainer spawned. Short, so that a connection held for nothing returns soon.
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Batches a drainer writes on one connection before it hands the connection on (to
/// an operation waiting for one, or back to the pool), so that others sharing the pool
/// get their turn.
const BATCHES_PER_CONNECTION: u32 = 8;

/// Whether a statement that failed with `e` left its connection fit for the next one:
/// only an error the server answered with (the statement rolled back) does.
pub(super) fn survivable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_))
}

/// The same for an error already mapped to a [`StoreError`].
pub(super) fn breaks(e: &StoreError) -> bool {
    match e {
        StoreError::Unavailable(source) => source
            .downcast_ref::<ServerError>()
            .map(ServerError::sqlx)
            .or_else(|| source.downcast_ref::<sqlx::Error>())
            .is_none_or(|e| !survivable(e)),
        _ => false,
    }
}

/// `e` once more, for another member of the batch it failed.
pub(super) fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Fenced => StoreError::Fenced,
        StoreError::Full => StoreError::Full,
        StoreError::Corrupt(what) => StoreError::Corrupt(what.clone()),
        StoreError::Unavailable(source) => StoreError::unavailable(source.to_string()),
        other => StoreError::unavailable(other.to_string()),
    }
}

/// What the members of a batch hear when its connection broke before their statement
/// was sent.
pub(super) fn not_sent() -> Failure {
    Failure::not_written(StoreError::unavailable(
        "the batch's connection to PostgreSQL broke before this operation was sent",
    ))
}

/// For each of `items`, whether it is the first of its scope.
pub(super) fn firsts<T>(items: &[T], scope: impl Fn(&T) -> &Scope) -> Vec<bool> {
    let mut seen = HashSet::with_capacity(items.len());
    items.iter().map(|item| seen.insert(scope(item))).collect()
}

/// `items` split into the first of each scope and the rest.
pub(super) fn first_per_scope<T>(items: Vec<T>, scope: impl Fn(&T) -> &Scope) -> (Vec<T>, Vec<T>) {
    let first = firsts(&items, scope);
    let (mut now, mut later) = (Vec::with_capacity(items.len()), Vec::new());
    for (item, first) in items.into_iter().zip(first) {
        if first {
            now.push(item)
        } else {
            later.push(item)
        }
    }
    (now, later)
}

impl PgStore {
    /// Writes batches until the queue stays empty for [`LINGER`].
    pub(crate) async fn drain(self, batcher: Arc<Batcher>) {
        let mut held: Option<Conn> = None;
        let mut written = 0;
        loop {
            let batch = batcher.take();
            if batch.is_empty() {
                let linger = held.is_some() && !self.handoff.has_waiters();
                match batcher.empty(linger) {
                    Empty::TakeAgain => continue,
                    Empty::Stop => break,
                    Empty::Linger if batcher.woken(LINGER).await => continue,
                    Empty::Linger => break,
                }
            }
            let mut conn = match held.take() {
                Some(conn) => conn,
                None => match self.handoff.acquire(&self.pool).await {
                    Ok(conn) => conn,
                    Err(e) => {
                        fail(batch, &e);
                        continue;
                    }
                },
            };
            batcher.count_batch(batch.len());
            // Dropped mid-statement by the timeout, the batch's members hear nothing:
            // their callers answer `Unavailable` and release what they may have written.
            let kept = tokio::time::timeout(
                self.operation_timeout,
                self.write(&batcher, &mut conn.conn, batch),
            )
            .await
            .unwrap_or(false);
            written += 1;
            if !kept {
                written = 0;
            } else if written < BATCHES_PER_CONNECTION {
                held = Some(conn);
            } else {
                written = 0;
                self.handoff.release(conn);
            }
        }
        if let Some(conn) = held {
            self.handoff.release(conn);
        }
    }

    /// Writes one batch; whether its connection is still fit for the next.
    async fn write(&self, b: &Batcher, conn: &mut PgConnection, batch: Vec<Op>) -> bool {
        let (mut reserves, mut completes, mut releases) = (Vec::new(), Vec::new(), Vec::new());
        for op in batch {
            match op {
                Op::Reserve(op) => reserves.push(op),
                Op::Complete(op) => completes.push(op),
                Op::Release(op) => releases.push(op),
            }
        }
        // A lone operation of its kind goes in its single-row statement: the same
        // outcome as a batch of one, and PostgreSQL plans it in a fraction of the time
        // it takes to plan a statement over arrays, so an idle store costs what an
        // unbatched one does.
        let mut fit = true;
        if reserves.len() == 1 {
            fit = self.reserves_one_by_one(b, conn, reserves).await;
        } else if !reserves.is_empty() {
            fit = self.reserves(b, conn, reserves).await;
        }
        if !completes.is_empty() {
            if !fit {
                completes
                    .into_iter()
                    .for_each(|op| drop(op.reply.send(Err(not_sent()))));
            } else if completes.len() == 1 {
                fit = self.completes_one_by_one(b, conn, completes).await;
            } else {
                fit = self.completes(b, conn, completes).await;
            }
        }
        if !releases.is_empty() {
            if !fit {
                releases
                    .into_iter()
                    .for_each(|op| drop(op.reply.send(Err(not_sent()))));
            } else if releases.len() == 1 {
                fit = self.releases_one_by_one(b, conn, releases).await;
            } else {
                fit = self.releases(b, conn, releases).await;
            }
        }
        fit
    }

    /// Answers a reserve. A caller that stopped waiting does not hear of a reservation
    /// that was, or may have been, written for it, so it is released here.
    pub(super) fn answer_reserve(&self, op: ReserveOp, answer: Answer<Reservation>) {
        let unheard = match op.reply.send(answer) {
            Ok(()) => return,
            Err(Ok(Reservation::Acquired(lease))) => lease,
            Err(Err(Failure {
                may_have_run: true, ..
            })) => op.req.lease_for(op.token, 1),
            Err(_) => return,
        };
        let store = self.clone();
        release_unconfirmed_with(move || {
            let (store, lease) = (store.clone(), unheard.clone());
            async move {
                store
                    .delete_in_progress(&store.sql.release_unconfirmed, &lease)
                    .await
            }
        });
    }
}

/// Answers every operation of a batch that could not be written at all.
fn fail(batch: Vec<Op>, e: &StoreError) {
    for op in batch {
        let failure = || Failure::not_written(again(e));
        match op {
            Op::Reserve(op) => drop(op.reply.send(Err(failure()))),
            Op::Complete(op) => drop(op.reply.send(Err(failure()))),
            Op::Release(op) => drop(op.reply.send(Err(failure()))),
        }
    }
}

/// The drainer stopped without answering (it panicked, or its runtime shut down).
fn unanswered() -> Failure {
    Failure {
        error: StoreError::unavailable("the PostgreSQL store's batch was not answered"),
        may_have_run: true,
    }
}

impl PgStore {
    /// Queues the operation `make` builds around its reply channel, starts a drainer
    /// if one may start, and waits for the answer. Gives up, unwritten, when no drainer
    /// took it within the pool's acquire timeout.
    pub(crate) async fn submit<T>(
        &self,
        batcher: &Arc<Batcher>,
        make: impl FnOnce(oneshot::Sender<Answer<T>>) -> Op,
    ) -> Answer<T> {
        let (reply, mut answer) = oneshot::channel();
        let (id, start) = batcher.push(make(reply));
        if start {
            // Boxed: the drainer's state is tens of kilobytes, which spawning it
            // unboxed copied several times over (into the task, and again when it
            // finished), once per lone operation.
            tokio::spawn(Box::pin(self.clone().drain(batcher.clone())));
        }
        let patience = self.pool.options().get_acquire_timeout();
        match tokio::time::timeout(patience, &mut answer).await {
            Ok(answered) => answered.unwrap_or_else(|_| Err(unanswered())),
            Err(_) if batcher.withdraw(id) => Err(Failure::not_written(crate::error::store_error(
                sqlx::Error::PoolTimedOut,
            ))),
            Err(_) => answer.await.unwrap_or_else(|_| Err(unanswered())),
        }
    }
}
