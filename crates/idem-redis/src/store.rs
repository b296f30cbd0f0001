//! [`RedisStore`]: one string per record, every operation one command or one script
//! on that one key.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{
    Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest, Result, Scope, SharedClock,
    Store, StoreError, StoreMetric, StoredResponse, Timestamp, Watch, duration_millis,
};
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Script};

use crate::conn::Conn;
use crate::error::from_redis;
use crate::eviction::EvictionRisk;
use crate::record;
use crate::subscribe::Subscriber;
use crate::target::Replication;

/// The prefix of every record key unless [`RedisStoreBuilder::key_prefix`](crate::RedisStoreBuilder::key_prefix) sets
/// another.
pub const DEFAULT_KEY_PREFIX: &str = "idem:";

/// How long connecting, or waiting for one reply, may take before the operation fails
/// with [`StoreError::Unavailable`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long after its logical expiry Redis deletes a record by itself. The margin
/// keeps a native delete from ever running ahead of the expiry the scripts check.
pub const DEFAULT_TTL_GRACE: Duration = Duration::from_secs(5);

/// Keys examined per `SCAN` call while purging.
pub(crate) const SCAN_COUNT: usize = 1_000;

/// The longest native TTL set: records meant to live longer (a `Duration::MAX` TTL)
/// are still deleted by Redis after a century, and `PX` never overflows.
const MAX_NATIVE_TTL_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

pub(crate) static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/complete.lua")));
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/renew.lua")));
static MARK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../scripts/mark.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
pub(crate) static PURGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/purge.lua")));
static TAKE_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/take_token.lua")));
/// A [`Store`] on Redis, shared by any number of instances.
///
/// Each record is one string at `prefix + "{" + Scope::digest() + "}"`: a fixed-width
/// binary head (token, expiry, lease, state, creation, attempt, fingerprint), the
/// scope's parts, and for a completed record its answer; the crate docs give the
/// layout. The braces make the digest the Redis Cluster hash tag, so every operation,
/// which is one command or one Lua script touching only that key, runs on the record's
/// own slot.
///
/// Reserving a fresh key is one native command, `SET key record NX GET PX ttl`: it
/// writes the in-progress record when the key is free and otherwise returns what is
/// there, which [`idem_core::decide`] judges. Only when that says to execute (the record
/// expired, or its lease lapsed) does a script replace the record, and only if it is
/// still the one read. Complete, renew and release are each one small script fenced by
/// the attempt's token. Time comes from the injected clock and is passed to the server
/// (never Redis `TIME`). Records carry a native TTL at their expiry plus
/// [`DEFAULT_TTL_GRACE`], so Redis bounds storage by itself.
///
/// A reserve whose command may have run although its reply never came (the connection
/// dropped or timed out after sending) fails with [`StoreError::Unavailable`], and for a
/// first attempt the store then releases, in the background, the reservation it may
/// have written, fenced by the token it sent ([`idem_core::release_unconfirmed`]).
/// Without that, a retry of the key would get "in progress" until the lease lapsed, for
/// an attempt that no one runs. A takeover's record (attempt n+1) is left to lapse, so
/// that the next attempt still runs as a recovered one.
///
/// The connection is one multiplexed, reconnecting connection (a
/// [`ConnectionManager`](redis::aio::ConnectionManager) to one server, or redis-rs's
/// cluster client on a Redis Cluster): clones of the store share it. A store that cannot be reached fails every operation with
/// [`StoreError::Unavailable`] within about [`DEFAULT_TIMEOUT`] per attempt, and works
/// again once the server is back.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Conn,
    pub(crate) clock: SharedClock,
    pub(crate) prefix: Arc<str>,
    pub(crate) ttl_grace_ms: i64,
    /// How many replicas must hold a reservation or a completion, if any.
    pub(crate) replication: Option<Replication>,
    /// Where the next purge resumes its `SCAN`.
    pub(crate) purge_cursor: Arc<Mutex<u64>>,
    /// On a cluster, the master (by its place among the sorted masters) and the cursor
    /// where the next purge resumes.
    pub(crate) node_cursor: Arc<Mutex<(usize, u64)>>,
    /// What the store met, for [`Store::metrics`]; shared by clones.
    pub(crate) counters: Arc<Counters>,
    /// The server's memory settings, if they let it evict records; read on connecting.
    pub(crate) eviction: Option<Arc<EvictionRisk>>,
    /// The subscriber that tells waiting duplicates of completions and releases (SPEC
    /// S15); `None` on a Redis Cluster, or when connected outside a tokio runtime.
    pub(crate) subscriber: Option<Arc<Subscriber>>,
}

