//! How Redis failures become [`StoreError`]s.
//!
//! Everything that means "no trustworthy answer came back" (a refused or dropped
//! connection, a timeout, a server that is loading, read-only or out of memory) is
//! [`StoreError::Unavailable`], which the middleware turns into a fail-closed 503. Only a
//! key under the store's prefix that is not a record is [`StoreError::Corrupt`].

use idem_core::StoreError;
use redis::RedisError;

/// Maps a client or server error.
pub(crate) fn from_redis(e: RedisError) -> StoreError {
    if e.code() == Some("WRONGTYPE") {
        return StoreError::Corrupt(format!(
            "a key under the store's prefix is not a record: {e}"
        ));
    }
    StoreError::unavailable(e)
}

/// A record field that could not be decoded.
pub(crate) fn corrupt(field: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("record field `{field}`: {why}"))
}
