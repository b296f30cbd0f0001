//! [`Cluster`]: a Redis Cluster connection that replaces itself when a node stops
//! answering.
//!
//! The cluster client follows `MOVED` and `ASK`, and reconnects to a node whose
//! connection drops; but a reply that never comes (a node paused or cut off mid-
//! connection, a relay whose far side is gone) only times out, and a timeout is
//! retried on the same connection, with the same slot map. After a failover the
//! promoted replica is never asked: every command for the old master's slots times
//! out until the process restarts. So a timeout here also starts a fresh connection
//! from the seed nodes in the background (at most one at a time, and at most one per
//! quiet period), which reads the slots anew and connects to today's masters; the
//! commands after it use the new one, and the old one closes with its last command.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::RedisResult;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

/// The shared cluster connection and what replaces it; cheap to share behind an
/// [`Arc`].
pub(crate) struct Cluster {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    renewal: Mutex<Renewal>,
    /// The least time between two fresh connections.
    quiet: Duration,
    /// Fresh connections that replaced the current one.
    renewed: AtomicU64,
}

/// Whether a fresh connection is being made, and when the last one started.
struct Renewal {
    running: bool,
    last: Instant,
}

impl Cluster {
    /// `conn`, made by `client`, replaced after a timeout at most once per `quiet`.
    pub(crate) fn new(client: ClusterClient, conn: ClusterConnection, quiet: Duration) -> Self {
        Cluster {
            client,
            current: RwLock::new(conn),
            renewal: Mutex::new(Renewal {
                running: false,
                last: Instant::now(),
            }),
            quiet,
            renewed: AtomicU64::new(0),
        }
    }

    /// The connection to send the next command on.
    pub(crate) fn conn(&self) -> ClusterConnection {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// How many times a fresh connection replaced the current one.
    pub(crate) fn renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }

    /// Sends `cmd` where `routing` says, looking at the outcome.
    pub(crate) async fn route(
        self: &Arc<Self>,
        cmd: &redis::Cmd,
        routing: redis::cluster_routing::RoutingInfo,
    ) -> RedisResult<redis::Value> {
        let outcome = self.conn().route_command(cmd.clone(), routing).await;
        self.observe(&outcome);
        outcome
    }

    /// Looks at a command's outcome: a timeout starts a fresh connection.
    pub(crate) fn observe<T>(self: &Arc<Self>, outcome: &RedisResult<T>) {
        if outcome.as_ref().is_err_and(|e| e.is_timeout()) {
            self.renew();
        }
    }

    /// Starts a fresh connection in the background unless one is being made or the
    /// last started less than the quiet period ago; it replaces the current one once
    /// it is up, and a failure leaves the current one (the next timeout tries again).
    fn renew(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut renewal = self.renewal.lock().unwrap_or_else(|p| p.into_inner());
            if renewal.running || renewal.last.elapsed() < self.quiet {
                return;
            }
            renewal.running = true;
            renewal.last = Instant::now();
        }
        let cluster = Arc::clone(self);
        runtime.spawn(async move {
            match cluster.client.get_async_connection().await {
                Ok(fresh) => {
                    *cluster
                        .current
                        .write()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
                    cluster.renewed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "a Redis Cluster node timed out: connected afresh from the seed nodes"
                    );
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "a Redis Cluster node timed out, and a fresh connection failed; \
                     the next timeout tries again"
                ),
            }
            let mut renewal = cluster.renewal.lock().unwrap_or_else(|p| p.into_inner());
            renewal.running = false;
            renewal.last = Instant::now();
        });
    }
}
