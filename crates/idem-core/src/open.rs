//! Opening a store from its URL: [`OpenStore`], which each store crate implements for
//! its own URLs, the [`OpenError`] they all return, and `memory://` for
//! [`MemoryStore`]; and [`SetupError`], which every store's builder returns, and which
//! becomes an [`OpenError`] with the URL ([`OpenError::setup`]).
//!
//! A store's URL is its own business: which parameters it reads, what they mean, and
//! which failures might pass by themselves ([`OpenError::may_pass`]). A program that
//! opens stores by URL (the gateway) keeps a table from scheme to
//! [`OpenStore::open`] and nothing else.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::{DEFAULT_MAX_ENTRIES, MemoryStore, Namespace, NamespaceError, Store};

mod setup;
#[cfg(feature = "tls")]
pub mod tls;

pub use setup::SetupError;

/// Any error, as the source of an [`OpenError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a store could not be opened from its URL. Every URL in it has its password
/// replaced by `***` ([`redact_url`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// No store answers to the URL's scheme.
    #[error("unsupported store URL {url:?}: {}use {expected}", did_you_mean(*near))]
    Unsupported {
        /// The URL.
        url: String,
        /// The URLs that would be understood, for the message.
        expected: &'static str,
        /// A scheme that is understood and near the URL's (`postgres` for
        /// `postgress://`), for a misspelt one.
        near: Option<&'static str>,
    },
    /// The URL names a store but cannot be used as written: it does not parse, asks
    /// for what this build cannot do, or carries a parameter the store would not read
    /// (which drivers skip, so that a misspelt `sslmode` would connect without TLS).
    #[error("invalid {kind} store URL {url}: {reason}")]
    InvalidUrl {
        /// Which store.
        kind: &'static str,
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The namespace, or a name the store derives from it, is not one the store can use.
    #[error("invalid namespace for the {kind} store: {source}")]
    Namespace {
        /// Which store.
        kind: &'static str,
        /// Why.
        #[source]
        source: NamespaceError,
    },
    /// The store's server could not be reached: nothing listens, the connection broke
    /// or timed out.
    #[error("cannot reach the {kind} store at {url}: {source}")]
    Unreachable {
        /// Which store.
        kind: &'static str,
        /// The URL.
        url: String,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The server was reached and refused the store: its credentials, its database, or
    /// the statements that prepare it (the migration).
    #[error("the {kind} store at {url} refused the connection or its setup: {source}")]
    Refused {
        /// Which store.
        kind: &'static str,
        /// The URL.
        url: String,
        /// The driver's or server's error.
        #[source]
        source: BoxError,
    },
    /// [`Schema::Existing`] was asked for, and nothing of this store's is there: no
    /// such file, no such table.
    #[error("no idem records at {url}: {detail}")]
    NoSchema {
        /// Which store.
        kind: &'static str,
        /// The URL.
        url: String,
        /// What is missing, and how to make it.
        detail: String,
    },
    /// The store could not be opened for another reason: a file that cannot be
    /// created, a schema newer than this build.
    #[error("cannot open the {kind} store at {url}: {source}")]
    Failed {
        /// Which store.
        kind: &'static str,
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: BoxError,
    },
}

/// The start of [`OpenError::Unsupported`]'s advice, for a scheme near a known one.
fn did_you_mean(near: Option<&str>) -> String {
    near.map(|scheme| format!("did you mean {scheme}://? Else "))
        .unwrap_or_default()
}

impl OpenError {
    /// An invalid URL of the store `kind`.
    pub fn invalid_url(kind: &'static str, url: &str, reason: impl Into<String>) -> OpenError {
        OpenError::InvalidUrl {
            kind,
            url: redact_url(url),
            reason: reason.into(),
        }
    }

    /// A server of the store `kind` that could not be reached.
    pub fn unreachable(kind: &'static str, url: &str, source: impl Into<BoxError>) -> OpenError {
        OpenError::Unreachable {
            kind,
            url: redact_url(url),
            source: source.into(),
        }
    }

    /// A server of the store `kind` that refused it.
    pub fn refused(kind: &'static str, url: &str, source: impl Into<BoxError>) -> OpenError {
        OpenError::Refused {
            kind,
            url: redact_url(url),
            source: source.into(),
        }
    }

    /// A store `kind` without its schema, which [`Schema::Existing`] does not make.
    pub fn no_schema(kind: &'static str, url: &str, detail: impl Into<String>) -> OpenError {
        OpenError::NoSchema {
            kind,
            url: redact_url(url),
            detail: detail.into(),
        }
    }

    /// A namespace of the store `kind` that no gateway ever opened (a mistyped
    /// `--store-namespace`, URL or file, as a rule), found by [`Schema::Existing`]:
    /// [`OpenError::NoSchema`] in the one shape every store gives it, so that an operator
    /// reads "never opened" alike on each and never takes it for "no records now".
    /// `missing` is what the store looked for and did not find (`no table x_records`,
    /// `no key x:meta:schema`); `migrate` says whether `idem migrate` can make it.
    pub fn never_opened(
        kind: &'static str,
        url: &str,
        namespace: &str,
        missing: impl fmt::Display,
        migrate: bool,
    ) -> OpenError {
        let or_migrate = if migrate {
            ", or `idem migrate` does"
        } else {
            ""
        };
        OpenError::no_schema(
            kind,
            url,
            format!(
                "namespace {namespace} was never opened by idem ({missing}). Check the store \
                 URL and --store-namespace: a gateway makes the namespace when it first \
                 opens it{or_migrate}"
            ),
        )
    }

    /// A store `kind` that could not be opened for another reason.
    pub fn failed(kind: &'static str, url: &str, source: impl Into<BoxError>) -> OpenError {
        OpenError::Failed {
            kind,
            url: redact_url(url),
            source: source.into(),
        }
    }

    /// Whether opening the same URL again later may succeed with nothing changed: a
    /// server that is down or refuses now may be up, or let in, in a moment. Every
    /// other error stays until the configuration changes.
    pub fn may_pass(&self) -> bool {
        matches!(
            self,
            OpenError::Unreachable { .. } | OpenError::Refused { .. }
        )
    }

    /// Whether the configuration is wrong as written: no store answers to the URL, it
    /// cannot be used as written (TLS files included), or the namespace does not fit.
    /// A program stops its start on one (the gateway exits with status 2).
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            OpenError::Unsupported { .. }
                | OpenError::InvalidUrl { .. }
                | OpenError::Namespace { .. }
        )
    }

    /// Which store the error is about; `None` when no store answers to the URL.
    pub fn kind(&self) -> Option<&'static str> {
        match self {
            OpenError::Unsupported { .. } => None,
            OpenError::InvalidUrl { kind, .. }
            | OpenError::Namespace { kind, .. }
            | OpenError::Unreachable { kind, .. }
            | OpenError::Refused { kind, .. }
            | OpenError::NoSchema { kind, .. }
            | OpenError::Failed { kind, .. } => Some(kind),
        }
    }
}

