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
//! [`open_or_defer`] is how `idem serve` opens its store: a PostgreSQL or Redis server
//! that cannot be reached at start does not stop the gateway, which serves unkeyed
//! traffic and answers keyed requests 503 until a background task reaches the store.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Forward, MemoryStore, MigrationPlan, OpenStore, Store, StoreError};
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;

pub use idem_core::{Namespace, OpenError, StoreOptions, redact_url as redact};

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
            descriptors: S::descriptors,
            open: open_as::<S>,
            plan: plan_as::<S>,
        }
    }
}

fn open_as<S: OpenStore>(url: String, options: StoreOptions) -> Opening {
    Box::pin(async move {
        let store: Arc<dyn Store> = Arc::new(S::open(&url, &options).await?);
        Ok(store)
    })
}

fn plan_as<S: OpenStore>(url: String, options: StoreOptions) -> Planning {
    Box::pin(async move { S::plan(&url, &options).await })
}

/// Every store the gateway can open.
static OPENERS: [Opener; 4] = [
    Opener::of::<MemoryStore>(),
    Opener::of::<SqliteStore>(),
    Opener::of::<PgStore>(),
    Opener::of::<RedisStore>(),
];

/// The URLs [`OPENERS`] understand, for the error that names none of them.
pub(crate) const EXPECTED: &str = "memory://, sqlite://FILE, postgres://…, redis://…, rediss://…, redis+cluster://… or rediss+cluster://…";

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
        return crate::config::nearest(&scheme.to_ascii_lowercase(), schemes());
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

/// Which store `url` names (`memory`, `sqlite`, `postgres`, `redis`), if any, without
/// opening it.
pub fn kind(url: &str) -> Option<&'static str> {
    opener(url.trim()).ok().map(|opener| opener.kind)
}

/// The most file descriptors the store `url` names holds when opened with `options`
/// (0 when it names none), as its crate counts them.
pub fn descriptors(url: &str, options: &StoreOptions) -> u64 {
    opener(url.trim()).map_or(0, |opener| (opener.descriptors)(options))
}

/// Opens (and for SQL stores migrates) the store a URL names, with default options.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    open_with(url, StoreOptions::default()).await
}

