//! Store selection from the `--store` URL: a table from the URL's scheme to the store
//! crate that opens it. Each store parses its own URL, refuses what it would not read,
//! and says which of its failures may pass ([`OpenError`]).
//!
//! | URL | store |
//! |---|---|
//! | `memory://` | `idem_core::MemoryStore` (one process, lost on restart; at most 100 000 records unless `?max_entries=N` says otherwise, and when full it drops the completed records closest to expiry, whose retries would execute again) |
//! | `sqlite://FILE`, `sqlite:///abs/path` | `idem_sqlite::SqliteStore` (the embedded default; `?synchronous=full` syncs every commit, `?page_size=1024` makes a new file with 1 KiB pages) |
//! | `postgres://…`, `postgresql://…` | `idem_postgres::PgStore` (shared by several gateways; TLS with `sslmode`, `sslrootcert`, `sslcert`, `sslkey`) |
//! | `redis://…`, `rediss://…` | `idem_redis::RedisStore` (shared by several gateways; `rediss` is TLS, with `cacert`, `cert`, `key`, `insecure=true`) |
//! | `redis+cluster://…`, `rediss+cluster://…` | `idem_redis::RedisStore` on a Redis Cluster |
//! | `mysql://…`, `mariadb://…` | `idem_mysql::MySqlStore` (shared by several gateways) |
//!
//! A query parameter that the store would not read is refused, not skipped: the
//! drivers for PostgreSQL and Redis pass over unknown ones, so a misspelt `sslmode`
//! would connect without TLS.
//!
//! A [`Namespace`] (`--store-namespace`) picks the table or key prefix within the store,
//! so that gateways in front of different APIs can share one. Gateways in front of
//! different APIs need different namespaces on one store: a scope is tenant, endpoint
//! and key, and two APIs may well both serve `POST /v1/orders` to the same tenant.
//! Gateways in front of the same API must share one, or a retry that reaches the other
//! gateway would execute again.
//!
//! `idem serve` opens its store otherwise than [`open`]: a PostgreSQL or Redis server
//! that cannot be reached at start does not stop the gateway, which serves unkeyed
//! traffic and answers keyed requests 503 until a background task reaches the store.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Forward, MemoryStore, MigrationPlan, OpenStore, Store, StoreError};
use idem_mysql::MySqlStore;
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;

pub(crate) use idem_core::redact_url as redact;
pub use idem_core::{Namespace, OpenError, StoreOptions};

/// A store being opened, whatever its kind.
type Opening = Pin<Box<dyn Future<Output = Result<Arc<dyn Store>, OpenError>> + Send>>;

/// A store's migration plan being read.
type Planning = Pin<Box<dyn Future<Output = Result<Option<MigrationPlan>, OpenError>> + Send>>;

/// One row of the table: a kind of store, the schemes that name it, and what its
/// crate says about it.
struct Opener {
    kind: &'static str,
    schemes: &'static [&'static str],
    expires_natively: bool,
    operation_timeout: Option<Duration>,
    descriptors: fn(&StoreOptions) -> u64,
    open: fn(String, StoreOptions) -> Opening,
    plan: fn(String, StoreOptions) -> Planning,
}

impl Opener {
    const fn of<S: OpenStore>() -> Opener {
        Opener {
            kind: S::KIND,
            schemes: S::SCHEMES,
            expires_natively: S::EXPIRES_NATIVELY,
            operation_timeout: S::OPERATION_TIMEOUT,
            descriptors: S::descriptors,
            open: open_as::<S>,
            plan: plan_as::<S>,
        }
    }
}

fn open_as<S: OpenStore>(url: String, options: StoreOptions) -> Opening {
    Box::pin(async move { Ok(Arc::new(S::open(&url, &options).await?) as Arc<dyn Store>) })
}

fn plan_as<S: OpenStore>(url: String, options: StoreOptions) -> Planning {
    Box::pin(async move { S::plan(&url, &options).await })
}

/// Every store the gateway can open.
static OPENERS: [Opener; 5] = [
    Opener::of::<MemoryStore>(),
    Opener::of::<SqliteStore>(),
    Opener::of::<PgStore>(),
    Opener::of::<RedisStore>(),
    Opener::of::<MySqlStore>(),
];

/// The URLs [`OPENERS`] understand, for the error that names none of them.
pub(crate) const EXPECTED: &str = "memory://, sqlite://FILE, postgres://…, redis://…, rediss://…, redis+cluster://…, rediss+cluster://… or mysql://…";

/// The row for `url`'s scheme, in any case.
fn opener(url: &str) -> Result<&'static Opener, OpenError> {
    let unsupported = || OpenError::Unsupported {
        url: redact(url),
        expected: EXPECTED,
        near: near_scheme(url),
    };
    let (scheme, _) = url.split_once("://").ok_or_else(unsupported)?;
    let scheme = scheme.to_ascii_lowercase();
    OPENERS
        .iter()
        .find(|opener| opener.schemes.contains(&scheme.as_str()))
        .ok_or_else(unsupported)
}

/// For a URL no store answers to, the scheme it most likely meant, as flags and TOML
/// keys get theirs: a known one near its scheme (`postgress://`), or its own when
/// only the `//` is missing (`sqlite:idem.db`).
fn near_scheme(url: &str) -> Option<&'static str> {
    let schemes = || {
        OPENERS
            .iter()
            .flat_map(|opener| opener.schemes.iter().copied())
    };
    if let Some((scheme, _)) = url.split_once("://") {
        return crate::nearest::nearest(&scheme.to_ascii_lowercase(), schemes());
    }
    let (scheme, _) = url.split_once(':')?;
    let scheme = scheme.to_ascii_lowercase();
    schemes().find(|known| *known == scheme)
}

