//! `RedisInbox`: processed-message markers in Redis, for consumers whose effects do not
//! live in a SQL database.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{Script, Value};

use crate::inbox::validate_id;
use crate::retention::DEFAULT_RETENTION;
use crate::{Error, Inbox, Outcome, Result};

/// How long an in-flight marker lives by default before another consumer may take the
/// message over.
pub const DEFAULT_IN_FLIGHT_LEASE: Duration = Duration::from_secs(60);

const DONE: &str = "done";

/// Deletes the marker only if it is still ours, so a consumer whose lease lapsed never
/// deletes the marker of the consumer that took over.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) \
         else return 0 end",
    )
});

/// Extends the marker's lease only if it is still ours.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then \
         return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end",
    )
});

/// An [`Inbox`] on Redis: `SET key NX` with a TTL marks a message.
///
/// # The weaker guarantee
///
/// Redis cannot commit the marker and the effects together, so the inbox works in two
/// steps: `SET NX` an *in-flight* marker (lease [`DEFAULT_IN_FLIGHT_LEASE`]), run the
/// effects, then turn the marker into *done* with the retention as TTL. While the
/// effects run, the marker's lease is renewed every third of its length (only while
/// the marker is still this attempt's), so slow effects keep the message to
/// themselves. A delivery that finds *done* is a [`Duplicate`](Outcome::Duplicate);
/// one that finds *in flight* fails with [`Error::InFlight`] so that the broker
/// redelivers it later. Effects that fail delete the marker (only if it is still this
/// attempt's). So does a `SET NX` whose reply was lost (a dropped connection or a
/// timeout after sending), in the background, when `conn` can reconnect (a
/// `ConnectionManager`); otherwise that marker holds the message back until its lease
/// lapses.
///
/// What this cannot rule out: a consumer that dies (or stalls, renewals included, past
/// the lease) after its effects but before marking done leaves an in-flight marker that
/// lapses, and the redelivery runs the effects again. So delivery is *at least once*
/// across crashes and *exactly once* otherwise. Make the effects themselves idempotent
/// (an upsert, a downstream idempotency key derived from the message id) where a repeat
/// would hurt, or use [`SqliteInbox`](crate::SqliteInbox) / [`PgInbox`](crate::PgInbox)
/// when they are SQL writes. Redis persistence settings (AOF, replication) also bound
/// what a Redis failover may forget.
///
/// Expiry uses Redis's native TTLs, so [`Inbox::purge_expired`] has nothing to do.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), idem_inbox::Error> {
/// use idem_inbox::{Inbox, Outcome, RedisInbox};
///
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let conn = client.get_multiplexed_async_connection().await?;
/// let inbox = RedisInbox::new(conn, "mailer")?;
/// let outcome = inbox
///     .process("msg-1", |_| Box::pin(async { Ok::<_, idem_inbox::Error>("sent") }))
///     .await?;
/// assert_eq!(outcome, Outcome::Processed("sent"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisInbox<C> {
    conn: C,
    consumer: Arc<str>,
    prefix: Arc<str>,
    retention: Duration,
    lease: Duration,
}

impl<C> std::fmt::Debug for RedisInbox<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisInbox")
            .field("consumer", &self.consumer)
            .field("prefix", &self.prefix)
            .field("retention", &self.retention)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<C> RedisInbox<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// An inbox for `consumer` over `conn` (a `MultiplexedConnection` or a
    /// `ConnectionManager`), with key prefix `idem:inbox`, the default retention and
    /// in-flight lease.
    pub fn new(conn: C, consumer: impl Into<String>) -> Result<RedisInbox<C>> {
        let consumer = consumer.into();
        validate_id("consumer name", &consumer)?;
        Ok(RedisInbox {
            conn,
            consumer: consumer.into(),
            prefix: "idem:inbox".into(),
            retention: DEFAULT_RETENTION,
            lease: DEFAULT_IN_FLIGHT_LEASE,
        })
    }

    /// Prefixes every key with `prefix` (keys are `prefix:{consumer}:message_id`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> RedisInbox<C> {
        self.prefix = prefix.into().into();
        self
    }

    /// Keeps done markers for `retention`.
    pub fn with_retention(mut self, retention: Duration) -> RedisInbox<C> {
        self.retention = retention;
        self
    }

    /// Lets an in-flight marker live `lease` without a renewal: how long after a
    /// consumer dies mid-effects another delivery may run them again. Running effects
    /// renew it every third of `lease`.
    pub fn with_in_flight_lease(mut self, lease: Duration) -> RedisInbox<C> {
        self.lease = lease;
        self
    }

    /// The Redis key of `message_id`'s marker: `prefix:{consumer}:message_id`.
    pub fn marker_key(&self, message_id: &str) -> String {
        // The braces make every key of one consumer hash to one cluster slot.
        format!("{}:{{{}}}:{message_id}", self.prefix, self.consumer)
    }

    /// Marks the message in flight; `None` when it was, else what is there.
    async fn try_mark(&self, key: &str, token: &str) -> Result<Option<Existing>> {
        let mut conn = self.conn.clone();
        for _ in 0..3 {
            let set: Value = match redis::cmd("SET")
                .arg(key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(millis(self.lease))
                .query_async(&mut conn)
                .await
            {
                Ok(set) => set,
                Err(e) => {
                    // Sent, and the reply never came: the marker may be set, and
                    // would hold the message back for a lease no one has.
                    if e.is_io_error() && !e.is_connection_refusal() {
                        self.release_lost_mark(key, token);
                    }
                    return Err(e.into());
                }
            };
            if !matches!(set, Value::Nil) {
                return Ok(None);
            }
            let (value, pttl): (Option<String>, i64) = redis::pipe()
                .cmd("GET")
                .arg(key)
                .cmd("PTTL")
                .arg(key)
                .query_async(&mut conn)
                .await?;
            match value {
                Some(v) if v == DONE => return Ok(Some(Existing::Done)),
                Some(_) => {
                    let ms = u64::try_from(pttl).unwrap_or(0).max(1);
                    return Ok(Some(Existing::InFlight(Duration::from_millis(ms))));
                }
                // The marker lapsed between SET and GET: try again.
                None => continue,
            }
        }
        Ok(Some(Existing::InFlight(Duration::from_millis(1))))
    }
}

