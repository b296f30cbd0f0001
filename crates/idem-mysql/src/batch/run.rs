//! The drainer: takes batches off the queue and writes each as one statement per kind
//! of operation, on a connection it keeps while batches keep coming; and the queueing
//! of an operation by its caller.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{FencingToken, Lease, Reservation, ReserveRequest, StoreError, StoredResponse};
use sqlx::MySql;
use sqlx::pool::PoolConnection;
use tokio::sync::oneshot;

use super::{Answer, Batcher, CompleteOp, Empty, Failure, Op, ReserveOp};
use crate::error::store_error;
use crate::store::MySqlStore;
use crate::write::Unconfirmed;

/// How long a drainer whose queue ran empty keeps its connection and waits for the
/// next operation before it stops. A request's completion follows its reservation by
/// the upstream's answer time, and a client's next request follows that: a drainer
/// still there writes them with no connection taken from the pool and given back (sqlx
/// pings each one it gets back: a round trip and a spawned task), nor a drainer
/// spawned. Short, so that a connection held for nothing returns soon.
const LINGER: Duration = Duration::from_millis(2);

/// Batches a drainer writes on one connection before it gives it back to the pool and
/// takes one again, behind whoever else waits for one.
const BATCHES_PER_CONNECTION: u32 = 64;

/// Whether a statement that failed with `e` left its connection fit for the next one:
/// only an error the server answered with (the statement rolled back) does.
pub(super) fn survivable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_))
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
        "the batch's connection to MySQL broke before this operation was sent",
    ))
}

impl MySqlStore {
    /// A reserve through the batch queue, under a token drawn here so that a
    /// reservation written but not confirmed is released by it.
    pub(crate) async fn reserve_batched(
        &self,
        batch: &Arc<Batcher>,
        req: &ReserveRequest,
    ) -> Result<Reservation, StoreError> {
        let token = FencingToken::generate();
        // Armed until the answer comes: dropped mid-wait (the operation timeout), or
        // told the batch may have written it, the reservation is released by its token.
        let mut unconfirmed = Unconfirmed {
            store: self,
            lease: Some(req.lease_for(token, 1)),
        };
        let op = |reply| {
            Op::Reserve(ReserveOp {
                req: req.clone(),
                token,
                reply,
            })
        };
        match self.submit(batch, op).await {
            Ok(r) => {
                unconfirmed.lease = None;
                Ok(r)
            }
            Err(f) => {
                if !f.may_have_run {
                    unconfirmed.lease = None;
                }
                Err(f.error)
            }
        }
    }

    /// A completion through the batch queue.
    pub(crate) async fn complete_batched(
        &self,
        batch: &Arc<Batcher>,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let op = |reply| {
            Op::Complete(CompleteOp {
                lease: lease.clone(),
                response: response.clone(),
                reply,
            })
        };
        self.submit(batch, op).await.map_err(|f| f.error)
    }

    /// Writes batches until the queue stays empty for [`LINGER`].
    pub(crate) async fn drain(self, batcher: Arc<Batcher>) {
        let mut held: Option<PoolConnection<MySql>> = None;
        let mut written = 0;
        loop {
            let batch = batcher.take();
            if batch.is_empty() {
                match batcher.empty(held.is_some()) {
                    Empty::TakeAgain => continue,
                    Empty::Stop => break,
                    Empty::Linger if batcher.woken(LINGER).await => continue,
                    Empty::Linger => break,
                }
            }
            let mut conn = match held.take() {
                Some(conn) => conn,
                None => match self.pool.acquire().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        fail(batch, &store_error(e));
                        continue;
                    }
                },
            };
            batcher.count_batch(batch.len());
            // Dropped mid-statement by the timeout, the batch's members hear nothing:
            // their callers answer `Unavailable`. What its reserves may have written is
            // released here, by their tokens, since a caller that already gave up (and
            // released before the insert landed) would leave its key held for a lease.
            let reserved: Vec<Lease> = batch
                .iter()
                .filter_map(|op| match op {
                    Op::Reserve(op) => Some(op.req.lease_for(op.token, 1)),
                    Op::Complete(_) => None,
                })
                .collect();
            let fit = match tokio::time::timeout(
                self.operation_timeout,
                self.write(&batcher, &mut conn, batch),
            )
            .await
            {
                Ok(fit) => fit,
                Err(_) => {
                    reserved
                        .into_iter()
                        .for_each(|lease| self.release_in_background(lease));
                    false
                }
            };
            written += 1;
            if !fit {
                // Not given back to the pool for the next caller: closed.
                conn.close_on_drop();
                written = 0;
            } else if written < BATCHES_PER_CONNECTION {
                held = Some(conn);
            } else {
                written = 0;
            }
        }
    }

    /// Writes one batch; whether its connection is still fit for the next.
    async fn write(&self, b: &Batcher, conn: &mut sqlx::MySqlConnection, batch: Vec<Op>) -> bool {
        let (mut reserves, mut completes) = (Vec::new(), Vec::new());
        for op in batch {
            match op {
                Op::Reserve(op) => reserves.push(op),
                Op::Complete(op) => completes.push(op),
            }
        }
        let mut fit = true;
        if !reserves.is_empty() {
            fit = self.reserves(b, conn, reserves).await;
        }
        if !completes.is_empty() {
            if fit {
                fit = self.completes(b, conn, completes).await;
            } else {
                completes
                    .into_iter()
                    .for_each(|op| drop(op.reply.send(Err(not_sent()))));
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
        self.release_in_background(unheard);
    }

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
            // Boxed: the drainer's state (the statements' futures) is kilobytes, which
            // spawning it unboxed would copy into the task and again as it ran.
            tokio::spawn(Box::pin(self.clone().drain(batcher.clone())));
        }
        let patience = self.pool.options().get_acquire_timeout();
        match tokio::time::timeout(patience, &mut answer).await {
            Ok(answered) => answered.unwrap_or_else(|_| Err(unanswered())),
            Err(_) if batcher.withdraw(id) => {
                Err(Failure::not_written(store_error(sqlx::Error::PoolTimedOut)))
            }
            Err(_) => answer.await.unwrap_or_else(|_| Err(unanswered())),
        }
    }
}

/// Answers every operation of a batch that could not be written at all.
fn fail(batch: Vec<Op>, e: &StoreError) {
    for op in batch {
        let failure = || Failure::not_written(again(e));
        match op {
            Op::Reserve(op) => drop(op.reply.send(Err(failure()))),
            Op::Complete(op) => drop(op.reply.send(Err(failure()))),
        }
    }
}

/// The drainer stopped without answering (it panicked, or its runtime shut down).
fn unanswered() -> Failure {
    Failure {
        error: StoreError::unavailable("the MySQL store's batch was not answered"),
        may_have_run: true,
    }
}
