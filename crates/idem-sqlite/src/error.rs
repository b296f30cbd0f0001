//! How SQLite's failures become idem's errors: [`SetupError`] while the store is set up
//! (its builder, its migration), [`StoreError`] once it serves.
//!
//! A SQLite store has no server that could be away or refuse it: a failure to open or
//! migrate its file is [`SetupError::Failed`], and a URL or setting that cannot work is
//! [`SetupError::Invalid`].

use idem_core::{SetupError, StoreError};

/// The store's kind, in errors and as [`OpenStore::KIND`](idem_core::OpenStore::KIND).
pub(crate) const KIND: &str = "sqlite";

/// Maps a driver error met while setting the store up: a connection setting sqlx
/// refused is a setting that cannot work; anything else, a store that could not be set
/// up.
pub(crate) fn setup_error(e: sqlx::Error) -> SetupError {
    match e {
        sqlx::Error::Configuration(_) => SetupError::invalid(KIND, e.to_string()),
        other => SetupError::failed(KIND, other),
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
