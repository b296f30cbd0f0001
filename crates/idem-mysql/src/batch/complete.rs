//! The drainer's completions: one `UPDATE` for the batch's first completion of each
//! scope, a read where it matched fewer rows than it carried, and one by one after a
//! statement the server refused.

use std::collections::HashSet;

use idem_core::codec::encode_response_headers;
use idem_core::{StoreError, Timestamp, duration_millis};
use sqlx::{AssertSqlSafe, MySqlConnection};

use super::run::{again, survivable};
use super::sql::size_for;
use super::{Batcher, CompleteOp, Failure};
use crate::error::store_error;
use crate::statements::row_id;
use crate::store::MySqlStore;

impl MySqlStore {
    /// Writes a batch's completions; whether the connection is still fit for the next.
    pub(super) async fn completes(
        &self,
        b: &Batcher,
        conn: &mut MySqlConnection,
        mut todo: Vec<CompleteOp>,
    ) -> bool {
        while !todo.is_empty() {
            let now = self.clock.now();
            // Two completions of one scope (rare: a fenced attempt and the current one)
            // go in statements one after the other; the rest in the ids' order, as the
            // reserves, so that batches lock the rows they share in one order.
            let mut ops = Vec::with_capacity(todo.len());
            let mut later = Vec::new();
            let mut seen = HashSet::with_capacity(todo.len());
            for op in todo {
                let id = row_id(&op.lease.scope);
                if seen.insert(id.clone()) {
                    ops.push((id, op));
                } else {
                    later.push(op);
                }
            }
            ops.sort_unstable_by(|(x, _), (y, _)| x.cmp(y));
            b.count_statement();
            let matched = match self.complete_batch(b, conn, &ops, now).await {
                Ok(n) => n,
                Err(e) if survivable(&e) => {
                    // Rolled back whole: nothing of it was written.
                    b.count_split();
                    let all = ops.into_iter().map(|(_, op)| op).chain(later).collect();
                    self.completes_one_by_one(all);
                    return true;
                }
                Err(e) => {
                    let e = store_error(e);
                    for (_, op) in ops {
                        drop(op.reply.send(Err(Failure::not_written(again(&e)))));
                    }
                    for op in later {
                        drop(op.reply.send(Err(Failure::not_written(again(&e)))));
                    }
                    return false;
                }
            };
            if matched < ops.len() as u64 {
                // Some were not in progress under their tokens: completed already by
                // the same lease (completing twice succeeds), or fenced.
                b.count_statement();
                match self.completed_batch(b, conn, &ops, now).await {
                    Ok(done) => {
                        for (id, op) in ops {
                            let answer = if done.contains(&id) {
                                Ok(())
                            } else {
                                Err(Failure::not_written(StoreError::Fenced))
                            };
                            drop(op.reply.send(answer));
                        }
                    }
                    Err(e) => {
                        let fit = survivable(&e);
                        let e = store_error(e);
                        for (_, op) in ops {
                            drop(op.reply.send(Err(Failure::not_written(again(&e)))));
                        }
                        for op in later {
                            drop(op.reply.send(Err(Failure::not_written(again(&e)))));
                        }
                        return fit;
                    }
                }
            } else {
                for (_, op) in ops {
                    drop(op.reply.send(Ok(())));
                }
            }
            todo = later;
        }
        true
    }

    /// The batch completion of `ops` (one per scope, in the ids' order): how many rows
    /// it matched (the driver asks for found rows, not changed ones).
    async fn complete_batch(
        &self,
        b: &Batcher,
        conn: &mut MySqlConnection,
        ops: &[(Vec<u8>, CompleteOp)],
        now: Timestamp,
    ) -> Result<u64, sqlx::Error> {
        let (size, at) = size_for(ops.len());
        let headers: Vec<Vec<u8>> = ops
            .iter()
            .map(|(_, op)| encode_response_headers(&op.response, false))
            .collect();
        let mut query = sqlx::query(AssertSqlSafe(b.sql.complete[at].as_str()));
        for ((id, op), headers) in ops.iter().zip(&headers) {
            let response = &op.response;
            query = query
                .bind(&id[..])
                .bind(op.lease.token.as_i64())
                .bind(i32::from(response.status))
                .bind(&headers[..])
                .bind(&response.body[..])
                .bind(response.ambiguity().map(|a| a.as_str()))
                .bind(duration_millis(op.lease.ttl))
                .bind(duration_millis(op.lease.tombstone));
        }
        // The spare rows' NULL id joins no row.
        for _ in ops.len()..size {
            query = query
                .bind(None::<&[u8]>)
                .bind(0_i64)
                .bind(0_i32)
                .bind(None::<&[u8]>)
                .bind(None::<&[u8]>)
                .bind(None::<&str>)
                .bind(0_i64)
                .bind(0_i64);
        }
        let done = query
            .bind(now.as_millis())
            .bind(now.as_millis())
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected())
    }

    /// Which of `ops`' ids are completed under the token of their lease.
    async fn completed_batch(
        &self,
        b: &Batcher,
        conn: &mut MySqlConnection,
        ops: &[(Vec<u8>, CompleteOp)],
        now: Timestamp,
    ) -> Result<HashSet<Vec<u8>>, sqlx::Error> {
        let (size, at) = size_for(ops.len());
        let mut query = sqlx::query_scalar(AssertSqlSafe(b.sql.completed[at].as_str()));
        let last = &ops[ops.len() - 1];
        for (id, op) in ops
            .iter()
            .chain(std::iter::repeat_n(last, size - ops.len()))
        {
            query = query.bind(&id[..]).bind(op.lease.token.as_i64());
        }
        let ids: Vec<Vec<u8>> = query.bind(now.as_millis()).fetch_all(&mut *conn).await?;
        Ok(ids.into_iter().collect())
    }

    /// Completions written one at a time through the single-row path (its own
    /// connection, retries and fences), after a batch statement the server refused.
    fn completes_one_by_one(&self, ops: Vec<CompleteOp>) {
        for op in ops {
            let store = self.clone();
            tokio::spawn(Box::pin(async move {
                let answer = store
                    .complete_pooled(&op.lease, &op.response)
                    .await
                    .map_err(Failure::not_written);
                drop(op.reply.send(answer));
            }));
        }
    }
}
