//! The outbox table: its name, the columns a claim and a listing read, and the
//! messages its rows hold.

use std::time::Duration;

use crate::outbox::now_ms;
use crate::{Destination, Error, Message, OutboxStats, ParkedMessage, Result, StagedMessage};

/// The outbox table's default name.
pub const DEFAULT_TABLE: &str = "idem_outbox";

/// The longest table name: room is left for the suffixes of the indexes and the relay
/// lease table within PostgreSQL's 63-byte identifiers.
const MAX_TABLE_LEN: usize = 40;

/// Table names are spliced into SQL, so only plain identifiers are accepted.
pub(crate) fn validate_table(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok
        && name.len() <= MAX_TABLE_LEN
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        Ok(())
    } else {
        Err(Error::invalid(
            "table name",
            format!(
                "{name:?}: 1 to {MAX_TABLE_LEN} ASCII letters, digits or '_', not starting with a digit"
            ),
        ))
    }
}

/// The columns a claim reads, in this order, the id and the ordering key as `text`
/// makes them text (they are bytes in MySQL).
pub(crate) fn claim_columns(text: fn(&str) -> String) -> String {
    format!(
        "o.seq, {}, o.destination, o.routing_key, o.headers, o.body, {}, o.staged_at, \
         o.attempts",
        text("o.id"),
        text("o.ordering_key")
    )
}

/// A claimed row as sqlx decodes it.
pub(crate) type ClaimRow = (
    i64,
    String,
    String,
    Option<String>,
    String,
    Vec<u8>,
    Option<String>,
    i64,
    i64,
);

pub(crate) fn staged(row: ClaimRow) -> Result<StagedMessage> {
    let (seq, id, destination, routing_key, headers, body, ordering_key, staged_at, attempts) = row;
    Ok(StagedMessage {
        seq,
        message: Message {
            id,
            destination: Destination::from_columns(destination, routing_key),
            headers: Message::headers_from_json(&headers)?,
            body,
            ordering_key,
        },
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        staged_at_ms: staged_at,
    })
}

/// The columns [`parked`] reads, in this order: a claim's, the error, the parking time.
pub(crate) fn parked_columns(text: fn(&str) -> String) -> String {
    format!("{}, o.last_error, o.parked_at", claim_columns(text))
}

/// A parked row as sqlx decodes it: a claimed row, the error and the parking time.
pub(crate) type ParkedRow = (
    i64,
    String,
    String,
    Option<String>,
    String,
    Vec<u8>,
    Option<String>,
    i64,
    i64,
    Option<String>,
    i64,
);

pub(crate) fn parked(row: ParkedRow) -> Result<ParkedMessage> {
    let (
        seq,
        id,
        destination,
        routing_key,
        headers,
        body,
        key,
        staged_at,
        attempts,
        error,
        parked_at,
    ) = row;
    let staged = staged((
        seq,
        id,
        destination,
        routing_key,
        headers,
        body,
        key,
        staged_at,
        attempts,
    ))?;
    Ok(ParkedMessage {
        message: staged.message,
        error: error.unwrap_or_default(),
        attempts: staged.attempts,
        parked_at_ms: parked_at,
    })
}

/// Rows affected, as `usize`.
pub(crate) fn affected(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A limit as the `i64` SQL binds.
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Builds [`OutboxStats`] from the counts the backends read.
pub(crate) fn stats(
    unpublished: i64,
    oldest_staged_ms: Option<i64>,
    parked: i64,
    published: i64,
) -> OutboxStats {
    let age = oldest_staged_ms.map_or(0, |t| now_ms().saturating_sub(t).max(0));
    OutboxStats {
        unpublished: count(unpublished),
        parked: count(parked),
        published: count(published),
        oldest_unpublished_age: Duration::from_millis(u64::try_from(age).unwrap_or(0)),
    }
}

/// A count as `u64`.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_must_be_plain_identifiers() {
        for good in ["idem_outbox", "_x", "Outbox2", &"t".repeat(MAX_TABLE_LEN)] {
            assert!(validate_table(good).is_ok(), "{good}");
        }
        for bad in ["", "1abc", "a-b", "a;drop table x", "s.t", &"t".repeat(41)] {
            assert!(validate_table(bad).is_err(), "{bad}");
        }
    }
}
