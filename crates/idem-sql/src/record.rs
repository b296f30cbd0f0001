//! [`record_from_row`]: an idem record from the row a SQL store keeps it in, for every
//! database whose driver decodes the columns' types (feature `record`).

use idem_core::codec::decode_response_headers;
use idem_core::{
    Ambiguity, FencingToken, Fingerprint, Record, RecordState, Scope, StoreError, StoredResponse,
    Timestamp,
};
use sqlx::{ColumnIndex, Decode, Row, Type};

/// The record of `scope` from `row`, which holds the columns a SQL store keeps a record
/// in, by these names: `attempt` and `status` (32-bit integers), `token`, `created_at`,
/// `expires_at`, `lease_until`, `completed_at` and `tombstone_until` (64-bit integers,
/// times in milliseconds; `lease_until` read only in progress, `completed_at` and
/// `status` only once completed, `tombstone_until` nullable), `fingerprint`, `headers`
/// and `body` (byte strings), `state` (`in_progress`, `completed` or `tombstone`) and
/// `ambiguity` (nullable text).
///
/// `error` maps the driver's error (a column missing or of another type) as the store
/// maps it; a value no record can hold (a fingerprint of another length, an unknown
/// state, a negative attempt) is [`StoreError::Corrupt`].
pub fn record_from_row<R>(
    scope: &Scope,
    row: &R,
    error: impl Fn(sqlx::Error) -> StoreError,
) -> Result<Record, StoreError>
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let ms = |col: &str| -> Result<Timestamp, StoreError> {
        Ok(Timestamp::from_millis(
            row.try_get::<i64, _>(col).map_err(&error)?,
        ))
    };
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(&error)?;
    let fingerprint = Fingerprint::from_slice(&fingerprint)
        .ok_or_else(|| StoreError::Corrupt("fingerprint is not 32 bytes".into()))?;
    let state: String = row.try_get("state").map_err(&error)?;
    let ambiguity: Option<String> = row.try_get("ambiguity").map_err(&error)?;
    let in_progress_ambiguity = match state.as_str() {
        "in_progress" => ambiguity.as_deref().and_then(Ambiguity::parse),
        _ => None,
    };
    let state = match state.as_str() {
        "in_progress" => RecordState::InProgress {
            lease_until: ms("lease_until")?,
        },
        "completed" | "tombstone" => {
            let status: i32 = row.try_get("status").map_err(&error)?;
            let status = u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("status {status}")))?;
            let completed_at = ms("completed_at")?;
            if state == "tombstone" {
                RecordState::Tombstone {
                    completed_at,
                    status,
                }
            } else {
                let headers: Vec<u8> = row.try_get("headers").map_err(&error)?;
                let body: Vec<u8> = row.try_get("body").map_err(&error)?;
                let (headers, meta) = decode_response_headers(&headers, ambiguity.as_deref())?;
                RecordState::Completed {
                    response: StoredResponse {
                        status,
                        headers,
                        body: body.into(),
                        meta,
                    },
                    completed_at,
                }
            }
        }
        other => return Err(StoreError::Corrupt(format!("unknown state {other:?}"))),
    };
    let attempt: i32 = row.try_get("attempt").map_err(&error)?;
    Ok(Record {
        scope: scope.clone(),
        fingerprint,
        created_at: ms("created_at")?,
        expires_at: ms("expires_at")?,
        attempt: u32::try_from(attempt)
            .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
        token: FencingToken::from_i64(row.try_get("token").map_err(&error)?),
        state,
        tombstone_until: row
            .try_get::<Option<i64>, _>("tombstone_until")
            .map_err(&error)?
            .map(Timestamp::from_millis),
        in_progress_ambiguity,
    })
}
