//! The write path: a reserve without gap locks, and the fenced writes of an attempt.
//!
//! A reserve is a plain `INSERT` of the fresh record, which the primary key refuses
//! with a duplicate-key error (1062) where a row exists; then a plain read of the row,
//! which [`Reservation::from_existing`] interprets; only where it says the record may
//! be taken over, an `UPDATE` by primary key, fenced on the token, state and expiry
//! read and on a `WHERE` that holds exactly the rows a reserve may take over (a row
//! that changed in between is read again). New key: one statement; in progress or
//! completed: two; takeover: three. Each is its own statement in autocommit, so no
//! statement holds a lock past its own end, and none reads a range: the duplicate's shared lock on the existing key and the update's exclusive
//! one on it are record locks, not the gap or next-key locks that
//! `INSERT … ON DUPLICATE KEY UPDATE` or a `SELECT … FOR UPDATE` of a missing row take
//! under REPEATABLE READ, on which concurrent duplicates deadlock. A deadlock (1213) or
//! lock wait timeout (1205) InnoDB still reports rolled the statement back, and the
//! store runs it again, a bounded number of times.

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_core::{
    FencingToken, Lease, Reservation, ReserveRequest, StoreError, StoredResponse, Timestamp,
    duration_millis, release_unconfirmed_with,
};
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use crate::error::{DUPLICATE_KEY, fenced_unless_one, lost_a_lock, number, store_error};
use crate::statements::{Extra, record_from_row, row_id};
use crate::store::MySqlStore;

/// How many times a reserve looks again at a row that changed under it (a release or
/// an expiry between its statements) before it gives up as unavailable.
pub(crate) const RESERVE_ROUNDS: usize = 16;

/// How many times a statement InnoDB rolled back for a lock (1213, 1205) runs again
/// before the operation fails as unavailable.
pub(crate) const LOCK_RETRIES: u32 = 8;

/// What one round of a reserve found: an answer, or a row that changed between its
/// statements, to look at again.
pub(crate) enum Round {
    Answer(Reservation),
    Again,
}

impl MySqlStore {
    /// [`Store::reserve`](idem_core::Store::reserve): rounds of insert, read, take over,
    /// until one answers.
    pub(crate) async fn reserve_record(
        &self,
        req: &ReserveRequest,
    ) -> Result<Reservation, StoreError> {
        self.bounded(async {
            let mut lost = 0;
            let mut rounds = 0;
            while rounds < RESERVE_ROUNDS {
                match self.reserve_round(req).await {
                    Ok(Round::Answer(r)) => return Ok(r),
                    Ok(Round::Again) => rounds += 1,
                    Err(e) if lost_a_lock(&e) && lost < LOCK_RETRIES => {
                        lost += 1;
                        self.lock_retries.fetch_add(1, Ordering::Relaxed);
                        backoff(lost).await;
                    }
                    Err(e) => return Err(store_error(e)),
                }
            }
            Err(StoreError::unavailable(
                "reserve kept racing concurrent writers; try again",
            ))
        })
        .await
    }

    async fn reserve_round(&self, req: &ReserveRequest) -> Result<Round, sqlx::Error> {
        let now = self.clock.now();
        let token = FencingToken::generate();
        let lease_until = now.plus(req.lease).as_millis();
        let expires_at = req.expires_at(now).as_millis();
        let scope = &req.scope;
        let id = row_id(scope);
        let fingerprint = &req.fingerprint.as_bytes()[..];
        // Armed until the insert's outcome is known: if it fails in a way that leaves
        // open whether it committed, or this future is dropped mid-flight (the operation
        // timeout), the reservation it may have written is released in the background.
        let mut unconfirmed = Unconfirmed {
            store: self,
            lease: Some(req.lease_for(token, 1)),
        };
        let inserted = sqlx::query(AssertSqlSafe(self.sql.insert.as_str()))
            .bind(&id)
            .bind(scope.tenant().as_str())
            .bind(scope.endpoint_str())
            .bind(scope.key().as_str())
            .bind(fingerprint)
            .bind(now.as_millis())
            .bind(expires_at)
            .bind(token.as_i64())
            .bind(lease_until)
            .execute(&self.pool)
            .await;
        if !matches!(&inserted, Err(e) if may_have_run(e)) {
            unconfirmed.lease = None;
        }
        match inserted {
            Ok(_) => {
                return Ok(Round::Answer(Reservation::Acquired(
                    req.lease_for(token, 1),
                )));
            }
            Err(e) if number(&e) == Some(DUPLICATE_KEY) => {}
            Err(e) => return Err(e),
        }
        // One connection for the read and the takeover: the pool pings each connection
        // as it comes back (a command per release), so one release for both. The insert
        // goes through the pool, as before: with a connection held across it, a reserve
        // dropped mid-insert left its reservation unreleased (tests/unconfirmed.rs).
        let mut conn = self.pool.acquire().await?;
        // A plain read of the row, whose answer decide() gives unless the record may be
        // taken over.
        let row = sqlx::query(AssertSqlSafe(self.sql.get.as_str()))
            .bind(&id)
            .fetch_optional(&mut *conn)
            .await?;
        // No row: it was released or removed since the insert; look again.
        let Some(row) = row else {
            return Ok(Round::Again);
        };
        self.settle_on(&mut conn, req, token, now, &row).await
    }

