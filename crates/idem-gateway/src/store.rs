//! Store selection from the `--store` URL.
//!
//! | URL | store |
//! |---|---|
//! | `memory://` | `idem_core::MemoryStore` (one process, lost on restart; at most 100 000 records unless `?max_entries=N` says otherwise, and when full it drops the completed records closest to expiry, whose retries would execute again) |
//! | `sqlite://FILE`, `sqlite:///abs/path` | `idem_sqlite::SqliteStore` (the embedded default; `?synchronous=full` syncs every commit, `?page_size=1024` makes a new file with 1 KiB pages) |
//! | `postgres://…`, `postgresql://…` | `idem_postgres::PgStore` (shared by several gateways) |
//! | `redis://…` | `idem_redis::RedisStore` (shared by several gateways) |
//!
//! A query parameter that the store would not read is refused, not skipped: the
//! drivers for PostgreSQL and Redis pass over unknown ones, so a misspelt `sslmode`
//! would connect without TLS.
//!
//! A [`Namespace`] (`--store-namespace`) picks the table or key prefix within the store,
//! so that gateways in front of different APIs can share one.
//!
//! [`open_or_defer`] is how `idem serve` opens its store: a PostgreSQL or Redis server
//! that cannot be reached at start does not stop the gateway, which serves unkeyed
//! traffic and answers keyed requests 503 until a background task reaches the store.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Lease, MemoryStore, Record, Reservation, ReserveRequest, Scope, Store, StoreError, StoreMetric,
    StoredResponse,
};

/// A parsed `--store` URL.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory://`, holding at most this many records (`?max_entries=N`, else
    /// [`idem_core::DEFAULT_MAX_ENTRIES`]).
    Memory(usize),
    /// `sqlite://PATH`, passed on as written: the path is relative to the working
    /// directory unless it starts with `/` (`sqlite:///var/lib/idem.db`).
    Sqlite(String),
    /// `postgres://…`, passed on as written.
    Postgres(String),
    /// `redis://…`, passed on as written.
    Redis(String),
}

/// A `--store` URL that names no known store, or a store that cannot be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL's scheme is not one of the supported stores.
    #[error("unsupported store URL {0:?}: use memory://, sqlite://FILE, postgres://… or redis://…")]
    Unsupported(String),
    /// The URL names a known store but is not usable as written (a Redis URL that does
    /// not parse, `rediss://`, which this build cannot speak, or a query parameter the
    /// store's driver would skip, such as a misspelt `sslmode`).
    #[error("invalid {kind} store URL {url}: {reason}")]
    Invalid {
        /// Which store.
        kind: &'static str,
        /// The URL, password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store could not be opened or reached.
    #[error("cannot open the {kind} store at {url}: {source}")]
    Open {
        /// Which store.
        kind: &'static str,
        /// The URL, password removed.
        url: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreUrl {
    /// Parses a store URL.
    pub fn parse(url: &str) -> Result<StoreUrl, OpenError> {
        let url = url.trim();
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| OpenError::Unsupported(redact(url)))?;
        match scheme.to_ascii_lowercase().as_str() {
            "memory" | "mem" => {
                parse_memory(rest)
                    .map(StoreUrl::Memory)
                    .map_err(|reason| OpenError::Invalid {
                        kind: "memory",
                        url: redact(url),
                        reason,
                    })
            }
            "sqlite" => {
                if rest.split('?').next().unwrap_or_default().is_empty() {
                    return Err(OpenError::Unsupported(redact(url)));
                }
                Ok(StoreUrl::Sqlite(url.to_owned()))
            }
            "postgres" | "postgresql" => {
                known_parameters(rest, POSTGRES_PARAMETERS).map_err(|reason| {
                    OpenError::Invalid {
                        kind: "postgres",
                        url: redact(url),
                        reason,
                    }
                })?;
                Ok(StoreUrl::Postgres(url.to_owned()))
            }
            "redis" | "rediss" => {
                let invalid = |reason: String| OpenError::Invalid {
                    kind: "redis",
                    url: redact(url),
                    reason,
                };
                known_parameters(rest, REDIS_PARAMETERS).map_err(invalid)?;
                // Parsing only: nothing is sent until the store connects.
                redis::Client::open(url).map_err(|e| invalid(e.to_string()))?;
                Ok(StoreUrl::Redis(url.to_owned()))
            }
            _ => Err(OpenError::Unsupported(redact(url))),
        }
    }

    /// A short name for logs: `memory`, `sqlite`, `postgres`, `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreUrl::Memory(_) => "memory",
            StoreUrl::Sqlite(_) => "sqlite",
            StoreUrl::Postgres(_) => "postgres",
            StoreUrl::Redis(_) => "redis",
        }
    }

    /// The most file descriptors the store may hold with `pool` connections in a SQL
    /// store's pool (`None`: the store's default): none in memory, three per SQLite
    /// connection (the database, its WAL and its shared-memory index), one per
    /// PostgreSQL connection, and two for Redis (its multiplexed connection, and a new
    /// one while it reconnects).
    pub fn descriptors(&self, pool: Option<u32>) -> u64 {
        match self {
            StoreUrl::Memory(_) => 0,
            StoreUrl::Sqlite(_) => {
                3 * u64::from(pool.unwrap_or(idem_sqlite::DEFAULT_MAX_CONNECTIONS))
            }
            // PgStore's own default pool.
            StoreUrl::Postgres(_) => u64::from(pool.unwrap_or(10)),
            StoreUrl::Redis(_) => 2,
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory(max) => write!(f, "memory://?max_entries={max}"),
            StoreUrl::Sqlite(u) | StoreUrl::Postgres(u) | StoreUrl::Redis(u) => {
                f.write_str(&redact(u))
            }
        }
    }
}

