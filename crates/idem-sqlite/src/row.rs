//! [`StoredRow`]: a record's row as either connection type reads it, and the record
//! it holds. The pool (sqlx) reads rows for `get`, the writer (rusqlite) for `reserve`;
//! both decode here.

use bytes::Bytes;
use idem_core::codec::decode_response_headers;
use idem_core::{
    Ambiguity, FencingToken, Fingerprint, Record, RecordState, Scope, StoreError, StoredResponse,
    Timestamp,
};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("idem-sqlite record: {what}"))
}

/// A row's columns in [`RECORD_COLUMNS`](crate::schema::RECORD_COLUMNS) order, as read
/// by either connection type, before they are checked.
pub(crate) struct StoredRow {
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) created_at: i64,
    pub(crate) expires_at: i64,
    pub(crate) attempt: i64,
    pub(crate) token: i64,
    pub(crate) state: String,
    pub(crate) lease_until: Option<i64>,
    pub(crate) status: Option<i64>,
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) body: Option<Vec<u8>>,
    pub(crate) completed_at: Option<i64>,
    pub(crate) tombstone_until: Option<i64>,
    pub(crate) ambiguity: Option<String>,
}

impl StoredRow {
    /// The row as the writer's connection reads it.
    pub(crate) fn from_rusqlite(row: &rusqlite::Row<'_>) -> rusqlite::Result<StoredRow> {
        Ok(StoredRow {
            fingerprint: row.get(0)?,
            created_at: row.get(1)?,
            expires_at: row.get(2)?,
            attempt: row.get(3)?,
            token: row.get(4)?,
            state: row.get(5)?,
            lease_until: row.get(6)?,
            status: row.get(7)?,
            headers: row.get(8)?,
            body: row.get(9)?,
            completed_at: row.get(10)?,
            tombstone_until: row.get(11)?,
            ambiguity: row.get(12)?,
        })
    }

    /// The row as a pooled connection reads it.
    pub(crate) fn from_sqlx(row: &SqliteRow) -> std::result::Result<StoredRow, sqlx::Error> {
        StoredRow::from_sqlx_at(row, 0)
    }

    /// The row as a pooled connection reads it, its record's columns starting at
    /// column `at` (a listing selects the scope's columns first).
    pub(crate) fn from_sqlx_at(
        row: &SqliteRow,
        at: usize,
    ) -> std::result::Result<StoredRow, sqlx::Error> {
        Ok(StoredRow {
            fingerprint: row.try_get(at)?,
            created_at: row.try_get(at + 1)?,
            expires_at: row.try_get(at + 2)?,
            attempt: row.try_get(at + 3)?,
            token: row.try_get(at + 4)?,
            state: row.try_get(at + 5)?,
            lease_until: row.try_get(at + 6)?,
            status: row.try_get(at + 7)?,
            headers: row.try_get(at + 8)?,
            body: row.try_get(at + 9)?,
            completed_at: row.try_get(at + 10)?,
            tombstone_until: row.try_get(at + 11)?,
            ambiguity: row.try_get(at + 12)?,
        })
    }

    /// The record, or `Corrupt` if the row holds what this store never writes.
    pub(crate) fn into_record(self, scope: &Scope) -> idem_core::Result<Record> {
        let fingerprint = Fingerprint::from_slice(&self.fingerprint)
            .ok_or_else(|| corrupt("fingerprint length"))?;
        let in_progress_ambiguity = match self.state.as_str() {
            "in_progress" => self.ambiguity.as_deref().and_then(Ambiguity::parse),
            _ => None,
        };
        let state = match self.state.as_str() {
            "in_progress" => RecordState::InProgress {
                lease_until: Timestamp::from_millis(
                    self.lease_until
                        .ok_or_else(|| corrupt("in progress without a lease"))?,
                ),
            },
            "completed" | "tombstone" => {
                let status = self
                    .status
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or_else(|| corrupt("status"))?;
                let completed_at = Timestamp::from_millis(
                    self.completed_at
                        .ok_or_else(|| corrupt("completed without a time"))?,
                );
                if self.state == "tombstone" {
                    RecordState::Tombstone {
                        completed_at,
                        status,
                    }
                } else {
                    let (headers, meta) = decode_response_headers(
                        &self.headers.unwrap_or_default(),
                        self.ambiguity.as_deref(),
                    )?;
                    RecordState::Completed {
                        response: StoredResponse {
                            status,
                            headers,
                            body: Bytes::from(self.body.unwrap_or_default()),
                            meta,
                        },
                        completed_at,
                    }
                }
            }
            other => return Err(corrupt(&format!("state {other:?}"))),
        };
        Ok(Record {
            scope: scope.clone(),
            fingerprint,
            created_at: Timestamp::from_millis(self.created_at),
            expires_at: Timestamp::from_millis(self.expires_at),
            attempt: u32::try_from(self.attempt).map_err(|_| corrupt("attempt"))?,
            token: FencingToken::from_i64(self.token),
            state,
            tombstone_until: self.tombstone_until.map(Timestamp::from_millis),
            in_progress_ambiguity,
        })
    }
}