/// Counts of events an operator wants to see, all since the store was opened.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Commands that got an error instead of an answer.
    failed_commands: AtomicU64,
    /// Scripts loaded again after the server answered `NOSCRIPT`.
    pub(crate) script_loads: AtomicU64,
    /// First reservations whose reply never came, released in the background.
    pub(crate) unconfirmed_reservations: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
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

impl RedisStore {
    /// The prefix of this store's record keys.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The server's memory settings if, when the store connected, they let it evict
    /// records (see [`EvictionRisk`]); `None` when they did not, or could not be read.
    /// The store logs a warning when it finds them; a service that wants to refuse to
    /// start on such a server can check this.
    pub fn eviction_risk(&self) -> Option<&EvictionRisk> {
        self.eviction.as_deref()
    }

    /// The Redis key of `scope`'s record, for operators inspecting it: `PTTL` shows
    /// its native TTL, `GET` (or `GETRANGE key 0 82` for the head) its value in the
    /// binary layout the crate docs describe; [`Store::get`] decodes it.
    pub fn record_key(&self, scope: &Scope) -> String {
        let digest = scope.digest();
        let mut key = String::with_capacity(self.prefix.len() + digest.len() + 2);
        key.push_str(&self.prefix);
        key.push('{');
        key.push_str(&digest);
        key.push('}');
        key
    }

    /// The Redis key of `scope`'s tombstone (SPEC S16), beside its record's under the
    /// same hash tag: the record's key and `t`. Written when a record reserved with a
    /// tombstone TTL completes, in the record's layout with state `T` and no answer,
    /// with a native TTL at the tombstone's end.
    pub fn tombstone_key(&self, scope: &Scope) -> String {
        let mut key = self.record_key(scope);
        key.push('t');
        key
    }

    /// The Redis key of the secret `name` ([`Store::init_secret`]): the prefix, `meta:`
    /// and the name. It has no TTL.
    pub fn secret_key(&self, name: &str) -> String {
        format!("{}meta:{name}", self.prefix)
    }

    /// Has a complete or release script publish the scope's digest on the store's
    /// channel once it has written, for waiters on every instance (SPEC S15); nothing
    /// on a Redis Cluster, whose waiters poll.
    fn announce(&self, cmd: &mut Cmd, scope: &Scope) {
        if let Some(subscriber) = &self.subscriber {
            cmd.arg(&subscriber.channel).arg(scope.digest());
        }
    }

    /// Waits up to `within` for the store's subscriber, so that a duplicate waiting
    /// from now on hears of completions rather than polling; whether it is up (never
    /// on a Redis Cluster).
    pub async fn listening(&self, within: Duration) -> bool {
        match &self.subscriber {
            Some(subscriber) => subscriber.feed.ready(within).await,
            None => false,
        }
    }

    /// Runs `cmd`, an `EVALSHA` of `script` built by [`evalsha`]; when the server does
    /// not know the script (it restarted, or its cache was flushed) loads it and runs
    /// `cmd` again.
    pub(crate) async fn eval<T: FromRedisValue>(&self, script: &Script, cmd: &Cmd) -> Result<T> {
        self.eval_raw(script, cmd).await.map_err(|e| self.failed(e))
    }

