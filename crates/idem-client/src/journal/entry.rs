//! [`Entry`]: a journaled operation as stored, and reading one (and its recorded
//! answer) from a row.

use std::str::FromStr;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use idem_core::{Key, Timestamp};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::request::{corrupt, decode_header_map};
use crate::{BusinessId, Outcome, Result};

/// Where a journaled operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Not yet answered: resume it.
    Pending,
    /// Answered (success or not, replayed or not); kept until purged.
    Completed,
    /// Refused in a way a resume would not change (key reused, invalid request).
    Failed,
}

impl EntryState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            EntryState::Pending => "pending",
            EntryState::Completed => "completed",
            EntryState::Failed => "failed",
        }
    }

    pub(super) fn parse(s: &str) -> Result<EntryState> {
        match s {
            "pending" => Ok(EntryState::Pending),
            "completed" => Ok(EntryState::Completed),
            "failed" => Ok(EntryState::Failed),
            other => Err(corrupt(format!("unknown journal state {other:?}"))),
        }
    }
}

/// One journaled operation as stored (without its body and headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The journal's id for the operation.
    pub id: i64,
    /// The operation's key.
    pub key: Key,
    /// The business id it was persisted under
    /// ([`persist_unique`](crate::Journal::persist_unique)), if any.
    pub business_id: Option<BusinessId>,
    /// The method.
    pub method: Method,
    /// The URL.
    pub url: String,
    /// Pending, completed or failed.
    pub state: EntryState,
    /// Attempts made by every process that sent it, as far as they recorded.
    pub attempts: u32,
    /// The final status, once completed (or failed with an answer).
    pub status: Option<u16>,
    /// Whether the final answer was a replay, once completed.
    pub replayed: Option<bool>,
    /// The last error, for a failed entry or a pending one whose retries gave up.
    pub last_error: Option<String>,
    /// When it was persisted.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// The answer recorded in `row`, if one was.
pub(super) fn recorded_answer(row: &SqliteRow, entry: &Entry) -> Result<Option<Outcome>> {
    let Some(status) = entry.status else {
        return Ok(None);
    };
    let status = StatusCode::from_u16(status).map_err(|e| corrupt(e.to_string()))?;
    let headers = match row.try_get::<Option<Vec<u8>>, _>("response_headers")? {
        Some(stored) => decode_header_map(&stored)?,
        None => HeaderMap::new(),
    };
    let body = row
        .try_get::<Option<Vec<u8>>, _>("response_body")?
        .unwrap_or_default();
    Ok(Some(Outcome {
        key: entry.key.clone(),
        attempts: entry.attempts,
        status,
        headers,
        body: Bytes::from(body),
    }))
}

pub(super) fn entry(row: &SqliteRow) -> Result<Entry> {
    Ok(Entry {
        id: row.try_get("id")?,
        key: parse_key(row)?,
        business_id: row
            .try_get::<Option<Vec<u8>>, _>("business_id")?
            .map(|d| {
                <[u8; 32]>::try_from(d)
                    .map(BusinessId::from_digest)
                    .map_err(|d| corrupt(format!("a business id of {} bytes", d.len())))
            })
            .transpose()?,
        method: parse_method(row)?,
        url: row.try_get("url")?,
        state: EntryState::parse(&row.try_get::<String, _>("state")?)?,
        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(u32::MAX),
        status: row
            .try_get::<Option<i64>, _>("status")?
            .and_then(|s| u16::try_from(s).ok()),
        replayed: row.try_get("replayed")?,
        last_error: row.try_get("last_error")?,
        created_at: Timestamp::from_millis(row.try_get("created_at")?),
        updated_at: Timestamp::from_millis(row.try_get("updated_at")?),
    })
}

pub(super) fn parse_key(row: &SqliteRow) -> Result<Key> {
    Key::new(row.try_get::<String, _>("idempotency_key")?).map_err(|e| corrupt(e.to_string()))
}

pub(super) fn parse_method(row: &SqliteRow) -> Result<Method> {
    Method::from_str(&row.try_get::<String, _>("method")?).map_err(|e| corrupt(e.to_string()))
}
