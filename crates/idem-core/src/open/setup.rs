//! [`SetupError`]: what every store's builder and constructors return, and how it
//! becomes the [`OpenError`] of a store opened from its URL.
//!
//! A store is set up before it serves: its settings are checked, its server reached,
//! its schema made or checked. Each store meets its own failures there (a SQLite file
//! whose directory is missing, a PostgreSQL role refused, a Redis marker written by a
//! newer build) and sorts them into the same few kinds, so that a caller acts on the
//! kind (fix the settings, try again later, migrate) whatever the store, and the store's
//! detail travels as data and text. Opening from a URL ([`OpenStore::open`]) adds the
//! URL ([`OpenError::setup`]); once set up, a store speaks
//! [`StoreError`](crate::StoreError).
//!
//! [`OpenStore::open`]: super::OpenStore::open

use super::{BoxError, OpenError, StoreOptions};
use crate::{DEFAULT_NAMESPACE, NamespaceError};

/// Why a store could not be set up: built from its settings, connected, or its schema
/// made or checked. Every store's builder, constructors and schema functions return it;
/// `kind` is the store's [`OpenStore::KIND`](super::OpenStore::KIND) (`sqlite`,
/// `postgres`, `redis`).
///
/// ```
/// use idem_core::SetupError;
///
/// let e = SetupError::unreachable("postgres", "connection refused");
/// assert!(e.may_pass());
/// assert_eq!(e.to_string(), "cannot reach the postgres store: connection refused");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A setting cannot work as written, found before anything was tried: a URL or a
    /// parameter that does not parse, a TLS file that is missing or not what its
    /// parameter says, a database file whose directory is missing.
    #[error("invalid {kind} store settings: {reason}")]
    Invalid {
        /// Which store.
        kind: &'static str,
        /// What is wrong, naming the setting.
        reason: String,
    },
    /// The name the store keeps its records under (a table) is not one it can use.
    #[error("invalid name for the {kind} store: {source}")]
    Namespace {
        /// Which store.
        kind: &'static str,
        /// The name as given.
        name: String,
        /// Why it is refused.
        #[source]
        source: NamespaceError,
    },
    /// The store's server could not be reached: nothing listens, the connection broke
    /// or timed out.
    #[error("cannot reach the {kind} store: {source}")]
    Unreachable {
        /// Which store.
        kind: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The server was reached and refused the store: its credentials, its database, its
    /// TLS handshake, or the statements that prepare it (the migration).
    #[error("the {kind} store refused the connection or its setup: {source}")]
    Refused {
        /// Which store.
        kind: &'static str,
        /// The driver's or server's error.
        #[source]
        source: BoxError,
    },
    /// The store was set up without migrating and nothing of its schema is there: no
    /// file, no table, no marker.
    #[error(
        "no idem schema in the {kind} store: {missing} (open it once with migration on{})",
        or_migrate(.migrate)
    )]
    NoSchema {
        /// Which store.
        kind: &'static str,
        /// What the store looked for and did not find: `no file idem.db`,
        /// `this database has no table idem_records`, `no key idem:meta:schema`.
        missing: String,
        /// Whether `idem migrate` makes it (a SQL store's table), besides a store set
        /// up with migration on.
        migrate: bool,
    },
    /// The schema was made by another build: an older one, which migrating brings up
    /// to date, or a newer one, which this build must not use.
    #[error("{at} has schema version {found}{}", version_advice(.found, .supported))]
    SchemaVersion {
        /// Which store.
        kind: &'static str,
        /// Where the version was read: `table idem_records`, `key idem:meta:schema`.
        at: String,
        /// The version found there.
        found: i64,
        /// The version this build needs.
        supported: i64,
    },
    /// The store could not be set up for another reason: a file that cannot be made,
    /// a thread that did not start.
    #[error("cannot set up the {kind} store: {source}")]
    Failed {
        /// Which store.
        kind: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
}

