//! The batch statements, one per kind and per size. A batch of `n` is written with the
//! statement for the next power of two, its spare rows filled so that they change
//! nothing (see each statement), so that a connection prepares at most a few of each
//! kind however the batches' sizes vary: sqlx caches a prepared statement per text and
//! connection, and the server counts them against `max_prepared_stmt_count`.
//!
//! Each mirrors the single-row statement of [`Statements`](crate::statements::Statements)
//! that it batches, row for row; a change to one belongs in the other.

use crate::statements::RECORD_COLUMNS;

/// The batch statements of one table, indexed by the log2 of their size.
pub(crate) struct BatchStatements {
    /// `INSERT IGNORE` of fresh records, each row binding `id, tenant, endpoint, key,
    /// fingerprint, now, expires_at, token, lease_until` (the single-row insert's). A
    /// spare row repeats the last, which the key then passes over.
    pub(crate) insert: Vec<String>,
    /// The rows of the ids bound, `id` first then [`RECORD_COLUMNS`]. A spare id repeats
    /// the last.
    pub(crate) read: Vec<String>,
    /// The completion: each row binding `id, token, status, headers, body, ambiguity,
    /// ttl, tombstone` (TTLs in ms, 0 for no tombstone), then `now, now`. A spare row's
    /// id is NULL, which joins nothing.
    pub(crate) complete: Vec<String>,
    /// Which of the ids bound are completed under the token bound beside each: `id,
    /// token` per row, then `now`; answers the ids. A spare row repeats the last.
    pub(crate) completed: Vec<String>,
}

/// The size of the statement a batch of `n` is written with, and its index.
pub(crate) fn size_for(n: usize) -> (usize, usize) {
    let size = n.max(1).next_power_of_two();
    (size, size.trailing_zeros() as usize)
}

/// `row` repeated `n` times, separated by `sep`.
fn repeat(row: &str, sep: &str, n: usize) -> String {
    vec![row; n].join(sep)
}

impl BatchStatements {
    pub(crate) fn for_table(t: &str, max_batch: usize) -> BatchStatements {
        let (_, last) = size_for(max_batch);
        let sizes = || (0..=last).map(|i| 1usize << i);
        let insert = sizes()
            .map(|n| {
                format!(
                    "INSERT IGNORE INTO {t} (id, tenant, endpoint, idem_key, fingerprint,
                            created_at, expires_at, attempt, token, state, lease_until)
                     VALUES {}",
                    repeat("(?, ?, ?, ?, ?, ?, ?, 1, ?, 'in_progress', ?)", ", ", n)
                )
            })
            .collect();
        let read = sizes()
            .map(|n| {
                format!(
                    "SELECT id, {RECORD_COLUMNS} FROM {t} WHERE id IN ({})",
                    repeat("?", ", ", n)
                )
            })
            .collect();
        // As the single-row completion: a completed record expires at creation + TTL,
        // never later than it was, its tombstone that long after (0 for none), with
        // CASEs so that no sum overflows. A multiple-table UPDATE may assign in any
        // order; tombstone_until reads expires_at, which this statement changes, and
        // gets the same either way: the expiry of an expiry already computed is itself.
        let expiry = "(CASE WHEN i.ttl < r.expires_at - r.created_at
                            THEN r.created_at + i.ttl ELSE r.expires_at END)";
        let first = "SELECT CAST(? AS BINARY) AS id, ? AS token, ? AS status,
                            CAST(? AS BINARY) AS headers, CAST(? AS BINARY) AS body,
                            ? AS ambiguity, ? AS ttl, ? AS tombstone";
        let next = "SELECT CAST(? AS BINARY), ?, ?, CAST(? AS BINARY), CAST(? AS BINARY), ?, ?, ?";
        let complete = sizes()
            .map(|n| {
                let rows = std::iter::once(first.to_owned())
                    .chain(std::iter::repeat_n(next.to_owned(), n - 1))
                    .collect::<Vec<_>>()
                    .join(" UNION ALL ");
                format!(
                    "UPDATE {t} AS r FORCE INDEX (PRIMARY) JOIN ({rows}) AS i ON r.id = i.id
                        SET r.state = 'completed', r.lease_until = NULL, r.status = i.status,
                            r.headers = i.headers, r.body = i.body, r.completed_at = ?,
                            r.ambiguity = i.ambiguity,
                            r.tombstone_until = CASE WHEN i.tombstone = 0 THEN NULL
                                WHEN {expiry} > 9223372036854775807 - i.tombstone
                                    THEN 9223372036854775807
                                ELSE {expiry} + i.tombstone END,
                            r.expires_at = {expiry}
                      WHERE r.token = i.token AND r.expires_at > ? AND r.state = 'in_progress'"
                )
            })
            .collect();
        let completed = sizes()
            .map(|n| {
                format!(
                    "SELECT id FROM {t}
                      WHERE (id, token) IN ({}) AND expires_at > ? AND state = 'completed'",
                    repeat("(?, ?)", ", ", n)
                )
            })
            .collect();
        BatchStatements {
            insert,
            read,
            complete,
            completed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_written_with_the_next_power_of_two() {
        assert_eq!(size_for(0), (1, 0));
        assert_eq!(size_for(1), (1, 0));
        assert_eq!(size_for(3), (4, 2));
        assert_eq!(size_for(64), (64, 6));
        let sql = BatchStatements::for_table("t", 64);
        assert_eq!(sql.insert.len(), 7);
        assert_eq!(sql.complete[2].matches('?').count(), 4 * 8 + 2);
        assert_eq!(sql.read[3].matches('?').count(), 8);
        assert_eq!(sql.completed[1].matches('?').count(), 2 * 2 + 1);
    }
}
