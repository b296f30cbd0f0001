//! What of a request the journal stores: its headers, once it is known that they carry
//! no credential and that the request can be sent, and whether a stored one is the same.

use std::str::FromStr;

use bytes::Bytes;
use http::HeaderMap;
use http::header::{AUTHORIZATION, COOKIE, HeaderName, HeaderValue, PROXY_AUTHORIZATION};
use idem_core::codec::{decode_headers, encode_headers};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::{Error, Operation, Result};

/// The operation's headers as the journal stores them, once it is known that they may
/// be stored and that the operation can be sent: one that cannot would only be
/// recorded as failed, and under a business id it would take the id.
pub(super) fn journalable(op: &Operation) -> Result<Vec<u8>> {
    op.checked_url()?;
    refuse_credentials(op.header_map())?;
    Ok(encode_header_map(op.header_map()))
}

pub(super) fn encode_header_map(headers: &HeaderMap) -> Vec<u8> {
    encode_headers(
        &headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), Bytes::copy_from_slice(v.as_bytes())))
            .collect::<Vec<_>>(),
    )
}

pub(super) fn decode_header_map(stored: &[u8]) -> Result<HeaderMap> {
    let headers = decode_headers(stored).map_err(|e| corrupt(e.to_string()))?;
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let name = HeaderName::from_str(&name).map_err(|e| corrupt(e.to_string()))?;
        let value = HeaderValue::from_maybe_shared(value).map_err(|e| corrupt(e.to_string()))?;
        map.append(name, value);
    }
    Ok(map)
}

/// Whether the stored request in `row` is `op`'s (`headers` encoded).
pub(super) fn same_request(row: &SqliteRow, op: &Operation, headers: &[u8]) -> Result<bool> {
    Ok(row.try_get::<String, _>("method")? == op.method().as_str()
        && row.try_get::<String, _>("url")? == op.url()
        && row.try_get::<Vec<u8>, _>("headers")?[..] == headers[..]
        && row.try_get::<Vec<u8>, _>("body")?[..] == op.body_bytes()[..])
}

pub(super) fn refuse_credentials(headers: &HeaderMap) -> Result<()> {
    for (name, value) in headers {
        if name == AUTHORIZATION
            || name == PROXY_AUTHORIZATION
            || name == COOKIE
            || value.is_sensitive()
        {
            return Err(Error::CredentialInJournal {
                header: name.as_str().to_owned(),
            });
        }
    }
    Ok(())
}

/// A stored row that cannot be read back: the journal's decode error.
pub(super) fn corrupt(reason: String) -> Error {
    Error::Journal(sqlx::Error::Decode(reason.into()))
}