/// The end of [`SetupError::NoSchema`]'s advice, for a schema `idem migrate` makes.
fn or_migrate(migrate: &bool) -> &'static str {
    if *migrate {
        ", or run `idem migrate`"
    } else {
        ""
    }
}

/// The end of [`SetupError::SchemaVersion`]'s message: what to do about a schema of
/// version `found` in a build of version `supported`.
fn version_advice(found: &i64, supported: &i64) -> String {
    if found > supported {
        format!(", newer than version {supported} that this build knows: use a build that knows it")
    } else {
        format!(
            "; this build needs {supported}: run `idem migrate` (or open the store once with \
             migration on)"
        )
    }
}

impl SetupError {
    /// A setting of the store `kind` that cannot work as written.
    pub fn invalid(kind: &'static str, reason: impl Into<String>) -> SetupError {
        SetupError::Invalid {
            kind,
            reason: reason.into(),
        }
    }

    /// A server of the store `kind` that could not be reached.
    pub fn unreachable(kind: &'static str, source: impl Into<BoxError>) -> SetupError {
        SetupError::Unreachable {
            kind,
            source: source.into(),
        }
    }

    /// A server of the store `kind` that refused it.
    pub fn refused(kind: &'static str, source: impl Into<BoxError>) -> SetupError {
        SetupError::Refused {
            kind,
            source: source.into(),
        }
    }

    /// A store `kind` that could not be set up for another reason.
    pub fn failed(kind: &'static str, source: impl Into<BoxError>) -> SetupError {
        SetupError::Failed {
            kind,
            source: source.into(),
        }
    }

    /// Which store the error is about.
    pub fn kind(&self) -> &'static str {
        match self {
            SetupError::Invalid { kind, .. }
            | SetupError::Namespace { kind, .. }
            | SetupError::Unreachable { kind, .. }
            | SetupError::Refused { kind, .. }
            | SetupError::NoSchema { kind, .. }
            | SetupError::SchemaVersion { kind, .. }
            | SetupError::Failed { kind, .. } => kind,
        }
    }

    /// Whether setting the store up again later may succeed with nothing changed: a
    /// server that is down or refuses now may be up, or let in, in a moment. Every
    /// other error stays until the settings or the store change.
    pub fn may_pass(&self) -> bool {
        matches!(
            self,
            SetupError::Unreachable { .. } | SetupError::Refused { .. }
        )
    }

    /// Whether the settings are wrong as written: they cannot work, or the name does
    /// not fit.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            SetupError::Invalid { .. } | SetupError::Namespace { .. }
        )
    }
}

/// A store that could not be set up, as a failing operation would report it: for
/// callers that start a store where they use one, and speak
/// [`StoreError`](crate::StoreError) throughout.
impl From<SetupError> for crate::StoreError {
    fn from(e: SetupError) -> crate::StoreError {
        crate::StoreError::unavailable(e)
    }
}

