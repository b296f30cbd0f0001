//! `?wait=N`: writes that replicas hold before the store answers ([`Replication`]).
//!
//! Redis replicates asynchronously. A master that fails right after a reservation can
//! lose it, and the retry then executes again on the promoted replica. With
//! replication set, the store sends `WAIT N timeout` right behind each reservation
//! and completion, in one pipeline: one round trip, on the connection that carried the
//! write (`WAIT` counts that connection's writes), and on a cluster to the master of
//! the record's slot (a pipeline goes whole to the slot of its keyed command; `WAIT`
//! alone would go to every master).

use idem_core::{FencingToken, ReserveRequest, Result, StoreError, duration_millis};
use redis::{Cmd, FromRedisValue, RedisResult, Script, Value};

use crate::store::{RedisStore, bump};
use crate::target::Replication;

/// Times a write with `WAIT` is sent again after its node answered that the slot
/// moved.
const MAX_REDIRECTS: usize = 3;

impl RedisStore {
    /// How many replicas must hold each reservation and completion, if set.
    pub fn replication(&self) -> Option<Replication> {
        self.replication
    }

    /// Runs `cmd` (an `EVALSHA` of `script`, or a plain command when `script` is
    /// `None`), followed in the same pipeline by `WAIT` when replication is set: the
    /// reply and the number of replicas that acknowledged (`None` without
    /// replication). `key` is the record's key that `cmd` writes.
    ///
    /// The cluster client follows a `MOVED` for a command, not for one inside a
    /// pipeline: then a plain command on `key` lets it learn where the slot went (it
    /// refreshes its slot map), and the pipeline is sent again, to that node.
    pub(crate) async fn with_wait<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        script: Option<&Script>,
        key: &str,
    ) -> RedisResult<(T, Option<i64>)> {
        let Some(r) = self.replication else {
            let reply = match script {
                Some(script) => self.eval_raw(script, cmd).await?,
                None => cmd.query_async(&mut self.conn.clone()).await?,
            };
            return Ok((reply, None));
        };
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone())
            .cmd("WAIT")
            .arg(r.replicas)
            .arg(duration_millis(r.timeout).max(1))
            .ignore_errors();
        let mut conn = self.conn.clone();
        let (mut loaded, mut redirects) = (false, 0);
        loop {
            let values: Vec<Value> = pipe.query_async(&mut conn).await?;
            let mut values = values.into_iter();
            let (Some(reply), Some(acked)) = (values.next(), values.next()) else {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "a write and WAIT got fewer than two replies",
                )));
            };
            match (reply.extract_error(), script) {
                (Err(e), Some(script)) if e.code() == Some("NOSCRIPT") && !loaded => {
                    bump(&self.counters.script_loads);
                    script.load_async(&mut conn).await?;
                    loaded = true;
                }
                (Err(e), _)
                    if matches!(e.code(), Some("MOVED" | "ASK")) && redirects < MAX_REDIRECTS =>
                {
                    redirects += 1;
                    let _: RedisResult<i64> =
                        redis::cmd("EXISTS").arg(key).query_async(&mut conn).await;
                }
                (Err(e), _) => return Err(e),
                (Ok(reply), _) => {
                    let acked: i64 = redis::from_redis_value(acked.extract_error()?)?;
                    return Ok((redis::from_redis_value(reply)?, Some(acked)));
                }
            }
        }
    }

    /// The error for a write that `acked` replicas (from [`with_wait`](Self::with_wait))
    /// acknowledged, if they are too few.
    pub(crate) fn too_few(&self, acked: Option<i64>, what: &str) -> Option<StoreError> {
        let (r, acked) = (self.replication?, acked?);
        (acked < i64::from(r.replicas)).then(|| {
            StoreError::unavailable(format!(
                "{acked} of the {} replicas required acknowledged the {what} within {:?} \
                 (wait={})",
                r.replicas, r.timeout, r.replicas
            ))
        })
    }

    /// A reservation this caller wrote (token `token`, attempt `attempt`), once
    /// `acked` replicas acknowledged it: too few, and it is released (fenced by its
    /// token) and the reserve fails with [`StoreError::Unavailable`], so the upstream
    /// is never called for a record a failover could lose.
    pub(crate) async fn replicated(
        &self,
        acked: Option<i64>,
        req: &ReserveRequest,
        token: FencingToken,
        attempt: u32,
    ) -> Result<()> {
        let Some(e) = self.too_few(acked, "reservation") else {
            return Ok(());
        };
        let lease = req.lease_for(token, attempt);
        if let Err(release) = idem_core::Store::release(self, &lease).await {
            tracing::warn!(error = %release, "could not release a reservation too few replicas hold");
        }
        Err(e)
    }
}
