//! [`RedisStore`]: one hash per record, every operation one script or one command on
//! that one key.

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::codec::encode_headers;
use idem_core::{
    FencingToken, Lease, Record, Reservation, ReserveRequest, Result, Scope, SharedClock, Store,
    StoreError, StoredResponse, SystemClock, Timestamp, duration_millis,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script, Value};

use crate::error::{corrupt, from_redis};
use crate::record::Fields;

/// The prefix of every record key unless [`RedisStoreBuilder::key_prefix`] sets another.
pub const DEFAULT_KEY_PREFIX: &str = "idem:";

/// How long connecting, or waiting for one reply, may take before the operation fails
/// with [`StoreError::Unavailable`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long after its logical expiry Redis deletes a record by itself. The margin
/// keeps a native delete from ever running ahead of the expiry the scripts check.
pub const DEFAULT_TTL_GRACE: Duration = Duration::from_secs(5);

/// Keys examined per `SCAN` call while purging.
const SCAN_COUNT: usize = 1_000;

/// The longest native TTL set: records meant to live longer (a `Duration::MAX` TTL)
/// are still deleted by Redis after a century, and `PEXPIRE` never overflows.
const MAX_NATIVE_TTL_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// Reserve rounds before giving up when the script and `decide` disagree (they never
/// should; the bound only keeps a bug from spinning).
const RESERVE_ROUNDS: usize = 3;

static RESERVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/reserve.lua")));
static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/complete.lua")));
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/renew.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
static PURGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/purge.lua")));

/// A [`Store`] on Redis, shared by any number of instances.
///
/// Each record is one hash at `prefix + "{" + Scope::digest() + "}"`; the braces make
/// the digest the Redis Cluster hash tag, so every operation, which is one Lua script or
/// one command touching only that key, runs on the record's own slot. Time comes from
/// the injected clock and is passed to the scripts (never Redis `TIME`). Records carry
/// a native TTL at their expiry plus [`DEFAULT_TTL_GRACE`], so Redis bounds storage by
/// itself.
///
/// The connection is one multiplexed, reconnecting [`ConnectionManager`]: clones of the
/// store share it. A store that cannot be reached fails every operation with
/// [`StoreError::Unavailable`] within about [`DEFAULT_TIMEOUT`] per attempt, and works
/// again once the server is back.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    clock: SharedClock,
    prefix: Arc<str>,
    ttl_grace_ms: i64,
    /// Where the next purge resumes its `SCAN`.
    purge_cursor: Arc<Mutex<u64>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("ttl_grace_ms", &self.ttl_grace_ms)
            .finish_non_exhaustive()
    }
}

/// Options for a [`RedisStore`]; [`connect`](RedisStoreBuilder::connect) opens it.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    clock: SharedClock,
    prefix: String,
    timeout: Duration,
    ttl_grace: Duration,
}

impl RedisStoreBuilder {
    /// Reads time from `clock` (default: [`SystemClock`]). Leases and logical expiry use
    /// it; tests pass a `ManualClock`.
    pub fn clock(mut self, clock: SharedClock) -> RedisStoreBuilder {
        self.clock = clock;
        self
    }

    /// Puts every record key under `prefix` (default [`DEFAULT_KEY_PREFIX`]). Stores
    /// with different prefixes never see each other's records.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> RedisStoreBuilder {
        self.prefix = prefix.into();
        self
    }

    /// Bounds connecting and each reply (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> RedisStoreBuilder {
        self.timeout = timeout;
        self
    }

    /// How long past its expiry Redis keeps a record (default [`DEFAULT_TTL_GRACE`]);
    /// cover the clock skew between the instances sharing the store.
    pub fn ttl_grace(mut self, grace: Duration) -> RedisStoreBuilder {
        self.ttl_grace = grace;
        self
    }

    /// Connects, failing with [`StoreError::Unavailable`] when the URL is invalid or the
    /// server cannot be reached.
    pub async fn connect(self) -> Result<RedisStore> {
        let client = Client::open(self.url.as_str()).map_err(from_redis)?;
        // One quick retry, then fail: the caller answers 503 and its client retries,
        // which beats holding requests while the server is away. The next operation
        // starts a new reconnection.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(250));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(from_redis)?;
        Ok(RedisStore {
            conn,
            clock: self.clock,
            prefix: self.prefix.into(),
            ttl_grace_ms: duration_millis(self.ttl_grace),
            purge_cursor: Arc::default(),
        })
    }
}

