//! The drainer's reserves: one statement for the batch's first reserve of each scope,
//! a second look for what it could not see, and one by one after a failed statement.

use std::collections::HashMap;

use idem_core::{Record, Reservation, Scope, StoreError, Timestamp};
use sqlx::{AssertSqlSafe, PgConnection, Row};

use super::run::{again, breaks, not_sent, survivable};
use super::{Batcher, Failure, ReserveOp};
use crate::error::store_error;
use crate::statements::record_from_row;
use crate::store::PgStore;
use crate::write::{RESERVE_ROUNDS, may_have_run, reservation_from};

impl PgStore {
    pub(super) async fn reserves(
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
    pub(super) async fn reserves_one_by_one(
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
}
