//! A [`RedisStore`]'s reserve: the one command that writes a fresh record or reads the
//! one there, the takeover of a record the decision says to execute, and the release of
//! a reservation whose reply never came.

use std::sync::LazyLock;

use bytes::Bytes;
use idem_core::{
    Decision, FencingToken, Reservation, ReserveRequest, Result, StoreError, decide,
    release_unconfirmed,
};
use redis::{RedisError, RedisResult, Script};

use crate::record::{FENCED_LEN, InProgress};
use crate::store::{RedisStore, bump, decode, evalsha, evalsha_with_tombstone, native_ttl};

/// Reserve rounds before giving up when every takeover found the record changed since
/// it was read. Each lost round means another caller wrote the record in between, and
/// the next round reads what it wrote (a live lease or an answer, almost always), so
/// more than two rounds take a storm of writes to one key.
const RESERVE_ROUNDS: usize = 3;

static TAKE_OVER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/take_over.lua")));
static RESERVE_TOMBSTONED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/reserve_tombstoned.lua")));

impl RedisStore {
    /// [`Store::reserve`](idem_core::Store::reserve): `SET NX GET` (or, with
    /// tombstones, a script) writes a fresh record or returns the one there, which
    /// [`decide`] judges; a record to take over is replaced only if it is still the one
    /// read.
    pub(crate) async fn reserve_record(&self, req: &ReserveRequest) -> Result<Reservation> {
        let key = self.record_key(&req.scope);
        for _ in 0..RESERVE_ROUNDS {
            let now = self.clock.now();
            let token = FencingToken::generate();
            let lease_until = now.plus(req.lease);
            let expires_at = req.expires_at(now);
            let fresh = InProgress {
                scope: &req.scope,
                fingerprint: &req.fingerprint,
                token,
                created_at: now,
                expires_at,
                lease_until,
                attempt: 1,
            };
            let fresh_ttl = native_ttl(self.ttl_grace_ms, expires_at, now);
            // Writes the record if the key is free, else returns what holds it: with
            // tombstones, a live tombstone of an expired record too.
            let fresh_value = fresh.encode();
            let reply = if req.tombstone.is_zero() {
                let mut set = redis::cmd("SET");
                set.arg(&key)
                    .arg(&fresh_value)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(fresh_ttl);
                self.with_wait::<Option<Vec<u8>>>(&set, None, &key).await
            } else {
                let mut cmd = evalsha_with_tombstone(
                    &RESERVE_TOMBSTONED,
                    &key,
                    &self.tombstone_key(&req.scope),
                );
                cmd.arg(&fresh_value).arg(fresh_ttl).arg(now.as_millis());
                self.with_wait::<Option<Vec<u8>>>(&cmd, Some(&RESERVE_TOMBSTONED), &key)
                    .await
            };
            let (existing, acked) = self.confirmed(reply, req, token, 1)?;
            let Some(existing) = existing else {
                self.replicated(acked, req, token, 1).await?;
                return Ok(acquired(req, token, 1));
            };
            let existing = Bytes::from(existing);
            let record = decode(&key, existing.clone())?;
            if record.token == token {
                // This very command, sent again by the cluster client after the
                // connection to the node dropped: the first one wrote the record.
                self.replicated(acked, req, token, 1).await?;
                return Ok(acquired(req, token, 1));
            }
            // The digest makes another scope's record unreachable; checking costs
            // nothing and keeps one tenant's answer from ever reaching another.
            if record.scope != req.scope {
                return Err(StoreError::Corrupt(format!(
                    "the record at {key} belongs to another scope"
                )));
            }
            let expired = record.is_expired(now);
            let (created_at, old_expiry) = (record.created_at, record.expires_at);
            let attempt = match decide(Some(record), &req.fingerprint, now) {
                Decision::Execute { attempt } => attempt,
                Decision::Replay(response) => return Ok(Reservation::Replay(response)),
                Decision::InProgress { retry_after } => {
                    return Ok(Reservation::InProgress { retry_after });
                }
                Decision::Mismatch => return Ok(Reservation::Mismatch),
                Decision::Gone {
                    completed_at,
                    status,
                } => {
                    return Ok(Reservation::Gone {
                        completed_at,
                        status,
                    });
                }
            };
            // The head the decision was made on (a decoded record is longer).
            let head = &existing[..FENCED_LEN];
            let (won, acked) = if expired {
                // Replaced whole: nothing of the old record (its answer) survives.
                let reply = self
                    .take_over(&key, head, &fresh_value, Some(fresh_ttl))
                    .await;
                self.confirmed(reply, req, token, attempt)?
            } else {
                // A lapsed lease of the same payload: attempt n+1 keeps created_at, and
                // the record lives at least as long as the new lease.
                let expires_at = old_expiry.max(lease_until);
                let next = InProgress {
                    created_at,
                    expires_at,
                    attempt,
                    ..fresh
                };
                let ttl = (expires_at > old_expiry)
                    .then(|| native_ttl(self.ttl_grace_ms, expires_at, now));
                let reply = self.take_over(&key, head, &next.encode(), ttl).await;
                self.confirmed(reply, req, token, attempt)?
            };
            if won {
                self.replicated(acked, req, token, attempt).await?;
                return Ok(acquired(req, token, attempt));
            }
        }
        Err(StoreError::unavailable(format!(
            "the record at {key} changed under each of {RESERVE_ROUNDS} attempts to take it \
             over"
        )))
    }

    /// `reply` to a command that writes the reservation `token` for `req`, as the
    /// store's result. When the error leaves open whether the server ran the command
    /// (the connection dropped or timed out after it was sent) and the reservation is a
    /// first attempt, first starts releasing what it may have written, so that the key
    /// is not held for a lease that no one has (see [`release_unconfirmed`]). A
    /// takeover's record is left to lapse: deleting it would hide from the next attempt
    /// that an earlier one may have acted.
    fn confirmed<T>(
        &self,
        reply: RedisResult<T>,
        req: &ReserveRequest,
        token: FencingToken,
        attempt: u32,
    ) -> Result<T> {
        reply.map_err(|e| {
            if releases_after(&e, attempt) {
                bump(&self.counters.unconfirmed_reservations);
                release_unconfirmed(self, req.lease_for(token, attempt));
            }
            self.failed(e)
        })
    }

    /// Replaces the record at `key` with `new` if its head is still `head`; whether it
    /// did, and how many replicas acknowledged when replication is set.
    async fn take_over(
        &self,
        key: &str,
        head: &[u8],
        new: &[u8],
        native_ttl: Option<i64>,
    ) -> RedisResult<(bool, Option<i64>)> {
        let mut cmd = evalsha(&TAKE_OVER, key);
        cmd.arg(head).arg(new);
        match native_ttl {
            Some(ms) => cmd.arg(ms),
            None => cmd.arg(""),
        };
        let (won, acked) = self.with_wait::<i64>(&cmd, Some(&TAKE_OVER), key).await?;
        Ok((won == 1, acked))
    }
}

/// Whether a reserve of `attempt` that failed with `e` may have written a reservation to
/// release: only a first attempt (a takeover's record must lapse), and only after an
/// I/O failure other than a refused connection (the command was sent, and the reply
/// never came). Server errors mean it did not run; a refused connection means it was
/// never sent.
pub(crate) fn releases_after(e: &RedisError, attempt: u32) -> bool {
    attempt == 1 && e.is_io_error() && !e.is_connection_refusal()
}

/// The lease of a reservation this caller won.
fn acquired(req: &ReserveRequest, token: FencingToken, attempt: u32) -> Reservation {
    Reservation::Acquired(req.lease_for(token, attempt))
}