impl RedisStore {
    /// Options for a store at `url` (`redis://[user:password@]host:port[/db]`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            clock: Arc::new(SystemClock),
            prefix: DEFAULT_KEY_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            ttl_grace: DEFAULT_TTL_GRACE,
        }
    }

    /// A store at `url` with the default options.
    pub async fn connect(url: &str) -> Result<RedisStore> {
        RedisStore::builder(url).connect().await
    }

    /// The prefix of this store's record keys.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of `scope`'s record, for operators inspecting it (`HGETALL`).
    pub fn record_key(&self, scope: &Scope) -> String {
        format!("{}{{{}}}", self.prefix, scope.digest())
    }

    /// Runs a fenced script whose reply is 1 (done) or 0 (fenced).
    async fn fenced(&self, invocation: &redis::ScriptInvocation<'_>) -> Result<()> {
        let done: i64 = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        match done {
            1 => Ok(()),
            _ => Err(StoreError::Fenced),
        }
    }
}

/// A `PEXPIRE` argument for a record that logically lives until `until`: relative to
/// `now` on the injected clock, so the native TTL agrees with the scripts' expiry check
/// whatever the skew between that clock and the server's, plus the grace; at least
/// 1 ms and at most [`MAX_NATIVE_TTL_MS`].
fn native_ttl(grace_ms: i64, until: Timestamp, now: Timestamp) -> i64 {
    until
        .as_millis()
        .saturating_sub(now.as_millis())
        .saturating_add(grace_ms)
        .clamp(1, MAX_NATIVE_TTL_MS)
}

/// The `SCAN` pattern matching exactly the record keys under `prefix`: the prefix with
/// its glob characters escaped, then a hash tag of 64 characters (a hex digest).
fn scan_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 70);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('{');
    pattern.extend(std::iter::repeat_n('?', 64));
    pattern.push('}');
    pattern
}

#[async_trait]
impl Store for RedisStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation> {
        let key = self.record_key(&req.scope);
        for _ in 0..RESERVE_ROUNDS {
            let now = self.clock.now();
            let token = FencingToken::generate();
            let lease_until = now.plus(req.lease);
            let expires_at = req.expires_at(now);
            let reply: Value = RESERVE
                .key(&key)
                .arg(now.as_millis())
                .arg(req.fingerprint.as_bytes().as_slice())
                .arg(token.as_u64())
                .arg(lease_until.as_millis())
                .arg(expires_at.as_millis())
                .arg(native_ttl(self.ttl_grace_ms, expires_at, now))
                .arg(native_ttl(self.ttl_grace_ms, lease_until, now))
                .arg(req.scope.tenant().as_str())
                .arg(req.scope.endpoint_str())
                .arg(req.scope.key().as_str())
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(from_redis)?;
            if let Value::Int(attempt) = reply {
                let attempt = u32::try_from(attempt).map_err(|_| corrupt("attempt", attempt))?;
                return Ok(Reservation::Acquired(Lease {
                    scope: req.scope.clone(),
                    token,
                    attempt,
                }));
            }
            let record = Fields::from_reply(reply)?
                .ok_or_else(|| corrupt("*", "the reserve script returned no record"))?
                .into_record()?;
            // The digest makes another scope's record unreachable; checking costs
            // nothing and keeps one tenant's answer from ever reaching another.
            if record.scope != req.scope {
                return Err(StoreError::Corrupt(format!(
                    "the record at {key} belongs to another scope"
                )));
            }
            if let Some(reservation) = Reservation::from_existing(record, &req.fingerprint, now) {
                return Ok(reservation);
            }
        }
        Err(StoreError::Corrupt(format!(
            "the reserve script and the decision table disagree about {key}"
        )))
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        let now = self.clock.now();
        self.fenced(
            COMPLETE
                .key(self.record_key(&lease.scope))
                .arg(lease.token.as_u64())
                .arg(now.as_millis())
                .arg(response.status)
                .arg(encode_headers(&response.headers))
                .arg(&response.body[..]),
        )
        .await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        let now = self.clock.now();
        let lease_until = now.plus(lease_for);
        self.fenced(
            RENEW
                .key(self.record_key(&lease.scope))
                .arg(lease.token.as_u64())
                .arg(now.as_millis())
                .arg(lease_until.as_millis())
                .arg(native_ttl(self.ttl_grace_ms, lease_until, now)),
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let now = self.clock.now();
        self.fenced(
            RELEASE
                .key(self.record_key(&lease.scope))
                .arg(lease.token.as_u64())
                .arg(now.as_millis()),
        )
        .await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        let reply: Value = redis::cmd("HGETALL")
            .arg(self.record_key(scope))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Fields::from_reply(reply)?
            .map(Fields::into_record)
            .transpose()
    }