    /// A command's error as the store's, counted.
    pub(crate) fn failed(&self, e: RedisError) -> StoreError {
        bump(&self.counters.failed_commands);
        from_redis(e)
    }

    /// [`eval`](Self::eval) with Redis's own error, for callers that look at it.
    pub(crate) async fn eval_raw<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        let mut conn = self.conn.clone();
        match cmd.query_async(&mut conn).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                bump(&self.counters.script_loads);
                script.load_async(&mut conn).await?;
                cmd.query_async(&mut conn).await
            }
            reply => reply,
        }
    }

    /// Runs a fenced script whose reply is 1 (done), 0 (fenced) or -1 (the key holds
    /// something that is not a record).
    async fn fenced(&self, script: &Script, cmd: &Cmd, key: &str) -> Result<()> {
        match self.eval::<i64>(script, cmd).await? {
            1 => Ok(()),
            -1 => Err(not_a_record(key)),
            _ => Err(StoreError::Fenced),
        }
    }
}

/// `EVALSHA` of `script` on the one key `key`, for the caller to add the arguments: the
/// command built once, straight from the values (`Script::invoke_async` would copy each
/// argument twice).
pub(crate) fn evalsha(script: &Script, key: impl redis::ToRedisArgs) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(1).arg(key);
    cmd
}

/// [`evalsha`] of a script that also reads or writes the record's tombstone (SPEC
/// S16): the record's key, then its tombstone's, in the same hash slot.
pub(crate) fn evalsha_with_tombstone(script: &Script, key: &str, tombstone_key: &str) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(2)
        .arg(key)
        .arg(tombstone_key);
    cmd
}

/// The record stored at `key`; a value that is not one is [`StoreError::Corrupt`],
/// naming the key.
pub(crate) fn decode(key: &str, value: Bytes) -> Result<Record> {
    record::decode(value).map_err(|e| match e {
        StoreError::Corrupt(why) => StoreError::Corrupt(format!("{key}: {why}")),
        other => other,
    })
}

/// The error for a key under the store's prefix whose string value is not a record.
fn not_a_record(key: &str) -> StoreError {
    StoreError::Corrupt(format!("the value at {key} is not a record of this store"))
}

/// A `PX` argument for a record that logically lives until `until`: relative to
/// `now` on the injected clock, so the native TTL agrees with the scripts' expiry check
/// whatever the skew between that clock and the server's, plus the grace; at least
/// 1 ms and at most [`MAX_NATIVE_TTL_MS`].
pub(crate) fn native_ttl(grace_ms: i64, until: Timestamp, now: Timestamp) -> i64 {
    until
        .as_millis()
        .saturating_sub(now.as_millis())
        .saturating_add(grace_ms)
        .clamp(1, MAX_NATIVE_TTL_MS)
}

/// The `SCAN` pattern matching the record and tombstone keys under `prefix`: the prefix
/// with its glob characters escaped, then a hash tag of 64 characters (a hex digest),
/// then anything (nothing for a record, `t` for its tombstone).
pub(crate) fn scan_pattern(prefix: &str) -> String {
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
    // And the tombstone beside it.
    pattern.push('*');
    pattern
}

