//! Each write as it runs on the writer's connection, inside the batch's transaction:
//! plain rusqlite statements from the connection's statement cache.

use std::time::Duration;

use idem_core::{
    Clock, FencingToken, Lease, Reservation, ReserveRequest, Scope, StoreError, duration_millis,
};
use rusqlite::{OptionalExtension, params};

use crate::row::{StoredRow, corrupt};
use crate::schema::Statements;

/// A write, as queued for the writer.
#[derive(Debug)]
pub(crate) enum Op {
    Reserve(ReserveRequest),
    /// The response as the row keeps it: status, the header block
    /// (`encode_response_headers` without the ambiguity), body, the ambiguity column.
    Complete(Lease, u16, Vec<u8>, bytes::Bytes, Option<&'static str>),
    /// The reason an attempt leaves its record in progress (`Store::mark_ambiguous`).
    Mark(Lease, &'static str),
    Renew(Lease, Duration),
    Release(Lease),
    Remove(Scope),
    Purge(usize),
    /// Ends the writer once what was queued before it is written (see `Writer::close`).
    Close,
}

/// What a write returns.
#[derive(Debug)]
pub(crate) enum Done {
    Reserved(Reservation),
    Unit,
    Removed(bool),
    Purged(usize),
}

/// Maps an error of the writer's connection: a value this store never writes is a
/// corrupt record, anything else means the database cannot serve now.
pub(crate) fn store_error(e: rusqlite::Error) -> StoreError {
    match e {
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(other),
    }
}

/// Runs one operation. The outer error is a statement that failed (which may have
/// ended the transaction); the inner result is the operation's answer.
/// Runs a statement that returns no rows, such as `BEGIN IMMEDIATE` and `COMMIT`, from
/// the connection's statement cache. They run once per batch; parsing them afresh each
/// time was 4 % of the writer's instructions at four operations per batch.
pub(crate) fn run_cached(conn: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

pub(crate) fn execute(
    conn: &rusqlite::Connection,
    sql: &Statements,
    clock: &dyn Clock,
    op: Op,
) -> rusqlite::Result<idem_core::Result<Done>> {
    Ok(match op {
        Op::Reserve(req) => reserve(conn, sql, clock, &req)?.map(Done::Reserved),
        Op::Complete(lease, status, headers, body, ambiguity) => {
            let answer = (status, &headers[..], &body[..], ambiguity);
            complete(conn, sql, clock, &lease, answer)?.map(|()| Done::Unit)
        }
        Op::Mark(lease, reason) => {
            let scope = &lease.scope;
            let changed = conn.prepare_cached(&sql.mark)?.execute(params![
                scope.tenant().as_str(),
                scope.endpoint_str(),
                scope.key().as_str(),
                lease.token.as_i64(),
                clock.now().as_millis(),
                reason,
            ])?;
            if changed == 1 {
                Ok(Done::Unit)
            } else {
                Err(StoreError::Fenced)
            }
        }
        Op::Renew(lease, lease_for) => {
            let until = clock.now().plus(lease_for);
            fenced(conn, &sql.renew, clock, &lease, Some(until.as_millis()))?.map(|()| Done::Unit)
        }
        Op::Release(lease) => fenced(conn, &sql.release, clock, &lease, None)?.map(|()| Done::Unit),
        Op::Remove(scope) => {
            let n = conn.prepare_cached(&sql.remove)?.execute(params![
                scope.tenant().as_str(),
                scope.endpoint_str(),
                scope.key().as_str(),
            ])?;
            Ok(Done::Removed(n > 0))
        }
        Op::Close => unreachable!("a close is kept out of batches"),
        Op::Purge(limit) => {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let expired: Vec<(i64, bool)> = conn
                .prepare_cached(&sql.expired)?
                .query_map(params![clock.now().as_millis(), limit], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let (mut compact, mut purge) = (
                conn.prepare_cached(&sql.compact)?,
                conn.prepare_cached(&sql.purge)?,
            );
            for &(rowid, keeps_tombstone) in &expired {
                if keeps_tombstone {
                    compact.execute(params![rowid])?;
                } else {
                    purge.execute(params![rowid])?;
                }
            }
            Ok(Done::Purged(expired.len()))
        }
    })
}

/// The one-statement reserve; when it writes nothing, the row it met says the answer.
fn reserve(
    conn: &rusqlite::Connection,
    sql: &Statements,
    clock: &dyn Clock,
    req: &ReserveRequest,
) -> rusqlite::Result<idem_core::Result<Reservation>> {
    let scope = &req.scope;
    let (tenant, endpoint, key) = (
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    );
    let mut fresh = true;
    loop {
        let now = clock.now();
        let token = FencingToken::generate();
        let lease_until = now.plus(req.lease);
        let (now_ms, expires_ms, lease_ms) = (
            now.as_millis(),
            req.expires_at(now).as_millis(),
            lease_until.as_millis(),
        );
        // The parameters of both `insert` and `reserve`.
        let values = params![
            tenant,
            endpoint,
            key,
            &req.fingerprint.as_bytes()[..],
            now_ms,
            expires_ms,
            token.as_i64(),
            lease_ms,
        ];
        // First as a plain insert, which only a fresh key passes; the writer holds the
        // write lock, so the row the insert met is still there for the upsert.
        if std::mem::take(&mut fresh) && conn.prepare_cached(&sql.insert)?.execute(values)? == 1 {
            return Ok(Ok(Reservation::Acquired(req.lease_for(token, 1))));
        }
        let attempt: Option<i64> = conn
            .prepare_cached(&sql.reserve)?
            .query_row(values, |row| row.get(0))
            .optional()?;
        if let Some(attempt) = attempt {
            return Ok(match u32::try_from(attempt) {
                Ok(attempt) => Ok(Reservation::Acquired(req.lease_for(token, attempt))),
                Err(_) => Err(corrupt("attempt")),
            });
        }
        // A live record this caller may not take: read it to learn which answer
        // applies. If the clock moved so that it may now be taken (expired, lease
        // lapsed), go round and try the atomic write again.
        let row = conn
            .prepare_cached(&sql.select)?
            .query_row(params![tenant, endpoint, key], StoredRow::from_rusqlite)
            .optional()?;
        let existing = match row.map(|row| row.into_record(scope)).transpose() {
            Ok(existing) => existing,
            Err(e) => return Ok(Err(e)),
        };
        if let Some(existing) = existing
            && let Some(answer) =
                Reservation::from_existing(existing, &req.fingerprint, clock.now())
        {
            return Ok(Ok(answer));
        }
    }
}

/// Records the response, fenced; the same statements as
/// [`complete_in`](crate::SqliteStore::complete_in) runs in the caller's transaction.
fn complete(
    conn: &rusqlite::Connection,
    sql: &Statements,
    clock: &dyn Clock,
    lease: &Lease,
    (status, headers, body, ambiguity): (u16, &[u8], &[u8], Option<&str>),
) -> rusqlite::Result<idem_core::Result<()>> {
    let now = clock.now().as_millis();
    let scope = &lease.scope;
    let (tenant, endpoint, key) = (
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    );
    let changed = conn.prepare_cached(&sql.complete)?.execute(params![
        tenant,
        endpoint,
        key,
        lease.token.as_i64(),
        now,
        i64::from(status),
        headers,
        body,
        duration_millis(lease.ttl),
        duration_millis(lease.tombstone),
        ambiguity,
    ])?;
    if changed == 1 {
        return Ok(Ok(()));
    }
    // No in-progress record under this token. Completed by this very attempt is
    // success (the first response stays); anything else is fenced.
    let completed = conn
        .prepare_cached(&sql.completed_by)?
        .query_row(
            params![tenant, endpoint, key, lease.token.as_i64(), now],
            |_| Ok(()),
        )
        .optional()?;
    Ok(match completed {
        Some(()) => Ok(()),
        None => Err(StoreError::Fenced),
    })
}

/// A fenced single-statement write; no row changed means fenced.
fn fenced(
    conn: &rusqlite::Connection,
    sql: &str,
    clock: &dyn Clock,
    lease: &Lease,
    extra: Option<i64>,
) -> rusqlite::Result<idem_core::Result<()>> {
    let scope = &lease.scope;
    let mut stmt = conn.prepare_cached(sql)?;
    let (tenant, endpoint, key) = (
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    );
    let (token, now) = (lease.token.as_i64(), clock.now().as_millis());
    let changed = match extra {
        Some(v) => stmt.execute(params![tenant, endpoint, key, token, now, v])?,
        None => stmt.execute(params![tenant, endpoint, key, token, now])?,
    };
    Ok(if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    })
}
