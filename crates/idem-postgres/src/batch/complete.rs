//! The drainer's completions and releases: one statement each for the batch, and one
//! by one after a failed statement.

use idem_core::{StoreError, Timestamp, duration_millis};
use sqlx::{AssertSqlSafe, PgConnection};

use super::run::{again, breaks, first_per_scope, not_sent, survivable};
use super::{Batcher, CompleteOp, Failure, ReleaseOp};
use crate::error::store_error;
use crate::store::PgStore;

impl PgStore {
    pub(super) async fn completes(
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

    pub(super) async fn completes_one_by_one(
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

    pub(super) async fn releases(
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
    pub(super) async fn releases_one_by_one(
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
