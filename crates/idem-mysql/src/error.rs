//! How MySQL's failures become idem's errors: [`SetupError`] while the store is set up
//! (built, connected, migrated), [`StoreError`] once it serves.

use idem_core::open::tls::handshake_failure;
use idem_core::{SetupError, StoreError};
use sqlx::mysql::{MySqlDatabaseError, MySqlSslMode};

use crate::tls::mode_name;

/// The store's kind, in errors.
pub(crate) const KIND: &str = "mysql";

/// A duplicate entry for a primary or unique key.
pub(crate) const DUPLICATE_KEY: u16 = 1062;
/// A lock wait that ran past `innodb_lock_wait_timeout`: the statement was rolled back.
const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// A deadlock: InnoDB rolled this transaction back so that another could go on.
const DEADLOCK: u16 = 1213;

/// MySQL's error number, for an error the server answered with.
pub(crate) fn number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(MySqlDatabaseError::number)
}

/// Whether the server rolled the statement back for a lock it could not get (a
/// deadlock, 1213, or a lock wait timeout, 1205): nothing of it was written, and the
/// same statement may succeed when tried again.
pub(crate) fn lost_a_lock(e: &sqlx::Error) -> bool {
    matches!(number(e), Some(DEADLOCK | LOCK_WAIT_TIMEOUT))
}

/// Maps a sqlx error met while setting the store up: options the driver refused are
/// settings that cannot work; an error the server answered with, a refusal; a row that
/// does not decode, a failure; anything else (I/O, a timeout), a server that could not
/// be reached.
pub(crate) fn setup_error(e: sqlx::Error) -> SetupError {
    connect_error(e, None)
}

/// [`setup_error`] of a connection made with the TLS mode `mode`: a TLS handshake that
/// failed (a server that offers no TLS, a certificate that does not verify under the
/// URL's `ssl-mode`) is a refusal, which may be put right on the server, and says what
/// failed; not a server that is not there.
pub(crate) fn connect_error(e: sqlx::Error, mode: Option<MySqlSslMode>) -> SetupError {
    let tls_refused = |failure: &(dyn std::error::Error + 'static)| {
        let why =
            handshake_failure(failure).map_or_else(|| failure.to_string(), ToString::to_string);
        let mode = mode.map_or(String::new(), |m| format!(" (ssl-mode={})", mode_name(m)));
        SetupError::refused(KIND, format!("TLS{mode} failed: {why}"))
    };
    match e {
        sqlx::Error::Tls(e) => tls_refused(&*e),
        sqlx::Error::Io(e) if handshake_failure(&e).is_some() => tls_refused(&e),
        sqlx::Error::Configuration(_) => SetupError::invalid(KIND, e.to_string()),
        sqlx::Error::Database(_) => SetupError::refused(KIND, ServerError(e)),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => SetupError::failed(KIND, e),
        other => SetupError::unreachable(KIND, other),
    }
}

/// Maps a sqlx error to the store's error: a row that does not decode is
/// [`StoreError::Corrupt`]; everything else (I/O, pool timeouts, server errors, a lock
/// lost more often than the store retries) is [`StoreError::Unavailable`], which callers
/// answer fail-closed (SPEC S10).
pub(crate) fn store_error(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::unavailable(ServerError(other)),
    }
}

/// A sqlx error as operators read it: an error the server answered with shows MySQL's
/// message and its error number; every other error reads as sqlx writes it.
#[derive(Debug)]
pub(crate) struct ServerError(pub(crate) sqlx::Error);

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sqlx::Error::Database(db) = &self.0 else {
            return self.0.fmt(f);
        };
        match db.try_downcast_ref::<MySqlDatabaseError>() {
            Some(my) => write!(f, "{} (error {})", my.message(), my.number()),
            None => f.write_str(db.message()),
        }
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            sqlx::Error::Database(_) => None,
            other => other.source(),
        }
    }
}

/// A fenced write's outcome from the rows it matched (the driver asks for found rows,
/// not changed ones): one, or the lease is not the record's current attempt
/// ([`StoreError::Fenced`]).
pub(crate) fn fenced_unless_one(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    }
}