    async fn remove(&self, scope: &Scope) -> Result<bool> {
        let removed: i64 = redis::cmd("DEL")
            .arg(self.record_key(scope))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Ok(removed > 0)
    }

    /// Native TTLs are what bound storage in production: Redis deletes each record
    /// [`DEFAULT_TTL_GRACE`] after its expiry by itself. This purge exists so expiry by
    /// an injected clock (which Redis cannot see) is also honoured: it walks the
    /// prefix with `SCAN`, resuming where the previous call stopped, and deletes each
    /// record that has expired by the store's clock with a script that checks again on
    /// the server. A call ends after `limit` deletions or at the end of one pass over
    /// the keyspace, whichever comes first. On a cluster it sees only the node the
    /// connection reaches.
    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        if limit == 0 {
            return Ok(0);
        }
        let now = self.clock.now();
        let pattern = scan_pattern(&self.prefix);
        let mut conn = self.conn.clone();
        let mut cursor = *self.purge_cursor.lock().unwrap_or_else(|e| e.into_inner());
        let mut purged = 0;
        let save = |at: u64| *self.purge_cursor.lock().unwrap_or_else(|e| e.into_inner()) = at;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await
                .map_err(from_redis)?;
            for key in keys {
                if purged == limit {
                    // Resume at this page: its remaining keys are not yet examined.
                    save(cursor);
                    return Ok(purged);
                }
                let deleted: i64 = PURGE
                    .key(key)
                    .arg(now.as_millis())
                    .invoke_async(&mut conn)
                    .await
                    .map_err(from_redis)?;
                purged += usize::from(deleted == 1);
            }
            cursor = next;
            if cursor == 0 || purged == limit {
                save(cursor);
                return Ok(purged);
            }
        }
    }

    async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(from_redis)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_pattern_escapes_glob_characters_and_matches_one_record_key_shape() {
        let hex64 = "?".repeat(64);
        assert_eq!(scan_pattern("idem:"), format!("idem:{{{hex64}}}"));
        assert_eq!(
            scan_pattern("a*b?[c]\\"),
            format!("a\\*b\\?\\[c\\]\\\\{{{hex64}}}")
        );
    }

    #[test]
    fn native_ttl_is_remaining_life_plus_grace_within_bounds() {
        let now = Timestamp::from_millis(1_000_000);
        assert_eq!(
            native_ttl(5_000, now.plus(Duration::from_secs(60)), now),
            65_000
        );
        // Already past: deleted soon, never a zero or negative PEXPIRE.
        assert_eq!(native_ttl(0, now, now), 1);
        assert_eq!(native_ttl(0, Timestamp::from_millis(0), now), 1);
        assert_eq!(
            native_ttl(5_000, Timestamp::from_millis(i64::MAX), now),
            MAX_NATIVE_TTL_MS
        );
    }
}
