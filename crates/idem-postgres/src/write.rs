//! The write path of a `PgStore` without batching, and what the batch's drain shares
//! with it: a reserve, a completion and a release as single-row statements, and the
//! release of a reservation whose outcome is unknown.

use std::sync::Arc;

use idem_core::codec::encode_response_headers;
use idem_core::{
    FencingToken, Lease, Record, Reservation, ReserveRequest, StoreError, StoredResponse,
    Timestamp, duration_millis, release_unconfirmed_with,
};
use sqlx::{AssertSqlSafe, PgConnection, Row};

use crate::batch::{Batcher, Failure, Op, ReserveOp};
use crate::error::{fenced_unless_one, store_error};
use crate::statements::{RowAnswer, record_from_row};
use crate::store::PgStore;

/// How long `reserve` keeps retrying when its statement saw neither its own insert nor
/// the existing row (a row committed by a concurrent transaction after the statement's
/// snapshot). Each retry takes a new snapshot, so two or three suffice in practice.
pub(crate) const RESERVE_ROUNDS: usize = 16;

impl PgStore {
    /// [`Store::reserve`](idem_core::Store::reserve): through the batch queue, or
    /// alone, looking again while the statement races a concurrent writer.
    pub(crate) async fn reserve_record(
        &self,
        req: &ReserveRequest,
    ) -> Result<Reservation, StoreError> {
        if let Some(batch) = &self.batch {
            return self.bounded(self.reserve_batched(batch, req)).await;
        }
        // Boxed: this path's state (a pooled connection's acquire, the statement) is
        // kilobytes that the batched path above would otherwise carry and copy.
        self.bounded(Box::pin(async {
            for _ in 0..RESERVE_ROUNDS {
                if let Some(r) = self.reserve_once(req).await? {
                    return Ok(r);
                }
            }
            Err(StoreError::unavailable(
                "reserve kept racing concurrent writers; try again",
            ))
        }))
        .await
    }

    /// Deletes `lease`'s in-progress record with `sql` (`release`, or
    /// `release_unconfirmed`, which also requires attempt 1); fenced.
    pub(crate) async fn delete_in_progress(
        &self,
        sql: &Arc<str>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let scope = &lease.scope;
        let done = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(scope.tenant().as_str())
                    .bind(scope.endpoint_str())
                    .bind(scope.key().as_str())
                    .bind(lease.token.as_i64())
                    .bind(now.as_millis())
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        fenced_unless_one(done.rows_affected())
    }

    /// A reserve through the batch queue, under a token drawn here so that a
    /// reservation written but not confirmed is released by it.
    pub(crate) async fn reserve_batched(
        &self,
        batch: &Arc<Batcher>,
        req: &ReserveRequest,
    ) -> Result<Reservation, StoreError> {
        let token = FencingToken::generate();
        let mut unconfirmed = Unconfirmed::new(self, req, token);
        let op = |reply| {
            Op::Reserve(ReserveOp {
                req: req.clone(),
                token,
                reply,
            })
        };
        match self.submit(batch, op).await {
            Ok(r) => {
                unconfirmed.disarm();
                Ok(r)
            }
            Err(f) => {
                if !f.may_have_run {
                    unconfirmed.disarm();
                }
                Err(f.error)
            }
        }
    }

    pub(crate) async fn reserve_once(
        &self,
        req: &ReserveRequest,
    ) -> Result<Option<Reservation>, StoreError> {
        // Taken before the statement is armed in `reserve_on`: waiting for a connection
        // sends nothing, so running out of time there leaves nothing to release.
        let mut conn = self.handoff.acquire(&self.pool).await?;
        let reserved = self.reserve_on(&mut conn.conn, req).await;
        if reserved.is_ok() {
            self.handoff.release(conn);
        }
        reserved
    }

    pub(crate) async fn reserve_on(
        &self,
        conn: &mut PgConnection,
        req: &ReserveRequest,
    ) -> Result<Option<Reservation>, StoreError> {
        let token = FencingToken::generate();
        // Armed until the outcome is known: if the statement fails in a way that leaves
        // open whether it committed, or this future is dropped mid-flight (the
        // operation timeout), the reservation it may have written is released. Release
        // matches on the token alone; the attempt (unknown: the statement may have taken
        // over) only shows in logs.
        let mut unconfirmed = Unconfirmed::new(self, req, token);
        let reserved = self.reserve_row(conn, req, token, self.clock.now()).await;
        match reserved {
            Ok(r) => {
                unconfirmed.disarm();
                Ok(r)
            }
            Err(f) => {
                if !f.may_have_run {
                    unconfirmed.disarm();
                }
                Err(f.error)
            }
        }
    }