impl OpenError {
    /// The store at `url`, opened with `options`, could not be set up: `e` with the URL
    /// (its password masked), of the same kind. A missing schema reads as the namespace
    /// of `options` never opened ([`OpenError::never_opened`]); a schema of another
    /// version is [`OpenError::Failed`], its message naming the migration to run, if
    /// one would do.
    pub fn setup(url: &str, options: &StoreOptions, e: SetupError) -> OpenError {
        match e {
            SetupError::Invalid { kind, reason } => OpenError::invalid_url(kind, url, reason),
            SetupError::Namespace { kind, source, .. } => OpenError::Namespace { kind, source },
            SetupError::Unreachable { kind, source } => OpenError::unreachable(kind, url, source),
            SetupError::Refused { kind, source } => OpenError::refused(kind, url, source),
            SetupError::NoSchema {
                kind,
                missing,
                migrate,
            } => {
                let namespace = options
                    .namespace
                    .as_ref()
                    .map_or(DEFAULT_NAMESPACE, |n| n.as_str());
                OpenError::never_opened(kind, url, namespace, missing, migrate)
            }
            SetupError::Failed { kind, source } => OpenError::failed(kind, url, source),
            version @ SetupError::SchemaVersion { .. } => {
                OpenError::failed(version.kind(), url, version)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Namespace;

    const URL: &str = "postgres://app:secret@db/idem";

    fn version(found: i64) -> SetupError {
        SetupError::SchemaVersion {
            kind: "postgres",
            at: "table idem_records".into(),
            found,
            supported: 6,
        }
    }

    /// Every kind of setup error but a missing schema, whose words change (below): a
    /// store's settings, its server, its schema's version.
    fn each() -> Vec<SetupError> {
        vec![
            SetupError::invalid("postgres", "sslmode=verify: not a mode"),
            SetupError::Namespace {
                kind: "postgres",
                name: "x-y".into(),
                source: Namespace::new("x-y").unwrap_err(),
            },
            SetupError::unreachable("postgres", "connection refused"),
            SetupError::refused("postgres", "password authentication failed"),
            version(3),
            version(9),
            SetupError::failed("postgres", "no such thread"),
        ]
    }

    #[test]
    fn an_open_error_is_of_the_setup_errors_kind_with_the_url_masked() {
        for e in each() {
            let text = e.to_string();
            let (may_pass, configuration) = (e.may_pass(), e.is_configuration());
            let opened = OpenError::setup(URL, &StoreOptions::default(), e);
            assert_eq!(opened.kind(), Some("postgres"), "{opened:?}");
            assert_eq!(opened.may_pass(), may_pass, "{opened:?}");
            assert_eq!(opened.is_configuration(), configuration, "{opened:?}");
            let opened_text = opened.to_string();
            assert!(!opened_text.contains("secret"), "{opened_text}");
            // The store's own words come through; only the kind's framing differs.
            let detail = text.split_once(": ").map_or(text.as_str(), |(_, d)| d);
            assert!(opened_text.contains(detail), "{opened_text} lacks {detail}");
        }
    }

    #[test]
    fn a_missing_schema_is_a_namespace_never_opened() {
        let e = SetupError::NoSchema {
            kind: "sqlite",
            missing: "no file idem.db".into(),
            migrate: true,
        };
        assert!(
            e.to_string().ends_with(
                "no file idem.db (open it once with migration on, or run `idem migrate`)"
            ),
            "{e}"
        );
        assert!(!e.may_pass() && !e.is_configuration(), "{e:?}");
        let options = crate::open::checks::namespaced("payments");
        let opened = OpenError::setup("sqlite://idem.db", &options, e);
        assert!(
            matches!(opened, OpenError::NoSchema { kind: "sqlite", .. }),
            "{opened:?}"
        );
        assert!(
            !opened.may_pass() && !opened.is_configuration(),
            "{opened:?}"
        );
        assert!(
            opened
                .to_string()
                .contains("namespace payments was never opened by idem (no file idem.db)"),
            "{opened}"
        );
    }

    #[test]
    fn a_schema_version_says_what_to_do_about_it() {
        let older = version(3).to_string();
        assert_eq!(
            older,
            "table idem_records has schema version 3; this build needs 6: run `idem migrate` \
             (or open the store once with migration on)"
        );
        let newer = version(9).to_string();
        assert_eq!(
            newer,
            "table idem_records has schema version 9, newer than version 6 that this build \
             knows: use a build that knows it"
        );
        let opened = OpenError::setup(URL, &StoreOptions::default(), version(3));
        assert!(matches!(opened, OpenError::Failed { .. }), "{opened:?}");
        assert!(opened.to_string().ends_with(&older), "{opened}");
    }

    #[test]
    fn a_setup_error_is_an_unavailable_store_to_an_operation() {
        let e: crate::StoreError = SetupError::unreachable("redis", "connection refused").into();
        assert!(matches!(e, crate::StoreError::Unavailable(_)), "{e:?}");
        assert!(
            e.to_string().contains("cannot reach the redis store"),
            "{e}"
        );
    }
}