    /// What a reserve of `req` makes of the row it read: the answer decide() gives, or
    /// where that is to execute, the row taken over under `token` on `conn` if it is
    /// still the row read.
    pub(crate) async fn settle_on(
        &self,
        conn: &mut MySqlConnection,
        req: &ReserveRequest,
        token: FencingToken,
        now: Timestamp,
        row: &MySqlRow,
    ) -> Result<Round, sqlx::Error> {
        let scope = &req.scope;
        let state: String = sqlx::Row::try_get(row, "state")?;
        let existing = record_from_row(scope, row).map_err(|e| sqlx::Error::Decode(e.into()))?;
        let read = (existing.token, existing.expires_at, existing.attempt);
        if let Some(answer) = Reservation::from_existing(existing, &req.fingerprint, now) {
            return Ok(Round::Answer(answer));
        }
        // decide() says Execute: the update takes the row over only if it is still the
        // row read (same attempt's token, state and expiry) and its WHERE still holds, so
        // the attempt it writes is the one computed here from what was read.
        let (read_token, read_expires, read_attempt) = read;
        let lease_until = now.plus(req.lease).as_millis();
        let expires_at = req.expires_at(now).as_millis();
        let fingerprint = &req.fingerprint.as_bytes()[..];
        let took = sqlx::query(AssertSqlSafe(self.sql.take_over.as_str()))
            .bind(now.as_millis())
            .bind(now.as_millis())
            .bind(now.as_millis())
            .bind(now.as_millis())
            .bind(expires_at)
            .bind(lease_until)
            .bind(fingerprint)
            .bind(token.as_i64())
            .bind(lease_until)
            .bind(row_id(scope))
            .bind(read_token.as_i64())
            .bind(&state)
            .bind(read_expires.as_millis())
            .bind(now.as_millis())
            .bind(now.as_millis())
            .bind(now.as_millis())
            .bind(fingerprint)
            .execute(&mut *conn)
            .await?;
        if took.rows_affected() != 1 {
            // Changed since the read (completed, released, renewed, taken by another):
            // look again.
            return Ok(Round::Again);
        }
        let attempt = if read_expires.as_millis() <= now.as_millis() {
            1
        } else {
            read_attempt.min(2_147_483_646) + 1
        };
        Ok(Round::Answer(Reservation::Acquired(
            req.lease_for(token, attempt),
        )))
    }

    /// Completes `lease` on `conn`: the fenced update, or, where it matched nothing,
    /// whether this lease completed the record already (completing twice succeeds).
    pub(crate) async fn complete_on(
        &self,
        conn: &mut MySqlConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), sqlx::Error> {
        let now = self.clock.now().as_millis();
        let id = row_id(&lease.scope);
        let headers = idem_core::codec::encode_response_headers(response, false);
        let ttl = duration_millis(lease.ttl);
        let tombstone = duration_millis(lease.tombstone);
        let mut query = sqlx::query(AssertSqlSafe(self.sql.complete.as_str()))
            .bind(i32::from(response.status))
            .bind(&headers[..])
            .bind(&response.body[..])
            .bind(now)
            .bind(response.ambiguity().map(|a| a.as_str()));
        for _ in 0..3 {
            query = query.bind(tombstone).bind(ttl).bind(ttl);
        }
        let done = query
            .bind(&id)
            .bind(lease.token.as_i64())
            .bind(now)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        let already: Option<i32> =
            sqlx::query_scalar(AssertSqlSafe(self.sql.completed_by.as_str()))
                .bind(&id)
                .bind(lease.token.as_i64())
                .bind(now)
                .fetch_optional(&mut *conn)
                .await?;
        match already {
            Some(_) => Ok(()),
            None => Err(sqlx::Error::RowNotFound),
        }
    }

