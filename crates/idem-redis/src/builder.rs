//! [`RedisStoreBuilder`]: the settings a [`RedisStore`] connects with.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Result, SharedClock, SystemClock, duration_millis};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisResult};

use crate::error::from_redis;
use crate::eviction::eviction_risk;
use crate::store::{DEFAULT_KEY_PREFIX, DEFAULT_TIMEOUT, DEFAULT_TTL_GRACE, RedisStore};

/// Options for a [`RedisStore`]; [`connect`](RedisStoreBuilder::connect) opens it.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    pub(crate) url: String,
    pub(crate) clock: SharedClock,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) ttl_grace: Duration,
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

    /// Connects, failing with [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) when the URL is invalid or the
    /// server cannot be reached.
    pub async fn connect(self) -> Result<RedisStore> {
        self.connect_or_redis_error().await.map_err(from_redis)
    }

    /// [`connect`](Self::connect), with Redis's own error for a caller that tells the
    /// failures apart.
    pub(crate) async fn connect_or_redis_error(self) -> RedisResult<RedisStore> {
        let client = Client::open(self.url.as_str())?;
        // One quick retry, then fail: the caller answers 503 and its client retries,
        // which beats holding requests while the server is away. The next operation
        // starts a new reconnection.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(250));
        let conn = ConnectionManager::new_with_config(client, config).await?;
        let eviction = eviction_risk(&conn).await.map(Arc::new);
        Ok(RedisStore {
            conn,
            clock: self.clock,
            prefix: self.prefix.into(),
            ttl_grace_ms: duration_millis(self.ttl_grace),
            purge_cursor: Arc::default(),
            counters: Arc::default(),
            eviction,
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
}