    /// The single-row reserve of `req` under `token` at `now`: `None` when the
    /// statement saw neither its own insert nor the existing row, to be tried again.
    /// An error says whether the reservation may have been written all the same.
    pub(crate) async fn reserve_row(
        &self,
        conn: &mut PgConnection,
        req: &ReserveRequest,
        token: FencingToken,
        now: Timestamp,
    ) -> Result<Option<Reservation>, Failure> {
        let lease_until = now.plus(req.lease);
        let scope = &req.scope;
        let row = sqlx::query(AssertSqlSafe(self.sql.reserve.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(&req.fingerprint.as_bytes()[..])
            .bind(now.as_millis())
            .bind(req.expires_at(now).as_millis())
            .bind(token.as_i64())
            .bind(lease_until.as_millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| Failure {
                may_have_run: may_have_run(&e),
                error: store_error(e),
            })?;
        let Some(row) = row else {
            // The row exists (the insert conflicted) but was committed after this
            // statement's snapshot, so the read half could not see it: look again.
            return Ok(None);
        };
        // From here on a row came back: an error decoding it may hide that the row is
        // this reservation's.
        let written = |error| Failure {
            error,
            may_have_run: true,
        };
        let acquired: bool = row
            .try_get("acquired")
            .map_err(|e| written(store_error(e)))?;
        let existing = record_from_row(scope, &row).map_err(written)?;
        reservation_from(req, token, acquired, existing, now).map_err(written)
    }

    pub(crate) async fn complete_on(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let headers = encode_response_headers(response, false);
        let answer = RowAnswer {
            status: i32::from(response.status),
            headers: &headers,
            body: &response.body,
            ambiguity: response.ambiguity().map(|a| a.as_str()),
        };
        self.complete_row(conn, lease, answer, self.clock.now())
            .await
    }

    /// The single-row completion of `lease` at `now`, its response encoded for the row.
    pub(crate) async fn complete_row(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        answer: RowAnswer<'_>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        if self.complete_update(conn, lease, answer, now).await? {
            return Ok(());
        }
        self.completed_by(conn, lease, now).await
    }

    /// The completion's update alone: whether it completed the record (else it is
    /// completed already, or fenced: see [`completed_by`](Self::completed_by)).
    pub(crate) async fn complete_update(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        answer: RowAnswer<'_>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let scope = &lease.scope;
        let done = sqlx::query(AssertSqlSafe(self.sql.complete.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .bind(answer.status)
            .bind(answer.headers)
            .bind(answer.body)
            .bind(duration_millis(lease.ttl))
            .bind(duration_millis(lease.tombstone))
            .bind(answer.ambiguity)
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        Ok(done.rows_affected() == 1)
    }

    /// After a completion that found `lease`'s record not in progress under its token:
    /// completing twice with one lease is fine (the first response stays); anything
    /// else is fenced. This read runs as its own statement so that it sees a
    /// completion committed while the update waited for the row.
    pub(crate) async fn completed_by(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let scope = &lease.scope;
        let already: Option<i32> = sqlx::query_scalar(AssertSqlSafe(self.sql.completed_by.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error)?;
        match already {
            Some(_) => Ok(()),
            None => Err(StoreError::Fenced),
        }
    }

    /// The single-row release of `lease`'s in-progress record at `now`; fenced.
    pub(crate) async fn release_row(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let scope = &lease.scope;
        let done = sqlx::query(AssertSqlSafe(self.sql.release.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(lease.token.as_i64())
            .bind(now.as_millis())
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
        fenced_unless_one(done.rows_affected())
    }
}

/// What a reserve statement's row means for `req`, written under `token`: `acquired`
/// says the insert half wrote `row`; otherwise `row` is the existing record, and `None`
/// means it may now be taken (look again).
pub(crate) fn reservation_from(
    req: &ReserveRequest,
    token: FencingToken,
    acquired: bool,
    row: Record,
    now: Timestamp,
) -> Result<Option<Reservation>, StoreError> {
    if acquired {
        if row.token != token {
            return Err(StoreError::Corrupt(
                "reserve returned another attempt's token".into(),
            ));
        }
        return Ok(Some(Reservation::Acquired(
            req.lease_for(token, row.attempt),
        )));
    }
    // `None`: the row read was an older version that may now be taken (its lease or
    // life ran out, or another writer changed it after the snapshot). Try again.
    Ok(Reservation::from_existing(row, &req.fingerprint, now))
}

/// A reservation whose outcome is not known yet; dropped while armed, it is released in
/// the background ([`idem_core::release_unconfirmed`]), fenced by its token and only if
/// it is a first attempt: a retry of the key then executes, rather than answering 409
/// until a lease no one holds lapses. (The statement may have taken a record over
/// without the store learning it; such a record lapses, so that the next attempt still
/// runs as a recovered one.)
pub(crate) struct Unconfirmed<'a> {
    store: &'a PgStore,
    lease: Option<Lease>,
}

impl Unconfirmed<'_> {
    /// Armed for `req`'s reservation under `token`, as a first attempt.
    pub(crate) fn new<'a>(
        store: &'a PgStore,
        req: &ReserveRequest,
        token: FencingToken,
    ) -> Unconfirmed<'a> {
        Unconfirmed {
            store,
            lease: Some(req.lease_for(token, 1)),
        }
    }

    /// The outcome is known: the reservation was acquired and handed out, or it was
    /// certainly not written.
    pub(crate) fn disarm(&mut self) {
        self.lease = None;
    }
}

impl Drop for Unconfirmed<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let store = self.store.clone();
            release_unconfirmed_with(move || {
                let (store, lease) = (store.clone(), lease.clone());
                async move {
                    store
                        .delete_in_progress(&store.sql.release_unconfirmed, &lease)
                        .await
                }
            });
        }
    }
}