/// Whether some store answers to `url`'s scheme, without opening it: the error
/// opening it would give when none does, naming the scheme it most likely meant.
pub(crate) fn check_scheme(url: &str) -> Result<(), OpenError> {
    opener(url.trim()).map(|_| ())
}

/// Which store `url` names (`memory`, `sqlite`, `postgres`, `redis`, `mysql`), if any,
/// without opening it.
pub(crate) fn kind(url: &str) -> Option<&'static str> {
    opener(url.trim()).ok().map(|opener| opener.kind)
}

/// The most file descriptors the store `url` names holds when opened with `options`
/// (0 when it names none), as its crate counts them.
pub(crate) fn descriptors(url: &str, options: &StoreOptions) -> u64 {
    opener(url.trim()).map_or(0, |opener| (opener.descriptors)(options))
}

/// The longest one operation of the store `url` names may take before it fails, at its
/// defaults, as its crate says (`None` for one in the process, or a URL that names none).
pub(crate) fn operation_timeout(url: &str) -> Option<Duration> {
    opener(url.trim()).ok()?.operation_timeout
}

/// Opens (and for SQL stores migrates) the store a URL names, with default options.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    open_with(url, StoreOptions::default()).await
}

/// Opens (and for SQL stores migrates) the store a URL names.
pub(crate) async fn open_with(
    url: &str,
    options: StoreOptions,
) -> Result<Arc<dyn Store>, OpenError> {
    let url = url.trim();
    (opener(url)?.open)(url.to_owned(), options).await
}

/// What opening the store `url` names with migration on would change in its schema,
/// found writing nothing (`idem migrate --dry-run`); `None` for a store that keeps no
/// schema.
pub async fn plan(url: &str, options: StoreOptions) -> Result<Option<MigrationPlan>, OpenError> {
    let url = url.trim();
    (opener(url)?.plan)(url.to_owned(), options).await
}

/// The first pause before the background task tries an unreachable store again; each
/// failure doubles it, up to [`REOPEN_PAUSE_MAX`].
const REOPEN_PAUSE_MIN: Duration = Duration::from_millis(250);

/// The longest pause between two tries to reach a store that was unreachable at start.
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(5);

/// Opens the store `url` names, like [`open_with`], except when its server cannot be
/// reached or refuses it now ([`OpenError::may_pass`]): then it returns a [`Deferred`]
/// store at once and keeps trying in the background. Every other failure (an
/// unsupported or invalid URL, a SQLite file that cannot be opened, an invalid
/// namespace) is returned, since trying again would not change it.
pub(crate) async fn open_or_defer(
    url: &str,
    options: StoreOptions,
) -> Result<Arc<dyn Store>, OpenError> {
    match open_with(url, options.clone()).await {
        Ok(store) => Ok(store),
        Err(e) if e.may_pass() => {
            tracing::error!(
                error = %e,
                "the store is unreachable; serving unkeyed traffic and answering keyed \
                 requests 503 until it is reached"
            );
            let opener = opener(url.trim())?;
            Ok(Arc::new(Deferred::start(opener, url.trim(), options)))
        }
        Err(e) => Err(e),
    }
}

/// A store whose server could not be reached when the gateway started.
///
/// Until a background task reaches it, every operation fails with
/// [`StoreError::Unavailable`]: keyed requests get the fail-closed 503 (nothing is
/// forwarded) and `/readyz` answers 503, as during any later outage. From then on every
/// operation goes to the opened store (migrated first, for the SQL stores). The task tries
/// again after 250 ms, doubling the pause up to 5 s, and logs each failure. Dropping or
/// closing the store stops it. Whether it expires records natively is its kind's
/// answer from the start, so that the gateway decides on a sweeper once.
pub(crate) struct Deferred {
    opened: Arc<OnceLock<Arc<dyn Store>>>,
    opener: tokio::task::AbortHandle,
    expires_natively: bool,
    /// The URL, password removed, for errors.
    url: Arc<str>,
}

impl Deferred {
    /// Starts trying to open `url` in the background; call inside a tokio runtime.
    fn start(opener: &'static Opener, url: &str, options: StoreOptions) -> Deferred {
        let opened = Arc::new(OnceLock::new());
        let slot = opened.clone();
        let redacted: Arc<str> = redact(url).into();
        let url = url.to_owned();
        let task = tokio::spawn(async move {
            let mut pause = REOPEN_PAUSE_MIN;
            loop {
                tokio::time::sleep(pause).await;
                match (opener.open)(url.clone(), options.clone()).await {
                    Ok(store) => {
                        tracing::info!(store = %redact(&url), "the store is reachable; serving keyed requests");
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
            opener: task,
            expires_natively: opener.expires_natively,
            url: redacted,
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

/// Every operation goes to the opened store; before it is reached, each fails with
/// [`StoreError::Unavailable`] (the layer then answers keyed requests 503 without
/// scoping them, and reads the tenant secret on the first keyed request after), and
/// there are no figures.
#[async_trait]
impl Forward for Deferred {
    type Target = dyn Store;

    fn target(&self) -> idem_core::Result<&(dyn Store + 'static)> {
        match self.opened.get() {
            Some(store) => Ok(&**store),
            None => Err(StoreError::unavailable(format!(
                "the store at {} has not been reached since the gateway started",
                self.url
            ))),
        }
    }

    async fn forward_close(&self) {
        self.opener.abort();
        if let Some(store) = self.opened.get() {
            store.close().await;
        }
    }

    fn forward_expires_natively(&self) -> bool {
        self.expires_natively
    }
}

#[cfg(test)]
mod tests;
