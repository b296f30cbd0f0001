//! [`RedisStoreBuilder`]: the settings a [`RedisStore`] connects with.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{SetupError, SharedClock, SystemClock, duration_millis};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

use crate::subscribe::{self, Subscriber};
use redis::{Client, ErrorKind, RedisError};

use crate::cluster::Cluster;
use crate::conn::Conn;
use crate::error::{KIND, connect_error, setup_error};
use crate::eviction::eviction_risk;
use crate::store::{DEFAULT_KEY_PREFIX, DEFAULT_TIMEOUT, DEFAULT_TTL_GRACE, RedisStore};
use crate::target::{Replication, Target};

/// Settings for a [`RedisStore`]; start from [`RedisStore::builder`], and
/// [`connect`](RedisStoreBuilder::connect) opens it.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    pub(crate) clock: SharedClock,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) ttl_grace: Duration,
    /// Set by [`wait`](RedisStoreBuilder::wait); else the URL's `wait`, if any.
    pub(crate) replication: Option<Option<Replication>>,
    /// Whether connecting writes the namespace's marker where it is missing (see
    /// [`RedisStore::marker_key`]); off only for opening to inspect, which writes
    /// nothing.
    pub(crate) mark: bool,
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

    /// After each reservation and completion, waits until `replicas` replicas hold it,
    /// for at most `timeout` (`WAIT replicas timeout`, in the same round trip as the
    /// write, to the node that took it); fewer in time fail the operation with
    /// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable), releasing a
    /// reservation first. `replicas` 0 turns it off. Overrides the URL's `wait` and
    /// `wait_timeout` (see [`Replication`]).
    pub fn wait(mut self, replicas: u32, timeout: Duration) -> RedisStoreBuilder {
        self.replication = Some((replicas > 0).then_some(Replication { replicas, timeout }));
        self
    }

    /// Connects to `url`: `redis://[user:password@]host:port[/db]` for one server,
    /// `redis+cluster://[user:password@]host:port[?seeds=host:port,…]` for a Redis
    /// Cluster, `rediss://…` and `rediss+cluster://…` for either over TLS (`cacert`,
    /// `cert`, `key`, `insecure=true`; the crate docs say more); all take `wait=N` and
    /// `wait_timeout=DURATION` ([`wait`](RedisStoreBuilder::wait)). Connecting writes
    /// the namespace's marker where it is missing ([`RedisStore::marker_key`]).
    ///
    /// A URL or TLS file that cannot work is [`SetupError::Invalid`], naming the
    /// parameter, before anything is tried; a server that cannot be reached is
    /// [`SetupError::Unreachable`], and one that answers and refuses (a password, a
    /// TLS handshake) [`SetupError::Refused`]; a namespace a later build marked is
    /// [`SetupError::SchemaVersion`], and is left as it is.
    pub async fn connect(self, url: &str) -> Result<RedisStore, SetupError> {
        let target = Target::parse(url).map_err(|why| SetupError::invalid(KIND, why))?;
        let tls = target.tls.is_some();
        let certificates = match &target.tls {
            Some(tls) => tls
                .certificates()
                .map_err(|why| SetupError::invalid(KIND, why))?,
            None => None,
        };
        let replication = self.replication.unwrap_or(target.replication);
        // A reply to a write with WAIT comes after the replicas' acknowledgements.
        let response_timeout = self.timeout + replication.map_or(Duration::ZERO, |r| r.timeout);
        let mut subscriber = None;
        let conn = if target.cluster {
            // A few quick retries: a redirection (MOVED, ASK) or a node being replaced
            // costs one each; past them the caller answers 503 and its client retries.
            let mut builder = ClusterClient::builder(target.nodes.clone());
            if let Some(certificates) = certificates.clone() {
                builder = builder.certs(certificates);
            }
            let client = builder
                .connection_timeout(self.timeout)
                .response_timeout(response_timeout)
                .retries(3)
                .min_retry_wait(50)
                .max_retry_wait(250)
                .build()
                .map_err(setup_error)?;
            match client.get_async_connection().await {
                // Made afresh after a timeout, at most once per timeout.
                Ok(conn) => Conn::Cluster(Arc::new(Cluster::new(client, conn, response_timeout))),
                Err(e) => {
                    let e = seed_failure(&target.nodes[0], certificates, self.timeout, e).await;
                    return Err(connect_error(e, tls));
                }
            }
        } else {
            let node = target.nodes[0].as_str();
            let client = match certificates {
                Some(certificates) => Client::build_with_tls(node, certificates),
                None => Client::open(node),
            }
            .map_err(setup_error)?;
            subscriber = tokio::runtime::Handle::try_current().is_ok().then(|| {
                Arc::new(Subscriber::spawn(
                    client.clone(),
                    subscribe::channel(&self.prefix),
                ))
            });
            // One quick retry, then fail: the caller answers 503 and its client retries,
            // which beats holding requests while the server is away. The next operation
            // starts a new reconnection.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(response_timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(250));
            let manager = ConnectionManager::new_with_config(client, config).await;
            Conn::Single(manager.map_err(|e| connect_error(e, tls))?)
        };
        let eviction = eviction_risk(&conn).await.map(Arc::new);
        if let Some(subscriber) = &subscriber {
            subscriber.feed.ready(self.timeout).await;
        }
        let store = RedisStore {
            subscriber,
            conn,
            clock: self.clock,
            prefix: self.prefix.into(),
            ttl_grace_ms: duration_millis(self.ttl_grace),
            replication,
            purge_cursor: Arc::default(),
            node_cursor: Arc::default(),
            counters: Arc::default(),
            eviction,
        };
        if self.mark {
            // Dropping the store on a refusal stops its subscriber.
            if let Some(found) = store.mark_namespace().await.map_err(setup_error)? {
                store.check_version(&found)?;
            }
        }
        Ok(store)
    }

    /// Whether connecting writes the namespace's marker where it is missing (default
    /// on): off only for opening to inspect, which must write nothing.
    pub(crate) fn mark(mut self, mark: bool) -> RedisStoreBuilder {
        self.mark = mark;
        self
    }
}

impl RedisStore {
    /// Default settings, to adjust before [connecting](RedisStoreBuilder::connect).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            clock: Arc::new(SystemClock),
            prefix: DEFAULT_KEY_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            ttl_grace: DEFAULT_TTL_GRACE,
            replication: None,
            mark: true,
        }
    }

    /// A store at `url` with the default options.
    pub async fn connect(url: &str) -> Result<RedisStore, SetupError> {
        RedisStore::builder().connect(url).await
    }
}

/// Why a cluster's first connections failed, with the TLS failure in the chain: the
/// cluster client keeps only the text of a seed's error, so a certificate that does
/// not verify would read as a seed that is not there. Over TLS one plain connection
/// to the first seed is tried to find it; otherwise `error` stands.
async fn seed_failure(
    seed: &str,
    certificates: Option<redis::TlsCertificates>,
    timeout: Duration,
    error: RedisError,
) -> RedisError {
    let Some(certificates) = certificates.filter(|_| error.kind() == ErrorKind::Io) else {
        return error;
    };
    let Ok(client) = Client::build_with_tls(seed, certificates) else {
        return error;
    };
    match tokio::time::timeout(timeout, client.get_multiplexed_async_connection()).await {
        Ok(Err(probe)) if idem_core::open::tls::handshake_failure(&probe).is_some() => probe,
        _ => error,
    }
}
