//! The drainer: takes batches off the queue and writes each as one statement per kind
//! of operation, on a connection it keeps while batches keep coming.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use idem_core::{
    Record, Reservation, Scope, StoreError, Timestamp, duration_millis, release_unconfirmed_with,
};
use sqlx::{AssertSqlSafe, PgConnection, Row};

use super::{Answer, Batcher, CompleteOp, Failure, Op, ReleaseOp, ReserveOp};
use crate::error::store_error;
use crate::handoff::Conn;
use crate::statements::record_from_row;
use crate::store::{PgStore, RESERVE_ROUNDS, may_have_run, reservation_from};

/// Batches a drainer writes on one connection before it hands the connection on (to
/// an operation waiting for one, or back to the pool), so that others sharing the pool
/// get their turn.
const BATCHES_PER_CONNECTION: u32 = 8;

/// Whether a statement that failed with `e` left its connection fit for the next one:
/// only an error the server answered with (the statement rolled back) does.
fn survivable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_))
}

/// The same for an error already mapped to a [`StoreError`].
fn breaks(e: &StoreError) -> bool {
    match e {
        StoreError::Unavailable(source) => source
            .downcast_ref::<sqlx::Error>()
            .is_none_or(|e| !survivable(e)),
        _ => false,
    }
}

/// `e` once more, for another member of the batch it failed.
fn again(e: &StoreError) -> StoreError {
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
fn not_sent() -> Failure {
    Failure::not_written(StoreError::unavailable(
        "the batch's connection to PostgreSQL broke before this operation was sent",
    ))
}

/// For each of `items`, whether it is the first of its scope.
fn firsts<T>(items: &[T], scope: impl Fn(&T) -> &Scope) -> Vec<bool> {
    let mut seen = HashSet::with_capacity(items.len());
    items.iter().map(|item| seen.insert(scope(item))).collect()
}

/// `items` split into the first of each scope and the rest.
fn first_per_scope<T>(items: Vec<T>, scope: impl Fn(&T) -> &Scope) -> (Vec<T>, Vec<T>) {
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
    /// Writes batches until the queue is empty.
    pub(crate) async fn drain(self, batcher: Arc<Batcher>) {
        let mut held: Option<Conn> = None;
        let mut written = 0;
        loop {
            let batch = batcher.take();
            if batch.is_empty() {
                break;
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
    fn answer_reserve(&self, op: ReserveOp, answer: Answer<Reservation>) {
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

    async fn reserves(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        mut todo: Vec<ReserveOp>,
    ) -> bool {
        for _ in 0..RESERVE_ROUNDS {
            if todo.is_empty() {
                return true;
            }
            let now = self.clock.now();
            // The first member of each scope goes in the statement; the others are
            // answered from the row it returns, as a statement right after it would.
            let (members, row_of) = {
                let mut index: HashMap<&Scope, usize> = HashMap::with_capacity(todo.len());
                let mut members = Vec::with_capacity(todo.len());
                let row_of: Vec<usize> = todo
                    .iter()
                    .enumerate()
                    .map(|(i, op)| {
                        *index.entry(&op.req.scope).or_insert_with(|| {
                            members.push(i);
                            members.len() - 1
                        })
                    })
                    .collect();
                (members, row_of)
            };
            b.count_statement();
            let mut rows = match self.reserve_statement(b, conn, &todo, &members, now).await {
                Ok(rows) => rows,
                Err(e) if survivable(&e) => {
                    b.count_split();
                    return self.reserves_one_by_one(b, conn, todo).await;
                }
                Err(e) => {
                    let may_have_run = may_have_run(&e)
                        || matches!(
                            e,
                            sqlx::Error::ColumnDecode { .. } | sqlx::Error::ColumnNotFound(_)
                        );
                    let e = store_error(e);
                    for op in todo {
                        let error = again(&e);
                        self.answer_reserve(
                            op,
                            Err(Failure {
                                error,
                                may_have_run,
                            }),
                        );
                    }
                    return false;
                }
            };
            // How many members still read each row, so that the last one takes it.
            let mut readers = vec![0usize; members.len()];
            row_of.iter().for_each(|&r| readers[r] += 1);
            let mut next = Vec::new();
            for (i, op) in todo.into_iter().enumerate() {
                let r = row_of[i];
                let own = members[r] == i;
                readers[r] -= 1;
                let row = if readers[r] == 0 {
                    rows[r].take()
                } else {
                    rows[r].as_ref().map(|row| match row {
                        Ok((acquired, record)) => Ok((*acquired, record.clone())),
                        Err(e) => Err(again(e)),
                    })
                };
                let outcome = match row {
                    // The statement saw no row of this scope: look again.
                    None => Ok(None),
                    Some(Ok((acquired, record))) if own => {
                        reservation_from(&op.req, op.token, acquired, record, now)
                    }
                    Some(Ok((_, record))) => {
                        Ok(Reservation::from_existing(record, &op.req.fingerprint, now))
                    }
                    Some(Err(e)) => Err(e),
                };
                match outcome {
                    Ok(None) => next.push(op),
                    Ok(Some(r)) => self.answer_reserve(op, Ok(r)),
                    // A row that does not decode may be this member's reservation.
                    Err(error) => self.answer_reserve(
                        op,
                        Err(Failure {
                            error,
                            may_have_run: own,
                        }),
                    ),
                }
            }
            todo = next;
        }
        for op in todo {
            let error =
                StoreError::unavailable("reserve kept racing concurrent writers; try again");
            self.answer_reserve(op, Err(Failure::not_written(error)));
        }
        true
    }

    /// The batch reserve of `members` (indices into `todo`, one per scope): for each,
    /// the row the statement returned, if any, and whether the statement wrote it.
    async fn reserve_statement(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        todo: &[ReserveOp],
        members: &[usize],
        now: Timestamp,
    ) -> Result<Vec<Option<Result<(bool, Record), StoreError>>>, sqlx::Error> {
        let ops = || members.iter().map(|&i| &todo[i]);
        let tenants: Vec<&str> = ops().map(|op| op.req.scope.tenant().as_str()).collect();
        let endpoints: Vec<&str> = ops().map(|op| op.req.scope.endpoint_str()).collect();
        let keys: Vec<&str> = ops().map(|op| op.req.scope.key().as_str()).collect();
        let fingerprints: Vec<&[u8]> = ops().map(|op| &op.req.fingerprint.as_bytes()[..]).collect();
        let expiries: Vec<i64> = ops().map(|op| op.req.expires_at(now).as_millis()).collect();
        let tokens: Vec<i64> = ops().map(|op| op.token.as_i64()).collect();
        let leases: Vec<i64> = ops().map(|op| now.plus(op.req.lease).as_millis()).collect();
        let rows = sqlx::query(AssertSqlSafe(b.sql.reserve.clone()))
            .bind(tenants)
            .bind(endpoints)
            .bind(keys)
            .bind(fingerprints)
            .bind(expiries)
            .bind(tokens)
            .bind(leases)
            .bind(now.as_millis())
            .fetch_all(&mut *conn)
            .await?;
        let mut out: Vec<Option<Result<(bool, Record), StoreError>>> =
            (0..members.len()).map(|_| None).collect();
        for row in rows {
            let n: i64 = row.try_get("n")?;
            let Some((slot, &i)) = usize::try_from(n - 1)
                .ok()
                .and_then(|at| out.get_mut(at).zip(members.get(at)))
            else {
                return Err(sqlx::Error::Protocol(format!("a row for no member ({n})")));
            };
            let decoded = row
                .try_get::<bool, _>("acquired")
                .map_err(store_error)
                .and_then(|acquired| Ok((acquired, record_from_row(&todo[i].req.scope, &row)?)));
            *slot = Some(decoded);
        }
        Ok(out)
    }

    /// Reserves written one at a time, each in a statement of its own: a lone one, or a
    /// batch the database refused, so that only the member at fault fails.
    async fn reserves_one_by_one(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        todo: Vec<ReserveOp>,
    ) -> bool {
        let mut ops = todo.into_iter();
        while let Some(op) = ops.next() {
            if op.reply.is_closed() {
                continue;
            }
            let mut answer = Err(Failure::not_written(StoreError::unavailable(
                "reserve kept racing concurrent writers; try again",
            )));
            for _ in 0..RESERVE_ROUNDS {
                b.count_statement();
                match self
                    .reserve_row(conn, &op.req, op.token, self.clock.now())
                    .await
                {
                    Ok(None) => continue,
                    Ok(Some(r)) => answer = Ok(r),
                    Err(f) => answer = Err(f),
                }
                break;
            }
            let broken = matches!(&answer, Err(f) if breaks(&f.error));
            self.answer_reserve(op, answer);
            if broken {
                ops.for_each(|op| self.answer_reserve(op, Err(not_sent())));
                return false;
            }
        }
        true
    }

    async fn completes(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        mut todo: Vec<CompleteOp>,
    ) -> bool {
        while !todo.is_empty() {
            let now = self.clock.now();
            // Two completions of one scope (rare: a fenced attempt and the current one)
            // go in statements one after the other.
            let (ops, later) = first_per_scope(todo, |op| &op.lease.scope);
            b.count_statement();
            let done = match self.complete_statement(b, conn, &ops, now).await {
                Ok(done) => done,
                Err(e) if survivable(&e) => {
                    b.count_split();
                    let all = ops.into_iter().chain(later).collect();
                    return self.completes_one_by_one(b, conn, all).await;
                }
                Err(e) => {
                    let e = store_error(e);
                    for op in ops.into_iter().chain(later) {
                        drop(op.reply.send(Err(Failure::not_written(again(&e)))));
                    }
                    return false;
                }
            };
            let mut rest = ops.into_iter().zip(done);
            while let Some((op, done)) = rest.next() {
                if done {
                    drop(op.reply.send(Ok(())));
                    continue;
                }
                // Not in progress under this token: done already, or fenced.
                b.count_statement();
                let answer = self.completed_by(conn, &op.lease, now).await;
                let broken = matches!(&answer, Err(e) if breaks(e));
                drop(op.reply.send(answer.map_err(Failure::not_written)));
                if broken {
                    rest.for_each(|(op, _)| drop(op.reply.send(Err(not_sent()))));
                    later
                        .into_iter()
                        .for_each(|op| drop(op.reply.send(Err(not_sent()))));
                    return false;
                }
            }
            todo = later;
        }
        true
    }

    /// Which of `ops` (one per scope) the batch completion completed.
    async fn complete_statement(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        ops: &[CompleteOp],
        now: Timestamp,
    ) -> Result<Vec<bool>, sqlx::Error> {
        let tenants: Vec<&str> = ops
            .iter()
            .map(|op| op.lease.scope.tenant().as_str())
            .collect();
        let endpoints: Vec<&str> = ops.iter().map(|op| op.lease.scope.endpoint_str()).collect();
        let keys: Vec<&str> = ops.iter().map(|op| op.lease.scope.key().as_str()).collect();
        let tokens: Vec<i64> = ops.iter().map(|op| op.lease.token.as_i64()).collect();
        let statuses: Vec<i32> = ops.iter().map(|op| op.status).collect();
        let headers: Vec<&[u8]> = ops.iter().map(|op| &op.headers[..]).collect();
        let bodies: Vec<&[u8]> = ops.iter().map(|op| &op.body[..]).collect();
        let ambiguities: Vec<Option<&str>> = ops.iter().map(|op| op.ambiguity).collect();
        let ttls: Vec<i64> = ops.iter().map(|op| duration_millis(op.lease.ttl)).collect();
        let tombstones: Vec<i64> = ops
            .iter()
            .map(|op| duration_millis(op.lease.tombstone))
            .collect();
        let rows: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(b.sql.complete.clone()))
            .bind(tenants)
            .bind(endpoints)
            .bind(keys)
            .bind(tokens)
            .bind(statuses)
            .bind(headers)
            .bind(bodies)
            .bind(ttls)
            .bind(now.as_millis())
            .bind(tombstones)
            .bind(ambiguities)
            .fetch_all(&mut *conn)
            .await?;
        Ok(marked(ops.len(), rows))
    }

    async fn completes_one_by_one(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        todo: Vec<CompleteOp>,
    ) -> bool {
        let mut ops = todo.into_iter();
        while let Some(op) = ops.next() {
            let now = self.clock.now();
            b.count_statement();
            let answer = match self
                .complete_update(conn, &op.lease, op.row_answer(), now)
                .await
            {
                Ok(true) => Ok(()),
                Ok(false) => {
                    // Not in progress under this token: done already, or fenced.
                    b.count_statement();
                    self.completed_by(conn, &op.lease, now).await
                }
                Err(e) => Err(e),
            };
            let broken = matches!(&answer, Err(e) if breaks(e));
            drop(op.reply.send(answer.map_err(Failure::not_written)));
            if broken {
                ops.for_each(|op| drop(op.reply.send(Err(not_sent()))));
                return false;
            }
        }
        true
    }

    async fn releases(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        mut todo: Vec<ReleaseOp>,
    ) -> bool {
        while !todo.is_empty() {
            let now = self.clock.now();
            let (ops, later) = first_per_scope(todo, |op| &op.lease.scope);
            b.count_statement();
            let tenants: Vec<&str> = ops
                .iter()
                .map(|op| op.lease.scope.tenant().as_str())
                .collect();
            let endpoints: Vec<&str> = ops.iter().map(|op| op.lease.scope.endpoint_str()).collect();
            let keys: Vec<&str> = ops.iter().map(|op| op.lease.scope.key().as_str()).collect();
            let tokens: Vec<i64> = ops.iter().map(|op| op.lease.token.as_i64()).collect();
            let released = sqlx::query_scalar(AssertSqlSafe(b.sql.release.clone()))
                .bind(tenants)
                .bind(endpoints)
                .bind(keys)
                .bind(tokens)
                .bind(now.as_millis())
                .fetch_all(&mut *conn)
                .await;
            match released {
                Ok(rows) => {
                    let done = marked(ops.len(), rows);
                    for (op, done) in ops.into_iter().zip(done) {
                        let answer = if done {
                            Ok(())
                        } else {
                            Err(Failure::not_written(StoreError::Fenced))
                        };
                        drop(op.reply.send(answer));
                    }
                }
                Err(e) if survivable(&e) => {
                    b.count_split();
                    let all = ops.into_iter().chain(later).collect();
                    return self.releases_one_by_one(b, conn, all).await;
                }
                Err(e) => {
                    let e = store_error(e);
                    for op in ops.into_iter().chain(later) {
                        drop(op.reply.send(Err(Failure::not_written(again(&e)))));
                    }
                    return false;
                }
            }
            todo = later;
        }
        true
    }

    /// Releases written one at a time, each in a statement of its own: a lone one, or
    /// a batch the database refused.
    async fn releases_one_by_one(
        &self,
        b: &Batcher,
        conn: &mut PgConnection,
        todo: Vec<ReleaseOp>,
    ) -> bool {
        let mut ops = todo.into_iter();
        while let Some(op) = ops.next() {
            b.count_statement();
            let answer = self.release_row(conn, &op.lease, self.clock.now()).await;
            let broken = matches!(&answer, Err(e) if breaks(e));
            drop(op.reply.send(answer.map_err(Failure::not_written)));
            if broken {
                ops.for_each(|op| drop(op.reply.send(Err(not_sent()))));
                return false;
            }
        }
        true
    }
}

/// For `len` members, which the ordinals `rows` (counted from 1) name.
fn marked(len: usize, rows: Vec<i64>) -> Vec<bool> {
    let mut done = vec![false; len];
    for n in rows {
        if let Some(d) = usize::try_from(n - 1).ok().and_then(|i| done.get_mut(i)) {
            *d = true;
        }
    }
    done
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
