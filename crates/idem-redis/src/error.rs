//! How Redis failures become idem's errors: [`SetupError`] while the store connects and
//! marks its namespace, [`StoreError`] once it serves.
//!
//! While serving, everything that means "no trustworthy answer came back" (a refused or
//! dropped connection, a timeout, a server that is loading, read-only or out of memory)
//! is [`StoreError::Unavailable`], which the middleware turns into a fail-closed 503.
//! Only a key under the store's prefix that is not a record is [`StoreError::Corrupt`]
//! (also a 503): a value that does not decode, or a key of another type (`WRONGTYPE`),
//! such as a hash written by an idem-redis from before records became strings.

use idem_core::open::tls::handshake_failure;
use idem_core::{SetupError, StoreError};
use redis::{ErrorKind, RedisError};

/// The store's kind, in errors and as [`OpenStore::KIND`](idem_core::OpenStore::KIND).
pub(crate) const KIND: &str = "redis";

/// Maps a client or server error met while setting the store up: a client setting the
/// driver refused is a setting that cannot work; a TLS handshake that failed (a server
/// that speaks no TLS, a certificate that does not verify) was a server reached, which
/// refused; no connection, or one that broke or timed out, a server not reached; any
/// other answer, a refusal.
pub(crate) fn setup_error(e: RedisError) -> SetupError {
    if let Some(tls) = handshake_failure(&e) {
        return SetupError::refused(KIND, format!("TLS failed: {tls}"));
    }
    if e.kind() == ErrorKind::InvalidClientConfig {
        return SetupError::invalid(KIND, e.to_string());
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        SetupError::unreachable(KIND, e)
    } else {
        SetupError::refused(KIND, e)
    }
}

/// [`setup_error`] for the first connection, over TLS when `tls`: a plaintext Redis
/// reads the TLS hello as the start of a command and waits for the rest, so the
/// handshake never gets an answer.
pub(crate) fn connect_error(e: RedisError, tls: bool) -> SetupError {
    if tls && e.is_timeout() && handshake_failure(&e).is_none() {
        let why = format!(
            "{e}: the TLS handshake got no answer (a server that speaks no TLS on this \
             port never answers one)"
        );
        return SetupError::unreachable(KIND, why);
    }
    setup_error(e)
}

/// Maps a client or server error met while serving.
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