impl<C> RedisInbox<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Deletes, in the background, the in-flight marker `key` if it holds `token`: a
    /// `SET NX` whose reply was lost may have set it ([`idem_core::release_unconfirmed_with`]).
    /// With a `ConnectionManager`, which reconnects, this frees the message for its next
    /// delivery at once; a `MultiplexedConnection` that broke cannot, and the marker
    /// lapses with its lease.
    fn release_lost_mark(&self, key: &str, token: &str) {
        let (conn, key, token) = (self.conn.clone(), key.to_owned(), token.to_owned());
        idem_core::release_unconfirmed_with(move || {
            let (mut conn, key, token) = (conn.clone(), key.clone(), token.clone());
            async move {
                let deleted: i64 = RELEASE
                    .key(&key)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(idem_core::StoreError::unavailable)?;
                if deleted == 1 {
                    Ok(())
                } else {
                    Err(idem_core::StoreError::Fenced)
                }
            }
        });
    }

    /// Awaits `effects` while renewing the marker `key` (holding `token`) every third
    /// of the lease. A renewal runs beside the effects and never holds them up; once the
    /// marker is no longer ours, renewing stops (the effects still finish, and marking
    /// done follows as without renewals).
    async fn renewing<T>(&self, key: &str, token: &str, effects: impl Future<Output = T>) -> T {
        let beat = (self.lease / 3).max(Duration::from_millis(1));
        let mut effects = std::pin::pin!(effects);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + beat, beat);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                output = &mut effects => return output,
                _ = ticks.tick() => {}
            }
            // The effects keep running while the renewal is on its way.
            let mut renewal = RENEW.key(key);
            renewal.arg(token).arg(millis(self.lease));
            let mut conn = self.conn.clone();
            let renewed = tokio::select! {
                biased;
                output = &mut effects => return output,
                renewed = renewal.invoke_async::<i64>(&mut conn) => renewed,
            };
            match renewed {
                Ok(1) => {}
                Ok(_) => {
                    tracing::warn!(
                        key,
                        "the in-flight marker lapsed or was taken over while the effects ran"
                    );
                    return effects.await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the in-flight marker failed; retrying at the next beat")
                }
            }
        }
    }
}

enum Existing {
    Done,
    InFlight(Duration),
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn token() -> String {
    format!(
        "in-flight:{:016x}{:016x}",
        getrandom::u64().unwrap_or(0),
        getrandom::u64().unwrap_or(0)
    )
}

impl<C> Inbox for RedisInbox<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Tx = ();

    fn consumer(&self) -> &str {
        &self.consumer
    }

    fn retention(&self) -> Duration {
        self.retention
    }

    async fn process<T, E, F>(&self, message_id: &str, effects: F) -> Result<Outcome<T>, E>
    where
        T: Send,
        E: From<Error> + Send,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<T, E>> + Send,
    {
        validate_id("message id", message_id)?;
        let key = self.marker_key(message_id);
        let token = token();
        match self.try_mark(&key, &token).await? {
            None => {}
            Some(Existing::Done) => return Ok(Outcome::Duplicate),
            Some(Existing::InFlight(retry_after)) => {
                return Err(Error::InFlight { retry_after }.into());
            }
        }
        let mut conn = self.conn.clone();
        let outcome = self.renewing(&key, &token, effects(&mut ())).await;
        match outcome {
            Ok(value) => {
                // Done whoever holds the marker now: the effects have happened.
                let _: Value = redis::cmd("SET")
                    .arg(&key)
                    .arg(DONE)
                    .arg("PX")
                    .arg(millis(self.retention))
                    .query_async(&mut conn)
                    .await
                    .map_err(Error::from)?;
                Ok(Outcome::Processed(value))
            }
            Err(e) => {
                let released: std::result::Result<i64, _> =
                    RELEASE.key(&key).arg(&token).invoke_async(&mut conn).await;
                if let Err(re) = released {
                    tracing::warn!(error = %re, "could not release the in-flight marker; \
                        the message waits for the lease to lapse");
                }
                Err(e)
            }
        }
    }

    async fn contains(&self, message_id: &str) -> Result<bool> {
        let mut conn = self.conn.clone();
        let value: Option<String> = redis::cmd("GET")
            .arg(self.marker_key(message_id))
            .query_async(&mut conn)
            .await?;
        Ok(value.as_deref() == Some(DONE))
    }

    async fn purge_expired(&self, _limit: usize) -> Result<usize> {
        Ok(0)
    }
}
