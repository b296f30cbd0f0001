//! How Redis failures become [`StoreError`]s.
//!
//! Everything that means "no trustworthy answer came back" (a refused or dropped
//! connection, a timeout, a server that is loading, read-only or out of memory) is
//! [`StoreError::Unavailable`], which the middleware turns into a fail-closed 503. Only a
//! key under the store's prefix that is not a record is [`StoreError::Corrupt`] (also a
//! 503): a value that does not decode, or a key of another type (`WRONGTYPE`), such as a
//! hash written by an idem-redis from before records became strings.

use idem_core::StoreError;
use redis::RedisError;

/// Maps a client or server error.
pub(crate) fn from_redis(e: RedisError) -> StoreError {
    if e.code() == Some("WRONGTYPE") {
        return StoreError::Corrupt(format!(
            "a key under the store's prefix is not a string, so not a record of this \
             store (a hash is a record of the older format, which this version does not \
             read; see the crate docs): {e}"
        ));
    }
    StoreError::unavailable(e)
}

/// A part of a stored record that could not be decoded.
pub(crate) fn corrupt(field: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("record field `{field}`: {why}"))
}
