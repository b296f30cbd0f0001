//! Errors: what `PgStore`'s constructors return, and how sqlx errors become
//! [`StoreError`]s.

use idem_core::StoreError;

/// What building a [`PgStore`](crate::PgStore) can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The table name is not one the store can use ([`schema::table_name`](crate::schema::table_name)).
    #[error("invalid table name: {reason}")]
    InvalidTableName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        #[source]
        reason: idem_core::NamespaceError,
    },
    /// The connection URL or options were rejected before any connection was tried.
    #[error("invalid PostgreSQL connection options: {0}")]
    Config(#[source] sqlx::Error),
    /// The URL's TLS settings cannot work: an unknown `sslmode`, a CA, certificate or
    /// key file that is missing or is not what its parameter says. The message names
    /// the parameter.
    #[error("invalid PostgreSQL TLS settings: {0}")]
    Tls(String),
    /// The server could not be reached, or the migration failed on it.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Maps a sqlx error to the store's error: a row that does not decode is
/// [`StoreError::Corrupt`]; everything else (I/O, pool timeouts, a closed pool, protocol
/// and server errors) is [`StoreError::Unavailable`], which callers answer fail-closed
/// with a 503 (SPEC S10). A server's error reads as [`ServerError`] says.
pub(crate) fn store_error(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(ServerError(other)),
    }
}

/// A sqlx error as operators read it. An error the server answered with shows
/// PostgreSQL's message, its SQLSTATE, and its detail and hint when it sends them, and
/// not the position in the server's own C source that sqlx's text ends with
/// (`role "x" does not exist at line 768`): that line is the server's, and next to a
/// store URL it reads as a line of the user's configuration. Every other error reads
/// as sqlx writes it, and keeps its source chain (where a TLS failure is found).
#[derive(Debug)]
pub(crate) struct ServerError(pub(crate) sqlx::Error);

impl ServerError {
    /// The sqlx error.
    pub(crate) fn sqlx(&self) -> &sqlx::Error {
        &self.0
    }
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sqlx::Error::Database(db) = &self.0 else {
            return self.0.fmt(f);
        };
        let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() else {
            return f.write_str(db.message());
        };
        write!(f, "{} (SQLSTATE {})", pg.message(), pg.code())?;
        if let Some(detail) = pg.detail() {
            write!(f, "; {detail}")?;
        }
        if let Some(hint) = pg.hint() {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            // The message says all the server did; its sqlx form would add the line.
            sqlx::Error::Database(_) => None,
            other => other.source(),
        }
    }
}

/// A fenced write's outcome from the rows it changed: one, or the lease is not the
/// record's current attempt ([`StoreError::Fenced`]).
pub(crate) fn fenced_unless_one(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    }
}