/// Settings for opening a store besides its URL; a store ignores what does not apply
/// to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Connections in a SQL store's pool; `None` keeps the store's default. Redis
    /// multiplexes one connection and ignores it.
    pub pool: Option<u32>,
    /// Where in a shared store the records live: the SQL stores use the table
    /// `NAME_records`, Redis keys that start `NAME:`. `None` is the stores' default,
    /// [`DEFAULT_NAMESPACE`](crate::DEFAULT_NAMESPACE). The memory store ignores it.
    pub namespace: Option<Namespace>,
    /// Whether a SQL store brings its schema up to date when it opens
    /// ([`Schema::Migrate`], the default) or only uses one that is already there.
    pub schema: Schema,
}

/// What a SQL store does with its schema when it opens ([`StoreOptions::schema`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Schema {
    /// Creates what is missing and runs the migrations this build has (a new SQLite
    /// file included).
    #[default]
    Migrate,
    /// Writes no schema and creates no file: the store must hold this build's schema
    /// already. None there is [`OpenError::NoSchema`]; an older one is
    /// [`OpenError::Failed`], naming the migration to run (`idem migrate`). For
    /// inspection, and for teams whose database administrators own the schema.
    Existing,
}

impl StoreOptions {
    /// The table a SQL store of the kind `kind` keeps records in: `NAME_records` for
    /// the namespace `NAME`, `None` (the store's default) without one.
    pub fn sql_table(&self, kind: &'static str) -> Result<Option<Namespace>, OpenError> {
        self.namespace
            .as_ref()
            .map(|namespace| {
                namespace
                    .suffixed("_records")
                    .map_err(|source| OpenError::Namespace { kind, source })
            })
            .transpose()
    }
}

/// A store that opens itself from a URL.
pub trait OpenStore: Store + Sized {
    /// A short name for messages and logs: `memory`, `sqlite`, `postgres`, `redis`.
    const KIND: &'static str;

