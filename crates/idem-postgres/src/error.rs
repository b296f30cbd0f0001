//! How PostgreSQL's failures become idem's errors: [`SetupError`] while the store is
//! set up (built, connected, migrated), [`StoreError`] once it serves.

use idem_core::open::tls::handshake_failure;
use idem_core::{SetupError, StoreError};
use sqlx::PgPool;

use crate::tls;

/// The store's kind, in errors and as [`OpenStore::KIND`](idem_core::OpenStore::KIND).
pub(crate) const KIND: &str = "postgres";

/// Maps a sqlx error met while setting the store up on `pool`: options the driver
/// refused are settings that cannot work; an error the server answered with, or a TLS
/// handshake that failed (a server that offers no TLS, a certificate that does not
/// verify under the URL's `sslmode`), a refusal, which may be put right on the server;
/// a row that does not decode, a failure; anything else (I/O, a timeout, a closed
/// pool), a server that could not be reached.
pub(crate) fn setup_error(pool: &PgPool, e: sqlx::Error) -> SetupError {
    let tls_refused = |failure: &(dyn std::error::Error + 'static)| {
        let mode = tls::mode_name(pool.connect_options().get_ssl_mode());
        let why =
            handshake_failure(failure).map_or_else(|| failure.to_string(), ToString::to_string);
        SetupError::refused(KIND, format!("TLS (sslmode={mode}) failed: {why}"))
    };
    match e {
        sqlx::Error::Configuration(_) => SetupError::invalid(KIND, e.to_string()),
        sqlx::Error::Database(_) => SetupError::refused(KIND, ServerError(e)),
        sqlx::Error::Tls(e) => tls_refused(&*e),
        sqlx::Error::Io(e) if handshake_failure(&e).is_some() => tls_refused(&e),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => SetupError::failed(KIND, e),
        other => SetupError::unreachable(KIND, other),
    }
}

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
