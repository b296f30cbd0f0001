//! The drainer's reserves: one `INSERT IGNORE` for the batch's first reserve of each
//! scope, a read of the batch's rows where it did not insert them all, a takeover by
//! the single-row statement where a record may be taken over, and one by one after a
//! statement the server refused.

use std::collections::HashMap;

use idem_core::{Reservation, ReserveRequest, StoreError, Timestamp};
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, MySqlConnection, Row};

use super::run::{again, survivable};
use super::sql::size_for;
use super::{Batcher, Failure, ReserveOp};
use crate::error::{lost_a_lock, store_error};
use crate::statements::{record_from_row, row_id};
use crate::store::MySqlStore;
use crate::write::{RESERVE_ROUNDS, Round};

/// The most bytes a `TEXT` column holds. `INSERT IGNORE` would cut a longer value
/// short with a warning; a batch with one goes one by one, where the plain insert
/// refuses it.
const MOST_TEXT: usize = 65_535;

/// Whether a part of `req`'s scope is too long for its column.
fn too_long(req: &ReserveRequest) -> bool {
    let scope = &req.scope;
    [
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    ]
    .iter()
    .any(|part| part.len() > MOST_TEXT)
}

impl MySqlStore {
    /// Writes a batch's reserves; whether the connection is still fit for the next.
    pub(super) async fn reserves(
        &self,
        b: &Batcher,
        conn: &mut MySqlConnection,
        mut todo: Vec<ReserveOp>,
    ) -> bool {
        if todo.iter().any(|op| too_long(&op.req)) {
            self.reserves_one_by_one(todo);
            return true;
        }
        for _ in 0..RESERVE_ROUNDS {
            if todo.is_empty() {
                return true;
            }
            let now = self.clock.now();
            let ids: Vec<Vec<u8>> = todo.iter().map(|op| row_id(&op.req.scope)).collect();
            // The first reserve of each scope goes in the insert, in the ids' order; the
            // others are answered from the row read after it, as a statement right after
            // it would answer them.
            let mut own = vec![false; todo.len()];
            let mut members: Vec<usize> = {
                let mut first: HashMap<&[u8], usize> = HashMap::with_capacity(todo.len());
                for (i, id) in ids.iter().enumerate() {
                    first.entry(id).or_insert(i);
                }
                first.into_values().collect()
            };
            members.sort_unstable_by(|&x, &y| ids[x].cmp(&ids[y]));
            members.iter().for_each(|&i| own[i] = true);
            b.count_statement();
            let inserted = match self.insert_batch(b, conn, &todo, &ids, &members, now).await {
                Ok(n) => n,
                Err(e) if survivable(&e) => {
                    // Rolled back whole: nothing of it was written.
                    b.count_split();
                    self.reserves_one_by_one(todo);
                    return true;
                }
                Err(e) => {
                    self.unknown(todo, &store_error(e));
                    return false;
                }
            };
            if inserted == members.len() as u64 && members.len() == todo.len() {
                for op in todo {
                    let lease = op.req.lease_for(op.token, 1);
                    self.answer_reserve(op, Ok(Reservation::Acquired(lease)));
                }
                return true;
            }
            b.count_statement();
            let rows = match self.read_batch(b, conn, &ids, &members).await {
                Ok(rows) => rows,
                Err(e) => {
                    // The insert committed: each member's reservation may be there, and
                    // is released by its token.
                    let fit = survivable(&e);
                    self.unknown(todo, &store_error(e));
                    return fit;
                }
            };
            let mut next = Vec::new();
            let mut take_over = Vec::new();
            for (i, op) in todo.into_iter().enumerate() {
                let Some(row) = rows.get(&ids[i]) else {
                    // Released or removed since the insert: look again.
                    next.push(op);
                    continue;
                };
                let record = match record_from_row(&op.req.scope, row) {
                    Ok(record) => record,
                    Err(error) => {
                        let failure = Failure {
                            error,
                            may_have_run: own[i],
                        };
                        self.answer_reserve(op, Err(failure));
                        continue;
                    }
                };
                if own[i] && record.token == op.token {
                    let lease = op.req.lease_for(op.token, 1);
                    self.answer_reserve(op, Ok(Reservation::Acquired(lease)));
                } else if let Some(answer) =
                    Reservation::from_existing(record, &op.req.fingerprint, now)
                {
                    self.answer_reserve(op, Ok(answer));
                } else if own[i] {
                    take_over.push((op, row));
                } else {
                    // After the first of its scope, which may take the record over.
                    next.push(op);
                }
            }
            let mut takeovers = take_over.into_iter();
            while let Some((op, row)) = takeovers.next() {
                b.count_statement();
                match self.settle_on(conn, &op.req, op.token, now, row).await {
                    Ok(Round::Answer(answer)) => self.answer_reserve(op, Ok(answer)),
                    Ok(Round::Again) => next.push(op),
                    Err(e) if lost_a_lock(&e) => next.push(op),
                    Err(e) if survivable(&e) => {
                        let failure = Failure::not_written(store_error(e));
                        self.answer_reserve(op, Err(failure));
                    }
                    Err(e) => {
                        let e = store_error(e);
                        let rest = std::iter::once(op).chain(takeovers.map(|(op, _)| op));
                        self.unknown(rest.chain(next).collect(), &e);
                        return false;
                    }
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

    /// The batch insert of `members` (indices into `todo`, one per scope, in the ids'
    /// order): how many rows it inserted.
    async fn insert_batch(
        &self,
        b: &Batcher,
        conn: &mut MySqlConnection,
        todo: &[ReserveOp],
        ids: &[Vec<u8>],
        members: &[usize],
        now: Timestamp,
    ) -> Result<u64, sqlx::Error> {
        let (size, at) = size_for(members.len());
        let mut query = sqlx::query(AssertSqlSafe(b.sql.insert[at].as_str()));
        let last = members[members.len() - 1];
        // The spare rows repeat the last, which the primary key then passes over.
        for &i in members
            .iter()
            .chain(std::iter::repeat_n(&last, size - members.len()))
        {
            let req = &todo[i].req;
            let scope = &req.scope;
            query = query
                .bind(&ids[i][..])
                .bind(scope.tenant().as_str())
                .bind(scope.endpoint_str())
                .bind(scope.key().as_str())
                .bind(&req.fingerprint.as_bytes()[..])
                .bind(now.as_millis())
                .bind(req.expires_at(now).as_millis())
                .bind(todo[i].token.as_i64())
                .bind(now.plus(req.lease).as_millis());
        }
        Ok(query.execute(&mut *conn).await?.rows_affected())
    }

    /// The rows of `members`' ids, by id.
    async fn read_batch(
        &self,
        b: &Batcher,
        conn: &mut MySqlConnection,
        ids: &[Vec<u8>],
        members: &[usize],
    ) -> Result<HashMap<Vec<u8>, MySqlRow>, sqlx::Error> {
        let (size, at) = size_for(members.len());
        let mut query = sqlx::query(AssertSqlSafe(b.sql.read[at].as_str()));
        let last = members[members.len() - 1];
        for &i in members
            .iter()
            .chain(std::iter::repeat_n(&last, size - members.len()))
        {
            query = query.bind(&ids[i][..]);
        }
        let rows = query.fetch_all(&mut *conn).await?;
        rows.into_iter()
            .map(|row| Ok((row.try_get::<Vec<u8>, _>("id")?, row)))
            .collect()
    }

    /// Reserves written one at a time through the single-row path (its own connection,
    /// retries and fences): after a batch statement the server refused, so that none
    /// of them hears of that refusal, or where `INSERT IGNORE` could cut a value short.
    fn reserves_one_by_one(&self, ops: Vec<ReserveOp>) {
        for op in ops {
            let store = self.clone();
            tokio::spawn(Box::pin(async move {
                let answer = store
                    .reserve_record(&op.req)
                    .await
                    .map_err(Failure::not_written);
                store.answer_reserve(op, answer);
            }));
        }
    }

    /// Answers `ops` with `e`, each one's reservation possibly written under its token.
    fn unknown(&self, ops: Vec<ReserveOp>, e: &StoreError) {
        for op in ops {
            let failure = Failure {
                error: again(e),
                may_have_run: true,
            };
            self.answer_reserve(op, Err(failure));
        }
    }
}