    /// The URL schemes (what comes before `://`, in lower case) that name this store.
    const SCHEMES: &'static [&'static str];

    /// Whether every store of this kind deletes expired records by itself
    /// ([`Store::expires_natively`]), known before one is open.
    const EXPIRES_NATIVELY: bool = false;

    /// The longest one operation (a reserve, say) of a store opened from a URL may take,
    /// its retries included, before it fails as unavailable, at the store's defaults;
    /// `None` for a store in the process, which has no such bound. A reply that takes
    /// longer than half a lease is not executed under (see `idem-tower`), so a lease
    /// should be well over twice this.
    const OPERATION_TIMEOUT: Option<Duration> = None;

    /// The most file descriptors a store opened with `options` holds, for a process
    /// that budgets its descriptors.
    fn descriptors(options: &StoreOptions) -> u64;

    /// Opens (and, for a SQL store, migrates) the store `url` names.
    fn open(
        url: &str,
        options: &StoreOptions,
    ) -> impl Future<Output = Result<Self, OpenError>> + Send;

    /// What opening `url` with [`Schema::Migrate`] would change in its schema, found
    /// while writing nothing (no file, table or row is made): `None` for a store that
    /// keeps no schema (the default).
    fn plan(
        url: &str,
        options: &StoreOptions,
    ) -> impl Future<Output = Result<Option<MigrationPlan>, OpenError>> + Send {
        let _ = (url, options);
        async { Ok(None) }
    }
}

/// The migration a SQL store's schema needs ([`OpenStore::plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationPlan {
    /// The records table the plan is for.
    pub table: String,
    /// The schema version the table is at now; `None` when there is no such table
    /// (or no database file) yet.
    pub from: Option<u32>,
    /// The version this build brings it to.
    pub to: u32,
    /// The SQL that migrating runs, statement by statement, in one transaction;
    /// empty when the table is at `to` already.
    pub statements: Vec<String>,
}

impl MigrationPlan {
    /// Whether the table is at this build's version already.
    pub fn is_current(&self) -> bool {
        self.statements.is_empty()
    }
}

/// The URL with any password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
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

/// The query parameters of `url`, as `name=value` pairs (or bare names), empty ones
/// skipped.
pub fn query_pairs(url: &str) -> impl Iterator<Item = &str> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    query.split('&').filter(|p| !p.is_empty())
}