/// Whether a statement that failed with `e` may still have committed: the connection
/// broke or the conversation went wrong after it was sent. A database error means it
/// failed and rolled back; a pool error means it was never sent.
pub(crate) fn may_have_run(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use idem_core::Store;
    use idem_core::testing::unique_namespace;
    use idem_test_support::{service_unavailable, service_url};

    use crate::{SetupError, schema};

    /// The release of a reservation whose reply was lost deletes a first attempt, and
    /// never a takeover's record: that one lapses, so the next attempt still runs as a
    /// recovered one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unconfirmed_release_deletes_first_attempts_only() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let clock = idem_core::ManualClock::starting_now();
        let table = format!("idem_records_{}", unique_namespace("unconfirmed"));
        let store = match PgStore::builder()
            .table(&table)
            .clock(Arc::new(clock.clone()))
            .connect(&url)
            .await
        {
            Ok(s) => s,
            Err(e @ SetupError::Unreachable { .. }) => {
                return service_unavailable("PostgreSQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        let acquire = |req: ReserveRequest| {
            let store = store.clone();
            async move {
                match store.reserve(&req).await.expect("reserve") {
                    Reservation::Acquired(lease) => lease,
                    other => panic!("expected to acquire, got {other:?}"),
                }
            }
        };
        let fingerprint = idem_core::testing::test_fingerprint("{}");
        let fresh = ReserveRequest::new(
            idem_core::testing::test_scope("/v1/charges", "fresh"),
            fingerprint,
        );
        let taken = ReserveRequest::new(
            idem_core::testing::test_scope("/v1/charges", "taken-over"),
            fingerprint,
        );
        let first = acquire(fresh.clone()).await;
        acquire(taken.clone()).await;
        clock.advance(taken.lease + Duration::from_secs(1));
        let second = acquire(taken.clone()).await;
        assert_eq!(second.attempt, 2);

        let sql = store.sql.release_unconfirmed.clone();
        let kept = store.delete_in_progress(&sql, &second).await;
        let deleted = store.delete_in_progress(&sql, &first).await;
        let (kept_record, deleted_record) = (
            store.get(&taken.scope).await.expect("get"),
            store.get(&fresh.scope).await.expect("get"),
        );
        schema::drop_table(store.pool(), &table)
            .await
            .expect("drop table");
        assert!(matches!(kept, Err(StoreError::Fenced)), "{kept:?}");
        assert_eq!(kept_record.expect("kept").attempt, 2);
        deleted.expect("a first attempt is released");
        assert!(deleted_record.is_none());
    }
}