#[async_trait]
impl Store for RedisStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation> {
        self.reserve_record(req).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        let now = self.clock.now();
        let key = self.record_key(&lease.scope);
        let mut cmd = evalsha_with_tombstone(&COMPLETE, &key, &self.tombstone_key(&lease.scope));
        cmd.arg(&lease.token.as_u64().to_be_bytes())
            .arg(now.as_millis())
            .arg(&now.as_millis().to_be_bytes())
            .arg(record::encode_answer_head(response))
            .arg(&response.body[..])
            .arg(duration_millis(lease.ttl))
            .arg(self.ttl_grace_ms)
            .arg(duration_millis(lease.tombstone));
        self.announce(&mut cmd, &lease.scope);
        if self.replication.is_none() {
            return self.fenced(&COMPLETE, &cmd, &key).await;
        }
        // Fenced, then held by enough replicas: too few fail the completion, which the
        // middleware retries (the script completes a completed record again as a no-op).
        let (done, acked) = self
            .with_wait::<i64>(&cmd, Some(&COMPLETE), &key)
            .await
            .map_err(|e| self.failed(e))?;
        match done {
            1 => self.too_few(acked, "completion").map_or(Ok(()), Err),
            -1 => Err(not_a_record(&key)),
            _ => Err(StoreError::Fenced),
        }
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        let now = self.clock.now();
        let lease_until = now.plus(lease_for);
        let key = self.record_key(&lease.scope);
        let mut cmd = evalsha(&RENEW, &key);
        cmd.arg(&lease.token.as_u64().to_be_bytes())
            .arg(now.as_millis())
            .arg(&lease_until.as_millis().to_be_bytes())
            .arg(lease_until.as_millis())
            .arg(native_ttl(self.ttl_grace_ms, lease_until, now));
        self.fenced(&RENEW, &cmd, &key).await
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: idem_core::Ambiguity) -> Result<()> {
        let now = self.clock.now();
        let key = self.record_key(&lease.scope);
        let mut cmd = evalsha(&MARK, &key);
        cmd.arg(&lease.token.as_u64().to_be_bytes())
            .arg(now.as_millis())
            .arg(&[record::ambiguity_byte(reason)][..]);
        self.fenced(&MARK, &cmd, &key).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let now = self.clock.now();
        let key = self.record_key(&lease.scope);
        let mut cmd = evalsha(&RELEASE, &key);
        cmd.arg(&lease.token.as_u64().to_be_bytes())
            .arg(now.as_millis());
        self.announce(&mut cmd, &lease.scope);
        self.fenced(&RELEASE, &cmd, &key).await
    }

    /// The record, or once it has expired (or Redis deleted it) its tombstone, if one
    /// is kept.
    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        let read = |key: String| async move {
            let value: Option<Vec<u8>> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(|e| self.failed(e))?;
            value.map(|v| decode(&key, v.into())).transpose()
        };
        let record = read(self.record_key(scope)).await?;
        if record
            .as_ref()
            .is_some_and(|r| !r.is_expired(self.clock.now()))
        {
            return Ok(record);
        }
        Ok(read(self.tombstone_key(scope)).await?.or(record))
    }

    /// A `SCAN` of the prefix (on a cluster, each master in turn), each record read
    /// and judged; a page reads at most a few thousand keys.
    /// A hash at `prefix + "rate:{" + bucket + "}"` (the bucket is its own hash tag
    /// on a cluster), written by one script with the store's clock, and expiring once
    /// the bucket would be full again.
    async fn take_rate_token(
        &self,
        bucket: &str,
        rate: &idem_core::KeyRate,
    ) -> Result<Option<bool>> {
        let key = format!("{}rate:{{{bucket}}}", self.prefix);
        let keep_ms = idem_core::duration_millis(rate.refill()).max(1) + 1000;
        let mut cmd = evalsha(&TAKE_TOKEN, &key);
        cmd.arg(self.clock.now().as_millis())
            .arg(rate.per_second())
            .arg(rate.burst())
            .arg(keep_ms);
        let taken: i64 = self.eval(&TAKE_TOKEN, &cmd).await?;
        Ok(Some(taken == 1))
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        self.list_page(query).await
    }

    /// Deletes the record and its tombstone.
    async fn remove(&self, scope: &Scope) -> Result<bool> {
        let removed: i64 = redis::cmd("DEL")
            .arg(self.record_key(scope))
            .arg(self.tombstone_key(scope))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failed(e))?;
        if removed > 0
            && let Some(subscriber) = &self.subscriber
        {
            // An operator's removal, rare: its own command. Not hearing it costs a
            // waiter only its next poll.
            let _: RedisResult<i64> = redis::cmd("PUBLISH")
                .arg(&subscriber.channel)
                .arg(scope.digest())
                .query_async(&mut self.conn.clone())
                .await;
        }
        Ok(removed > 0)
    }

    /// From the subscriber: it fires when any instance on this server and prefix
    /// completes, releases or removes the record. On a Redis Cluster, or while the
    /// subscriber is disconnected, [`Watch::poll`].
    fn watch(&self, scope: &Scope) -> Watch {
        match &self.subscriber {
            Some(subscriber) => subscriber.feed.hub().watch(scope),
            None => Watch::poll(),
        }
    }

    /// Stops the subscriber; the shared connection closes with the last clone.
    async fn close(&self) {
        if let Some(subscriber) = &self.subscriber {
            subscriber.feed.stop();
        }
    }

    /// Native TTLs are what bound storage in production: Redis deletes each record
    /// [`DEFAULT_TTL_GRACE`] after its expiry by itself. This purge exists so expiry by
    /// an injected clock (which Redis cannot see) is also honoured: it walks the
    /// prefix with `SCAN`, resuming where the previous call stopped, and deletes each
    /// record that has expired by the store's clock with a script that checks again on
    /// the server. A call ends after `limit` deletions or at the end of one pass over
    /// the keyspace, whichever comes first. On a cluster it walks each master in turn.
    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        if limit == 0 {
            return Ok(0);
        }
        let now = self.clock.now();
        if self.conn.is_cluster() {
            return self.purge_cluster(limit, now).await;
        }
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
                .map_err(|e| self.failed(e))?;
            for key in keys {
                if purged == limit {
                    // Resume at this page: its remaining keys are not yet examined.
                    save(cursor);
                    return Ok(purged);
                }
                let mut cmd = evalsha(&PURGE, &key);
                cmd.arg(now.as_millis());
                let deleted: i64 = self.eval(&PURGE, &cmd).await?;
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
            .map_err(|e| self.failed(e))?;
        Ok(())
    }

    /// At `PREFIX` + `meta:` + `name`, with no TTL: one `SET … NX GET`, which stores
    /// the candidate where nothing is and answers what was there, atomically. No
    /// purge reaches it: the sweep matches record keys only.
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        let key = self.secret_key(name);
        let existing: Option<Vec<u8>> = redis::cmd("SET")
            .arg(&key)
            .arg(candidate)
            .arg("NX")
            .arg("GET")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failed(e))?;
        Ok(existing.unwrap_or_else(|| candidate.to_vec()))
    }

    fn metrics(&self) -> Vec<StoreMetric> {
        let c = &self.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        vec![
            StoreMetric::counter(
                "idem_redis_failed_commands_total",
                "Commands to Redis that got an error instead of an answer (connection lost \
                 or timed out, server error).",
                read(&c.failed_commands),
            ),
            StoreMetric::counter(
                "idem_redis_script_loads_total",
                "Scripts loaded again because Redis did not know them (it restarted, or \
                 its script cache was flushed).",
                read(&c.script_loads),
            ),
            StoreMetric::counter(
                "idem_redis_unconfirmed_reservations_total",
                "First reservations whose reply never came, released in the background.",
                read(&c.unconfirmed_reservations),
            ),
            StoreMetric::counter(
                "idem_redis_cluster_reconnects_total",
                "Times the Redis Cluster connection was made afresh from the seed nodes \
                 because a node timed out (as after a master failed over while silent).",
                self.conn.renewed(),
            ),
            StoreMetric::gauge(
                "idem_redis_server_may_evict",
                "1 when, as the store connected, the server's maxmemory policy let it evict \
                 records when full (a retry of an evicted key executes again); else 0.",
                u64::from(self.eviction.is_some()),
            ),
        ]
    }

    /// Every record carries a native TTL ([`DEFAULT_TTL_GRACE`] past its expiry), and
    /// a purge walks the whole keyspace.
    fn expires_natively(&self) -> bool {
        <RedisStore as idem_core::OpenStore>::EXPIRES_NATIVELY
    }
}

#[cfg(test)]
mod tests;