/// Refuses a query parameter of `url` that is not in `known`, where `options[…]` in
/// `known` stands for any `options[NAME]`: for a store whose driver passes over
/// parameters it does not know.
pub fn refuse_unknown_parameters(url: &str, known: &[&str]) -> Result<(), String> {
    for pair in query_pairs(url) {
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

/// `memory://`, holding at most [`DEFAULT_MAX_ENTRIES`] records, or
/// `memory://?max_entries=N`. `mem://` is the same.
impl OpenStore for MemoryStore {
    const KIND: &'static str = "memory";
    const SCHEMES: &'static [&'static str] = &["memory", "mem"];

    fn descriptors(_: &StoreOptions) -> u64 {
        0
    }

    async fn open(url: &str, _: &StoreOptions) -> Result<MemoryStore, OpenError> {
        let max =
            memory_bound(url).map_err(|reason| OpenError::invalid_url("memory", url, reason))?;
        Ok(MemoryStore::new().max_entries(max))
    }
}

/// The bound a `memory://` URL sets.
fn memory_bound(url: &str) -> Result<usize, String> {
    let rest = url.split_once("://").map_or("", |(_, rest)| rest);
    let query = match rest.strip_prefix('?') {
        Some(query) => query,
        None if rest.is_empty() => return Ok(DEFAULT_MAX_ENTRIES),
        None => return Err("a memory store has no host or path; write memory://".into()),
    };
    let mut max = DEFAULT_MAX_ENTRIES;
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

/// Checks of a store's [`OpenStore`] implementation, for its tests (feature `testing`).
#[cfg(any(test, feature = "testing"))]
pub mod checks {
    use std::future::Future;

    use super::{OpenError, StoreOptions};

    /// The error opening `url` fails with; panics if it opens.
    pub async fn open_error<S, F>(url: &str, open: impl FnOnce(String) -> F) -> OpenError
    where
        F: Future<Output = Result<S, OpenError>>,
    {
        match open(url.to_owned()).await {
            Ok(_) => panic!("{url} opened"),
            Err(e) => e,
        }
    }

    /// Checks that each URL of `cases` fails to open as an [`OpenError::InvalidUrl`] of
    /// the store `kind` whose message contains the case's text, and that the error does
    /// not pass by itself.
    pub async fn invalid_urls<S, F>(kind: &str, cases: &[(&str, &str)], open: impl Fn(String) -> F)
    where
        F: Future<Output = Result<S, OpenError>>,
    {
        for (url, says) in cases {
            let e = open_error(url, &open).await;
            assert!(
                matches!(&e, OpenError::InvalidUrl { kind: k, .. } if *k == kind),
                "{url}: {e:?}"
            );
            assert!(e.to_string().contains(says), "{url}: {e}");
            assert!(!e.may_pass(), "{url}");
            assert!(e.is_configuration(), "{url}");
        }
    }

    /// Checks that the store a URL with a port names fails to open at a closed
    /// loopback port as [`OpenError::Unreachable`] of the store `kind`, which may pass,
    /// and that the URL's password, which `url` makes `secret`, is not in the message.
    pub async fn unreachable_at_a_closed_port<S, F>(
        kind: &str,
        url: impl FnOnce(u16) -> String,
        open: impl FnOnce(String) -> F,
    ) where
        F: Future<Output = Result<S, OpenError>>,
    {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("a bound port").port()
        };
        let url = url(port);
        assert!(url.contains("secret"), "{url}");
        let e = open_error(&url, open).await;
        assert!(
            matches!(&e, OpenError::Unreachable { kind: k, .. } if *k == kind),
            "{e:?}"
        );
        assert!(e.may_pass());
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    /// Options with the namespace `name`.
    pub fn namespaced(name: &str) -> StoreOptions {
        StoreOptions {
            namespace: Some(crate::Namespace::new(name).expect("a namespace")),
            ..StoreOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_records(store: &MemoryStore) -> u64 {
        store
            .metrics()
            .into_iter()
            .find(|m| m.name == "idem_memory_max_records")
            .map(|m| m.value)
            .expect("the memory store reports its bound")
    }

    #[tokio::test]
    async fn a_memory_url_sets_the_bound() {
        let options = StoreOptions::default();
        let store = MemoryStore::open("memory://", &options).await.unwrap();
        assert_eq!(max_records(&store), DEFAULT_MAX_ENTRIES as u64);
        let store = MemoryStore::open("memory://?max_entries=5000000", &options)
            .await
            .unwrap();
        assert_eq!(max_records(&store), 5_000_000);
    }

    #[tokio::test]
    async fn an_invalid_memory_url_is_an_invalid_url() {
        let cases = [
            ("memory://?max_entries=0", "above 0"),
            ("memory://?max_entries=lots", "above 0, not \"lots\""),
            ("memory://?max_entries=", "above 0"),
            ("memory://?size=3", "unknown parameter \"size=3\""),
            ("memory://localhost", "no host or path"),
        ];
        checks::invalid_urls("memory", &cases, |url| async move {
            MemoryStore::open(&url, &StoreOptions::default()).await
        })
        .await;
    }

    #[tokio::test]
    async fn a_memory_store_never_expires_natively() {
        let store = MemoryStore::open("memory://", &StoreOptions::default())
            .await
            .unwrap();
        assert!(!store.expires_natively());
        // The kind says so before any store is open, and the store agrees.
        assert_eq!(store.expires_natively(), MemoryStore::EXPIRES_NATIVELY);
        assert_eq!(MemoryStore::descriptors(&StoreOptions::default()), 0);
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/idem?sslmode=disable"),
            "postgres://app:***@db:5432/idem?sslmode=disable"
        );
        assert_eq!(
            redact_url("redis://:pw@127.0.0.1"),
            "redis://:***@127.0.0.1"
        );
        assert_eq!(redact_url("redis://127.0.0.1"), "redis://127.0.0.1");
        let e = OpenError::unreachable("postgres", "postgres://a:b@h/d", "refused");
        assert!(!e.to_string().contains(":b@"), "{e}");
        assert!(e.may_pass());
        assert_eq!(e.kind(), Some("postgres"));
    }

    #[test]
    fn parameters_a_store_does_not_know_are_refused() {
        let known = &["sslmode", "options[…]"];
        for url in [
            "postgres://h/d",
            "postgres://h/d?sslmode=require",
            "postgres://h/d?options[statement_timeout]=5s#frag",
        ] {
            assert_eq!(refuse_unknown_parameters(url, known), Ok(()), "{url}");
        }
        let e = refuse_unknown_parameters("postgres://h/d?ssl_mode=require", known).unwrap_err();
        assert!(e.contains("unknown parameter \"ssl_mode\""), "{e}");
    }
}