/// The bound of a `memory://` URL: what follows `memory://`, which is nothing or
/// `?max_entries=N`.
fn parse_memory(rest: &str) -> Result<usize, String> {
    let query = match rest.strip_prefix('?') {
        Some(query) => query,
        None if rest.is_empty() => return Ok(idem_core::DEFAULT_MAX_ENTRIES),
        None => return Err("a memory store has no host or path; write memory://".into()),
    };
    let mut max = idem_core::DEFAULT_MAX_ENTRIES;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("max_entries", n)) => {
                max = n.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| {
                    format!("max_entries must be a whole number above 0, not {n:?}")
                })?;
            }
            _ => {
                return Err(format!(
                    "unknown parameter {pair:?}; the memory store takes max_entries=N"
                ));
            }
        }
    }
    Ok(max)
}

/// The query parameters a PostgreSQL URL may carry: those the driver reads. It skips
/// any other with no more than a log line, so a misspelt `sslmode` would connect
/// without the TLS it asked for.
const POSTGRES_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "options[…]",
];

/// The query parameters a Redis URL may carry: the driver reads `protocol` and
/// silently skips anything else.
const REDIS_PARAMETERS: &[&str] = &["protocol"];

/// Refuses a query parameter of `rest` (what follows `scheme://`) that is not in
/// `known`, where `options[…]` stands for any `options[NAME]`.
fn known_parameters(rest: &str, known: &[&str]) -> Result<(), String> {
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        let bracketed = name.starts_with("options[") && name.ends_with(']');
        let known_name = known.contains(&name) || bracketed && known.contains(&"options[…]");
        if !known_name {
            return Err(format!(
                "unknown parameter {name:?}; this store's URL takes {}",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// The URL with any password replaced by `***`, for logs and errors.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_owned()
            };
            format!("{scheme}://{masked}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// Settings that apply to some stores only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Connections in the pool of the SQL stores; `None` keeps the store's default.
    /// Redis multiplexes one connection and ignores it.
    pub pool: Option<u32>,
    /// Where in a shared store this gateway's records live; `None` is
    /// [`DEFAULT_NAMESPACE`]. The memory store ignores it.
    pub namespace: Option<Namespace>,
}

/// The namespace of a gateway that is given none: its records are in the table
/// `idem_records` (SQLite, PostgreSQL) or under Redis keys that start `idem:`, the
/// stores' own defaults.
pub const DEFAULT_NAMESPACE: &str = "idem";

/// The longest namespace: with `_records` after it, a table name stays within
/// PostgreSQL's 63 bytes.
const NAMESPACE_MAX: usize = 55;

/// Names a gateway's records within a store that several gateways share: the SQL
/// stores keep them in the table `NAME_records`, Redis under keys that start `NAME:`.
///
/// Gateways in front of different APIs need different namespaces on one store: a scope
/// is tenant, endpoint and key, and two APIs may well both serve `POST /v1/orders` to the
/// same tenant. Gateways in front of the same API must share one, or a retry that
/// reaches the other gateway would execute again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace(String);

impl Namespace {
    /// A namespace of lower-case ASCII letters, digits and underscores, starting with a
    /// letter or an underscore, at most 55 characters: it becomes part of a SQL table
    /// name as it is, unquoted, which PostgreSQL would fold to lower case.
    pub fn new(name: &str) -> Result<Namespace, String> {
        let mut chars = name.chars();
        let starts_well = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_well = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !starts_well || !rest_well {
            return Err(format!(
                "{name:?} is not a namespace: use lower-case ASCII letters, digits and \
                 underscores, starting with a letter or an underscore"
            ));
        }
        if name.len() > NAMESPACE_MAX {
            return Err(format!(
                "a namespace has at most {NAMESPACE_MAX} characters; {name:?} has {}",
                name.len()
            ));
        }
        Ok(Namespace(name.to_owned()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The SQL stores' table: `NAME_records`.
    pub fn table(&self) -> String {
        format!("{}_records", self.0)
    }

    /// The Redis key prefix: `NAME:`.
    pub fn key_prefix(&self) -> String {
        format!("{}:", self.0)
    }
}

impl Default for Namespace {
    fn default() -> Namespace {
        Namespace(DEFAULT_NAMESPACE.to_owned())
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Opens (and for SQL stores migrates) the store a URL names, with default options.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    open_with(url, StoreOptions::default()).await
}

/// Opens (and for SQL stores migrates) the store a URL names.
pub async fn open_with(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>, OpenError> {
    let parsed = StoreUrl::parse(url)?;
    let kind = parsed.kind();
    let wrap = |source: Box<dyn std::error::Error + Send + Sync>| OpenError::Open {
        kind,
        url: redact(url),
        source,
    };
    let store: Arc<dyn Store> = match parsed {
        StoreUrl::Memory(max) => Arc::new(MemoryStore::new().max_entries(max)),
        StoreUrl::Sqlite(url) => {
            let mut builder = idem_sqlite::SqliteStore::builder();
            if let Some(n) = options.pool {
                builder = builder.max_connections(n);
            }
            if let Some(ns) = &options.namespace {
                builder = builder.table(ns.table());
            }
            Arc::new(builder.connect(&url).await.map_err(|e| wrap(e.into()))?)
        }
        StoreUrl::Postgres(url) => {
            let mut builder = idem_postgres::PgStore::options();
            if let Some(n) = options.pool {
                builder = builder.max_connections(n);
            }
            if let Some(ns) = &options.namespace {
                builder = builder.table(ns.table());
            }
            Arc::new(builder.connect(&url).await.map_err(|e| wrap(e.into()))?)
        }
        StoreUrl::Redis(url) => {
            let mut builder = idem_redis::RedisStore::builder(&url);
            if let Some(ns) = &options.namespace {
                builder = builder.key_prefix(ns.key_prefix());
            }
            Arc::new(builder.connect().await.map_err(|e| wrap(e.into()))?)
        }
    };
    Ok(store)
}

/// The first pause before the background task tries an unreachable store again; each
/// failure doubles it, up to [`REOPEN_PAUSE_MAX`].
const REOPEN_PAUSE_MIN: Duration = Duration::from_millis(250);

/// The longest pause between two tries to reach a store that was unreachable at start.
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(5);

/// Opens the store `url` names, like [`open_with`], except when a PostgreSQL or Redis
/// server cannot be reached: then it returns a [`Deferred`] store at once and keeps
/// trying in the background. Every other failure (an unsupported or invalid URL, a
/// SQLite file that cannot be opened, an invalid table name) is returned, since trying
/// again would not change it.
pub async fn open_or_defer(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>, OpenError> {
    match open_with(url, options.clone()).await {
        Ok(store) => Ok(store),
        Err(e) if unreachable(&e) => {
            tracing::error!(
                error = %e,
                "the store is unreachable; serving unkeyed traffic and answering keyed \
                 requests 503 until it is reached"
            );
            Ok(Arc::new(Deferred::start(url.to_owned(), options)))
        }
        Err(e) => Err(e),
    }
}

/// Whether `e` says a network store's server could not be reached (or refused the
/// session), which may change on its own, rather than that the configuration is wrong.
fn unreachable(e: &OpenError) -> bool {
    let OpenError::Open { kind, source, .. } = e else {
        return false;
    };
    let store_error = match *kind {
        "postgres" => match source.downcast_ref::<idem_postgres::Error>() {
            Some(idem_postgres::Error::Store(e)) => e,
            _ => return false,
        },
        "redis" => match source.downcast_ref::<StoreError>() {
            Some(e) => e,
            None => return false,
        },
        _ => return false,
    };
    matches!(store_error, StoreError::Unavailable(_))
}

/// A PostgreSQL or Redis store that could not be reached when the gateway started.
///
/// Until a background task reaches it, every operation fails with
/// [`StoreError::Unavailable`]: keyed requests get the fail-closed 503 (nothing is
/// forwarded) and `/readyz` answers 503, as during any later outage. From then on every
/// operation goes to the opened store (migrated first, for PostgreSQL). The task tries
/// again after 250 ms, doubling the pause up to 5 s, and logs each failure. Dropping or
/// closing the store stops it.
pub struct Deferred {
    opened: Arc<OnceLock<Arc<dyn Store>>>,
    opener: tokio::task::AbortHandle,
    /// The URL, password removed, for errors.
    url: Arc<str>,
}

impl Deferred {
    /// Starts trying to open `url` in the background; call inside a tokio runtime.
    fn start(url: String, options: StoreOptions) -> Deferred {
        let opened = Arc::new(OnceLock::new());
        let slot = opened.clone();
        let redacted: Arc<str> = redact(&url).into();
        let shown = redacted.clone();
        let opener = tokio::spawn(async move {
            let mut pause = REOPEN_PAUSE_MIN;
            loop {
                tokio::time::sleep(pause).await;
                match open_with(&url, options.clone()).await {
                    Ok(store) => {
                        tracing::info!(store = %shown, "the store is reachable; serving keyed requests");
                        let _ = slot.set(store);
                        return;
                    }
                    Err(e) => {
                        pause = (pause * 2).min(REOPEN_PAUSE_MAX);
                        tracing::warn!(error = %e, retry_in = ?pause, "the store is still unreachable");
                    }
                }
            }
        })
        .abort_handle();
        Deferred {
            opened,
            opener,
            url: redacted,
        }
    }

    /// The opened store, once the background task has reached it.
    fn opened(&self) -> idem_core::Result<&dyn Store> {
        match self.opened.get() {
            Some(store) => Ok(&**store),
            None => Err(StoreError::unavailable(format!(
                "the store at {} has not been reached since the gateway started",
                self.url
            ))),
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        self.opener.abort();
    }
}

impl fmt::Debug for Deferred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deferred")
            .field("url", &self.url)
            .field("opened", &self.opened.get().is_some())
            .finish()
    }
}

#[async_trait]
impl Store for Deferred {
    async fn reserve(&self, request: &ReserveRequest) -> idem_core::Result<Reservation> {
        self.opened()?.reserve(request).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> idem_core::Result<()> {
        self.opened()?.complete(lease, response).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> idem_core::Result<()> {
        self.opened()?.renew(lease, lease_for).await
    }

    async fn release(&self, lease: &Lease) -> idem_core::Result<()> {
        self.opened()?.release(lease).await
    }

    async fn get(&self, scope: &Scope) -> idem_core::Result<Option<Record>> {
        self.opened()?.get(scope).await
    }

    async fn remove(&self, scope: &Scope) -> idem_core::Result<bool> {
        self.opened()?.remove(scope).await
    }

    async fn purge_expired(&self, limit: usize) -> idem_core::Result<usize> {
        self.opened()?.purge_expired(limit).await
    }

    async fn ping(&self) -> idem_core::Result<()> {
        self.opened()?.ping().await
    }

    /// Unavailable until the store is reached, like every operation: the layer then
    /// answers keyed requests 503 without scoping them, and reads the secret on the
    /// first keyed request after the store is reached.
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> idem_core::Result<Vec<u8>> {
        self.opened()?.init_secret(name, candidate).await
    }

    async fn close(&self) {
        self.opener.abort();
        if let Some(store) = self.opened.get() {
            store.close().await;
        }
    }

    /// The opened store's, once it is reached; none before.
    fn metrics(&self) -> Vec<StoreMetric> {
        self.opened.get().map(|s| s.metrics()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::testing::{test_fingerprint, test_scope};
    use idem_test_support::figure;

    #[test]
    fn store_urls_select_their_store() {
        assert_eq!(
            StoreUrl::parse("memory://").unwrap(),
            StoreUrl::Memory(idem_core::DEFAULT_MAX_ENTRIES)
        );
        assert_eq!(
            StoreUrl::parse("memory://?max_entries=5000000").unwrap(),
            StoreUrl::Memory(5_000_000)
        );
        assert_eq!(
            StoreUrl::parse("sqlite://idem.db").unwrap(),
            StoreUrl::Sqlite("sqlite://idem.db".into())
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///var/lib/idem/idem.db").unwrap(),
            StoreUrl::Sqlite("sqlite:///var/lib/idem/idem.db".into())
        );
        assert_eq!(
            StoreUrl::parse("postgres://u:p@127.0.0.1/test")
                .unwrap()
                .kind(),
            "postgres"
        );
        assert_eq!(
            StoreUrl::parse("redis://127.0.0.1:6379").unwrap().kind(),
            "redis"
        );
        assert!(StoreUrl::parse("mysql://x").is_err());
        assert!(StoreUrl::parse("idem.db").is_err());
        assert!(StoreUrl::parse("sqlite://").is_err());
    }

    #[test]
    fn unknown_url_parameters_are_refused() {
        for url in [
            "postgres://u@127.0.0.1/test?sslmode=require&application_name=idem",
            "postgresql://127.0.0.1/test?options=-c%20synchronous_commit%3Doff",
            "postgres://127.0.0.1/test?options[statement_timeout]=5s",
            "redis://127.0.0.1:6379/0?protocol=resp3",
            "redis://127.0.0.1:6379/",
        ] {
            assert!(StoreUrl::parse(url).is_ok(), "{url}");
        }
        for (url, kind, name) in [
            (
                "postgres://u@127.0.0.1/test?ssl_mode=require",
                "postgres",
                "ssl_mode",
            ),
            (
                "postgres://127.0.0.1/test?sslmode=require&prefix=x",
                "postgres",
                "prefix",
            ),
            (
                "redis://127.0.0.1:6379/?prefix=idem_prof",
                "redis",
                "prefix",
            ),
            ("redis://127.0.0.1:6379/?timeout=5", "redis", "timeout"),
        ] {
            let e = StoreUrl::parse(url).unwrap_err();
            let message = e.to_string();
            assert!(
                matches!(e, OpenError::Invalid { kind: k, .. } if k == kind),
                "{url}: {message}"
            );
            assert!(
                message.contains(&format!("unknown parameter {name:?}")),
                "{message}"
            );
        }
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/idem?sslmode=disable"),
            "postgres://app:***@db:5432/idem?sslmode=disable"
        );
        assert_eq!(redact("redis://:pw@127.0.0.1"), "redis://:***@127.0.0.1");
        assert_eq!(redact("redis://127.0.0.1"), "redis://127.0.0.1");
        let dbg = format!("{:?}", StoreUrl::parse("postgres://a:b@h/d").unwrap());
        assert!(!dbg.contains(":b@"), "{dbg}");
    }

    #[test]
    fn redis_urls_that_cannot_work_are_refused_before_connecting() {
        for url in ["redis://127.0.0.1:notaport", "rediss://127.0.0.1:6379"] {
            let e = StoreUrl::parse(url).unwrap_err();
            assert!(
                matches!(e, OpenError::Invalid { kind: "redis", .. }),
                "{url}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn an_unreachable_network_store_is_deferred_and_fails_closed() {
        // Port 1 on loopback: refused at once, no traffic leaves the machine.
        let store = open_or_defer("redis://127.0.0.1:1", StoreOptions::default())
            .await
            .unwrap();
        assert!(matches!(
            store.ping().await,
            Err(StoreError::Unavailable(_))
        ));
        let scope = Scope::new(
            idem_core::ScopeMode::Public,
            idem_core::Tenant::anonymous(),
            idem_core::Endpoint::new("POST", "/v1/charges"),
            idem_core::Key::new("k-1").unwrap(),
        );
        let request = ReserveRequest::new(scope, idem_core::Fingerprint::from_bytes([0; 32]));
        assert!(matches!(
            store.reserve(&request).await,
            Err(StoreError::Unavailable(_))
        ));
        store.close().await;
    }

    #[tokio::test]
    async fn a_store_that_cannot_be_opened_for_other_reasons_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/missing/dir/idem.db", dir.path().display());
        assert!(open_or_defer(&url, StoreOptions::default()).await.is_err());
        assert!(
            open_or_defer("mysql://x", StoreOptions::default())
                .await
                .is_err()
        );
    }

    #[test]
    fn namespaces_are_plain_identifiers_that_fit_a_table_name() {
        for ok in ["idem", "payments_v2", "_staging", "a", &"n".repeat(55)] {
            let ns = Namespace::new(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            assert_eq!(ns.table(), format!("{ok}_records"));
            assert_eq!(ns.key_prefix(), format!("{ok}:"));
        }
        for bad in [
            "",
            "9lives",
            "pay-ments",
            "a b",
            "a:b",
            "idem;drop",
            "tablé",
            "Payments",
        ] {
            let e = Namespace::new(bad).unwrap_err();
            assert!(e.contains("is not a namespace"), "{bad:?}: {e}");
        }
        let e = Namespace::new(&"n".repeat(56)).unwrap_err();
        assert!(e.contains("at most 55 characters"), "{e}");
        let default = Namespace::default();
        assert_eq!(default.table(), idem_sqlite::DEFAULT_TABLE);
        assert_eq!(default.table(), idem_postgres::DEFAULT_TABLE);
        assert_eq!(default.key_prefix(), idem_redis::DEFAULT_KEY_PREFIX);
    }

    /// Two namespaces in one SQLite file are two tables: a key recorded in one is
    /// free in the other, and the default namespace is the store's default table.
    #[tokio::test]
    async fn a_namespace_is_a_table_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/idem.db", dir.path().display());
        let with = |name: &str| StoreOptions {
            namespace: Some(Namespace::new(name).unwrap()),
            ..StoreOptions::default()
        };
        let a = open_with(&url, with("payments")).await.unwrap();
        let b = open_with(&url, with("orders")).await.unwrap();
        let default = open_with(&url, StoreOptions::default()).await.unwrap();
        let scope = Scope::from_parts(
            idem_core::Tenant::anonymous(),
            None,
            idem_core::Key::new("k").unwrap(),
        );
        let request =
            || ReserveRequest::new(scope.clone(), idem_core::Fingerprint::from_bytes([7; 32]));
        for store in [&a, &b, &default] {
            let reserved = store.reserve(&request()).await.unwrap();
            assert!(matches!(reserved, Reservation::Acquired(_)), "{reserved:?}");
        }
        assert!(matches!(
            a.reserve(&request()).await.unwrap(),
            Reservation::InProgress { .. }
        ));
        for store in [a, b, default] {
            store.close().await;
        }
        // Each namespace's table, opened by name, holds the record.
        for table in ["payments_records", "orders_records", "idem_records"] {
            let store = idem_sqlite::SqliteStore::builder()
                .table(table)
                .connect(&url)
                .await
                .unwrap();
            assert!(store.get(&scope).await.unwrap().is_some(), "{table}");
            store.close().await;
        }
    }

    #[tokio::test]
    async fn memory_store_opens_and_answers() {
        let store = open("memory://").await.unwrap();
        store.ping().await.unwrap();
    }

    #[tokio::test]
    async fn a_memory_url_sets_the_bound_and_the_store_keeps_it() {
        let store = open("memory://?max_entries=2").await.unwrap();
        assert_eq!(figure(&*store, "idem_memory_max_records"), 2);
        for key in ["a", "b"] {
            let request = ReserveRequest::new(test_scope("/x", key), test_fingerprint("{}"));
            assert!(store.reserve(&request).await.unwrap().lease().is_some());
        }
        // Both in progress: nothing may be dropped to make room.
        let third = ReserveRequest::new(test_scope("/x", "c"), test_fingerprint("{}"));
        assert!(matches!(store.reserve(&third).await, Err(StoreError::Full)));
    }

    #[test]
    fn a_memory_url_with_anything_else_is_refused_with_the_reason() {
        for (url, says) in [
            ("memory://?max_entries=0", "above 0"),
            ("memory://?max_entries=lots", "above 0, not \"lots\""),
            ("memory://?max_entries=", "above 0"),
            ("memory://?size=3", "unknown parameter \"size=3\""),
            ("memory://localhost", "no host or path"),
        ] {
            let e = StoreUrl::parse(url).unwrap_err();
            assert!(
                matches!(e, OpenError::Invalid { kind: "memory", .. }),
                "{url}: {e:?}"
            );
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
    }
}
