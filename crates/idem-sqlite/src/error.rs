//! What can go wrong opening a [`SqliteStore`](crate::SqliteStore).
//!
//! Once open, the store speaks [`idem_core::StoreError`] like every backend; this
//! error covers construction and migration, where the caller is an operator who wants
//! to know which of its settings is wrong.

use idem_core::StoreError;

/// An error opening or migrating a [`SqliteStore`](crate::SqliteStore).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The table name is not one the [`Namespace`](idem_core::Namespace) rule admits.
    #[error("invalid table name: {0}")]
    InvalidTableName(#[source] idem_core::NamespaceError),
    /// The table was migrated by a newer idem-sqlite than this one.
    #[error(
        "table {table} has schema version {found}, newer than version {supported} that this \
         idem-sqlite knows; upgrade idem-sqlite"
    )]
    SchemaTooNew {
        /// The table.
        table: String,
        /// The version recorded in the database.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The store was opened without migrating ([`migrate(false)`](crate::SqliteStoreBuilder::migrate))
    /// and the database holds no table of this store's.
    #[error(
        "{path}: no idem table {table} (open it once with migration on, or run `idem migrate`)"
    )]
    NoSchema {
        /// The database file.
        path: String,
        /// The table.
        table: String,
    },
    /// The store was opened without migrating and the table has an older schema than
    /// this build needs.
    #[error(
        "table {table} has schema version {found}; this build needs {supported}: run \
         `idem migrate` (or open the store once with migration on)"
    )]
    SchemaOutdated {
        /// The table.
        table: String,
        /// The version recorded in the database.
        found: i64,
        /// The version this build needs.
        supported: i64,
    },
    /// The URL's `page_size` is not one SQLite accepts.
    #[error(
        "invalid page_size {0:?}: use a power of two from 512 to 65536 (bytes); it applies \
         only when the database file is created"
    )]
    InvalidPageSize(String),
    /// The database file is not there and cannot be made: its directory is missing.
    #[error("the directory {dir} of the database file does not exist")]
    NoDirectory {
        /// The directory, as the URL names it (`.` for a bare file name).
        dir: String,
    },
    /// The database refused or failed an operation.
    #[error("SQLite: {0}")]
    Database(#[from] sqlx::Error),
    /// The store's writer could not start or open its connection.
    #[error("SQLite: opening the store's writer connection: {0}")]
    Writer(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for StoreError {
    fn from(e: Error) -> StoreError {
        StoreError::unavailable(e)
    }
}

/// Maps a driver error met while serving requests. Decoding failures mean a row holds
/// something this store never writes; everything else means the database cannot serve
/// now, which middleware answers with a fail-closed 503.
pub(crate) fn store_error(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            StoreError::Corrupt(e.to_string())
        }
        other => StoreError::unavailable(other),
    }
}
