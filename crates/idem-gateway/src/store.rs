//! Store selection from the `--store` URL.
//!
//! | URL | store |
//! |---|---|
//! | `memory://` | `idem_core::MemoryStore` (one process, lost on restart) |
//! | `sqlite://FILE`, `sqlite:///abs/path` | `idem_sqlite::SqliteStore` (the embedded default) |
//! | `postgres://…`, `postgresql://…` | `idem_postgres::PgStore` (shared by several gateways) |
//! | `redis://…` | `idem_redis::RedisStore` (shared by several gateways) |

use std::fmt;
use std::sync::Arc;

use idem_core::{MemoryStore, Store};

/// A parsed `--store` URL.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory://`.
    Memory,
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
            "memory" | "mem" => Ok(StoreUrl::Memory),
            "sqlite" => {
                if rest.split('?').next().unwrap_or_default().is_empty() {
                    return Err(OpenError::Unsupported(redact(url)));
                }
                Ok(StoreUrl::Sqlite(url.to_owned()))
            }
            "postgres" | "postgresql" => Ok(StoreUrl::Postgres(url.to_owned())),
            "redis" | "rediss" => Ok(StoreUrl::Redis(url.to_owned())),
            _ => Err(OpenError::Unsupported(redact(url))),
        }
    }

    /// A short name for logs: `memory`, `sqlite`, `postgres`, `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreUrl::Memory => "memory",
            StoreUrl::Sqlite(_) => "sqlite",
            StoreUrl::Postgres(_) => "postgres",
            StoreUrl::Redis(_) => "redis",
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory://"),
            StoreUrl::Sqlite(u) | StoreUrl::Postgres(u) | StoreUrl::Redis(u) => {
                f.write_str(&redact(u))
            }
        }
    }
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Connections in the pool of the SQL stores; `None` keeps the store's default.
    /// Redis multiplexes one connection and ignores it.
    pub pool: Option<u32>,
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
        StoreUrl::Memory => Arc::new(MemoryStore::new()),
        StoreUrl::Sqlite(url) => {
            let mut builder = idem_sqlite::SqliteStore::builder();
            if let Some(n) = options.pool {
                builder = builder.max_connections(n);
            }
            Arc::new(builder.connect(&url).await.map_err(|e| wrap(e.into()))?)
        }
        StoreUrl::Postgres(url) => {
            let mut builder = idem_postgres::PgStore::options();
            if let Some(n) = options.pool {
                builder = builder.max_connections(n);
            }
            Arc::new(builder.connect(&url).await.map_err(|e| wrap(e.into()))?)
        }
        StoreUrl::Redis(url) => Arc::new(
            idem_redis::RedisStore::builder(&url)
                .connect()
                .await
                .map_err(|e| wrap(e.into()))?,
        ),
    };
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_select_their_store() {
        assert_eq!(StoreUrl::parse("memory://").unwrap(), StoreUrl::Memory);
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

    #[tokio::test]
    async fn memory_store_opens_and_answers() {
        let store = open("memory://").await.unwrap();
        store.ping().await.unwrap();
    }
}