    /// A fenced write on the lease's row (`sql` binds `extra` first, then the row's
    /// id, the token and now), retried where InnoDB rolled it back for a lock.
    pub(crate) async fn fenced(
        &self,
        sql: &str,
        lease: &Lease,
        extra: &[Extra<'_>],
    ) -> Result<(), StoreError> {
        let id = row_id(&lease.scope);
        let rows = self
            .retrying(|| {
                let now = self.clock.now().as_millis();
                let mut query = sqlx::query(AssertSqlSafe(sql));
                for value in extra {
                    query = match value {
                        Extra::Int(v) => query.bind(*v),
                        Extra::Text(v) => query.bind(*v),
                    };
                }
                let query = query.bind(&id).bind(lease.token.as_i64()).bind(now);
                async move { query.execute(&self.pool).await.map(|d| d.rows_affected()) }
            })
            .await?;
        fenced_unless_one(rows)
    }

    /// Runs `op` again where InnoDB rolled it back for a lock, at most
    /// [`LOCK_RETRIES`] times, within the operation timeout.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        self.bounded(async {
            let mut lost = 0;
            loop {
                match op().await {
                    Ok(v) => return Ok(v),
                    Err(e) if lost_a_lock(&e) && lost < LOCK_RETRIES => {
                        lost += 1;
                        self.lock_retries.fetch_add(1, Ordering::Relaxed);
                        backoff(lost).await;
                    }
                    Err(e) => return Err(store_error(e)),
                }
            }
        })
        .await
    }

    /// [`complete_on`](Self::complete_on) on a pooled connection, retried where InnoDB
    /// rolled it back for a lock.
    pub(crate) async fn complete_pooled(
        &self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let done = self
            .retrying(|| async {
                let mut conn = self.pool.acquire().await?;
                match self.complete_on(&mut conn, lease, response).await {
                    Err(sqlx::Error::RowNotFound) => Ok(false),
                    other => other.map(|()| true),
                }
            })
            .await?;
        if done {
            Ok(())
        } else {
            Err(StoreError::Fenced)
        }
    }
}

/// A pause before a statement rolled back for a lock runs again, longer each time, so
/// that the transactions that deadlocked do not meet again at once.
async fn backoff(lost: u32) {
    let jitter = FencingToken::generate().as_i64().unsigned_abs() % 5;
    tokio::time::sleep(Duration::from_millis(u64::from(lost) * 5 + jitter)).await;
}

/// A first attempt's reservation whose insert may have committed unseen; released by
/// its token when dropped armed, so that a retry soon executes rather than waiting out
/// the lease.
pub(crate) struct Unconfirmed<'a> {
    pub(crate) store: &'a MySqlStore,
    /// The reservation, while its outcome is unknown.
    pub(crate) lease: Option<Lease>,
}

impl Drop for Unconfirmed<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.store.release_in_background(lease);
        }
    }
}

/// The least time a release of an unconfirmed reservation gets, whatever the store's
/// operation timeout: the caller that timed out gave up on its reserve, not on freeing
/// the key its reserve may have taken.
const MIN_RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

impl MySqlStore {
    /// Releases, fenced by its token and in the background, a reservation written (or
    /// perhaps written) for a caller that never heard of it, so that its retry executes
    /// at once rather than after the lease.
    pub(crate) fn release_in_background(&self, lease: Lease) {
        let mut store = self.clone();
        store.operation_timeout = store.operation_timeout.max(MIN_RELEASE_TIMEOUT);
        release_unconfirmed_with(move || {
            let (store, lease) = (store.clone(), lease.clone());
            async move {
                let sql = store.sql.release_unconfirmed.as_str();
                store.fenced(sql, &lease, &[]).await
            }
        });
    }
}

/// Whether a statement that failed with `e` may still have committed: the connection
/// broke or the conversation went wrong after it was sent. A server's error means it
/// failed and rolled back; a pool error means it was never sent.
fn may_have_run(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
    use idem_core::{ManualClock, Store};
    use idem_test_support::service_unavailable;
    use idem_test_support::services::mysql_url;

    use super::*;
    use crate::{SetupError, schema};

    /// The release of a reservation whose reply was lost deletes a first attempt, and
    /// never a takeover's record: that one lapses, so the next attempt still runs as a
    /// recovered one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unconfirmed_release_deletes_first_attempts_only() {
        let url = mysql_url();
        let clock = ManualClock::starting_now();
        let table = format!("idem_records_{}", unique_namespace("unconfirmed"));
        let store = match MySqlStore::builder()
            .table(&table)
            .clock(Arc::new(clock.clone()))
            .connect(&url)
            .await
        {
            Ok(s) => s,
            Err(e @ SetupError::Unreachable { .. }) => {
                return service_unavailable("MySQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        let acquire = async |req: &ReserveRequest| match store.reserve(req).await {
            Ok(Reservation::Acquired(lease)) => lease,
            other => panic!("expected to acquire, got {other:?}"),
        };
        let fresh = ReserveRequest::new(test_scope("/v1/charges", "fresh"), test_fingerprint("{}"));
        let taken = ReserveRequest::new(test_scope("/v1/charges", "taken"), test_fingerprint("{}"));
        let first = acquire(&fresh).await;
        acquire(&taken).await;
        clock.advance(taken.lease + Duration::from_secs(1));
        let second = acquire(&taken).await;
        assert_eq!(second.attempt, 2);

        let sql = store.sql.release_unconfirmed.clone();
        let kept = store.fenced(&sql, &second, &[]).await;
        let deleted = store.fenced(&sql, &first, &[]).await;
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