/// Opens (and for SQL stores migrates) the store a URL names.
pub async fn open_with(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>, OpenError> {
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

/// What `idem check-config` finds of the store `url` names, writing nothing (no file,
/// no table, no migration, no `-wal` left behind): a sentence for its report, or the
/// exit status and the error. A SQLite file that is not there yet is fine when its
/// directory is (`serve` creates it); a store without this build's schema is fine
/// unless `options` say not to migrate.
pub async fn check(url: &str, options: &StoreOptions) -> Result<String, (u8, OpenError)> {
    let url = url.trim();
    let migrates = options.schema == idem_core::Schema::Migrate;
    if kind(url) == Some("sqlite") {
        let path = url
            .split_once("://")
            .map_or("", |(_, rest)| rest)
            .split('?')
            .next()
            .unwrap_or_default();
        let path = std::path::Path::new(path);
        if !path.exists() && migrates {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => std::path::Path::new("."),
            };
            if !dir.is_dir() {
                return Err((
                    2,
                    OpenError::failed(
                        "sqlite",
                        url,
                        format!("the directory {} does not exist", dir.display()),
                    ),
                ));
            }
            return Ok("not there yet: serve creates it".to_owned());
        }
    }
    let inspect = StoreOptions {
        schema: idem_core::Schema::Existing,
        ..options.clone()
    };
    let store = match open_with(url, inspect).await {
        Ok(store) => store,
        Err(OpenError::NoSchema { .. }) if migrates => {
            return Ok("reachable; serve creates its table".to_owned());
        }
        Err(e @ OpenError::Failed { .. }) if migrates && e.to_string().contains("idem migrate") => {
            return Ok("reachable; serve migrates its schema".to_owned());
        }
        Err(e) => {
            // Wrong as written, like the settings; else a failure to reach or use it.
            let code = if e.is_configuration() { 2 } else { 1 };
            return Err((code, e));
        }
    };
    let pinged = store.ping().await;
    store.close().await;
    match pinged {
        Ok(()) => Ok("reachable".to_owned()),
        Err(e) => Err((1, OpenError::unreachable(store_kind(url), url, e))),
    }
}

fn store_kind(url: &str) -> &'static str {
    kind(url).unwrap_or("store")
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
pub async fn open_or_defer(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>, OpenError> {
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
/// operation goes to the opened store (migrated first, for PostgreSQL). The task tries
/// again after 250 ms, doubling the pause up to 5 s, and logs each failure. Dropping or
/// closing the store stops it. Whether it expires records natively is its kind's
/// answer from the start, so that the gateway decides on a sweeper once.
pub struct Deferred {
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
        let shown = redacted.clone();
        let url = url.to_owned();
        let task = tokio::spawn(async move {
            let mut pause = REOPEN_PAUSE_MIN;
            loop {
                tokio::time::sleep(pause).await;
                match (opener.open)(url.clone(), options.clone()).await {
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
mod tests {
    use super::*;
    use idem_core::testing::{test_fingerprint, test_scope};
    use idem_core::{Reservation, ReserveRequest, Scope};
    use idem_test_support::figure;

    #[tokio::test]
    async fn store_urls_select_their_store() {
        let store = open("memory://").await.unwrap();
        assert_eq!(
            figure(&*store, "idem_memory_max_records"),
            idem_core::DEFAULT_MAX_ENTRIES as u64
        );
        let store = open("memory://?max_entries=5000000").await.unwrap();
        assert_eq!(figure(&*store, "idem_memory_max_records"), 5_000_000);
        assert_eq!(kind("memory://"), Some("memory"));
        assert_eq!(kind("MEM://"), Some("memory"));
        assert_eq!(kind("sqlite://idem.db"), Some("sqlite"));
        assert_eq!(kind("sqlite:///var/lib/idem/idem.db"), Some("sqlite"));
        assert_eq!(kind("postgres://u:p@127.0.0.1/test"), Some("postgres"));
        assert_eq!(kind("postgresql://127.0.0.1/test"), Some("postgres"));
        assert_eq!(kind("redis://127.0.0.1:6379"), Some("redis"));
        for url in ["mysql://x", "idem.db"] {
            let e = open(url).await.err().expect(url);
            assert!(matches!(e, OpenError::Unsupported { .. }), "{url}: {e}");
            assert!(
                e.to_string().contains("use memory://, sqlite://FILE"),
                "{url}: {e}"
            );
            assert_eq!(kind(url), None);
        }
        assert!(open("sqlite://").await.is_err());
    }

    /// A misspelt scheme gets the one it most likely meant, as flags and TOML keys
    /// do, besides the list; one that is near none gets the list alone.
    #[tokio::test]
    async fn a_misspelt_scheme_gets_the_nearest_one() {
        for (url, near) in [
            ("postgress://u:secret@127.0.0.1/test", Some("postgres")),
            ("Postgress://127.0.0.1/test", Some("postgres")),
            ("sqlite3://idem.db", Some("sqlite")),
            ("redis-cluster://127.0.0.1:7000", Some("redis+cluster")),
            ("reddis://127.0.0.1", Some("redis")),
            ("sqlite:idem.db", Some("sqlite")),
            ("mysql://x", None),
            ("idem.db", None),
        ] {
            let e = open(url).await.err().expect(url).to_string();
            match near {
                Some(near) => assert!(e.contains(&format!("did you mean {near}://?")), "{e}"),
                None => assert!(!e.contains("did you mean"), "{e}"),
            }
            assert!(e.contains("use memory://, sqlite://FILE"), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[tokio::test]
    async fn unknown_url_parameters_are_refused() {
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
            let e = open(url).await.err().expect(url);
            let message = e.to_string();
            assert!(
                matches!(e, OpenError::InvalidUrl { kind: k, .. } if k == kind),
                "{url}: {message}"
            );
            assert!(
                message.contains(&format!("unknown parameter {name:?}")),
                "{message}"
            );
        }
    }

    #[tokio::test]
    async fn passwords_never_reach_logs() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/idem?sslmode=disable"),
            "postgres://app:***@db:5432/idem?sslmode=disable"
        );
        assert_eq!(redact("redis://:pw@127.0.0.1"), "redis://:***@127.0.0.1");
        assert_eq!(redact("redis://127.0.0.1"), "redis://127.0.0.1");
        let e = open("postgres://a:b@h/d?prefix=x").await.err().unwrap();
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(":b@"), "{shown}");
    }

    #[tokio::test]
    async fn network_store_urls_that_cannot_work_are_refused_before_connecting() {
        for url in [
            "redis://127.0.0.1:notaport",
            "rediss://127.0.0.1:6379/#insecure",
            "rediss://127.0.0.1:6379/?cacert=/nonexistent/ca.pem",
            "postgres://127.0.0.1/test?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        ] {
            let e = open(url).await.err().expect(url);
            assert!(matches!(e, OpenError::InvalidUrl { .. }), "{url}: {e}");
            assert!(e.is_configuration(), "{url}");
        }
    }

    #[test]
    fn descriptors_are_the_store_crates_count() {
        let pool = |n| StoreOptions {
            pool: Some(n),
            ..StoreOptions::default()
        };
        assert_eq!(descriptors("memory://", &pool(4)), 0);
        assert_eq!(descriptors("sqlite://idem.db", &pool(4)), 12);
        assert_eq!(
            descriptors("sqlite://idem.db", &StoreOptions::default()),
            3 * u64::from(idem_sqlite::DEFAULT_MAX_CONNECTIONS)
        );
        assert_eq!(descriptors("postgres://h/d", &pool(4)), 4);
        assert_eq!(
            descriptors("postgres://h/d", &StoreOptions::default()),
            u64::from(idem_postgres::DEFAULT_MAX_CONNECTIONS)
        );
        assert_eq!(descriptors("redis://h", &pool(4)), 2);
        assert_eq!(descriptors("mysql://h", &pool(4)), 0);
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
        // Known from the start, so that no sweeper is started for it.
        assert!(store.expires_natively());
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

    #[tokio::test]
    async fn namespaces_are_plain_identifiers_that_fit_a_table_name() {
        for ok in [
            "idem",
            "payments_v2",
            "_staging",
            "a",
            "Payments",
            &"n".repeat(55),
        ] {
            let ns = Namespace::new(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            assert_eq!(
                ns.suffixed("_records").unwrap().as_str(),
                format!("{ok}_records")
            );
        }
        for bad in [
            "",
            "9lives",
            "pay-ments",
            "a b",
            "a:b",
            "idem;drop",
            "tablé",
        ] {
            let e = Namespace::new(bad).unwrap_err();
            assert!(e.to_string().contains("is not a namespace"), "{bad:?}: {e}");
        }
        // One byte more and `NAME_records` no longer fits a table name.
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/idem.db", dir.path().display());
        let long = StoreOptions {
            namespace: Some(Namespace::new(&"n".repeat(56)).unwrap()),
            ..StoreOptions::default()
        };
        let e = open_with(&url, long).await.err().unwrap();
        assert!(
            matches!(e, OpenError::Namespace { kind: "sqlite", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("at most 63 fit"), "{e}");
        let default = Namespace::default();
        let table = default.suffixed("_records").unwrap();
        assert_eq!(table.as_str(), idem_sqlite::DEFAULT_TABLE);
        assert_eq!(table.as_str(), idem_postgres::DEFAULT_TABLE);
        assert_eq!(format!("{default}:"), idem_redis::DEFAULT_KEY_PREFIX);
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
}
