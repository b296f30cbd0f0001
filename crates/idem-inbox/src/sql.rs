//! What the SQL inboxes share: the table name, options and the rules for them.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Namespace, SharedClock, SystemClock};

use crate::inbox::validate_id;
use crate::retention::DEFAULT_RETENTION;
use crate::{Error, Result};

/// The processed-message table's default name.
pub const DEFAULT_TABLE: &str = "idem_inbox";

/// Settings common to the SQL inboxes.
#[derive(Debug, Clone)]
pub(crate) struct SqlSettings {
    pub consumer: Arc<str>,
    pub table: Arc<str>,
    pub retention: Duration,
    pub clock: SharedClock,
}

impl SqlSettings {
    pub fn new(consumer: String) -> Result<SqlSettings> {
        validate_id("consumer name", &consumer)?;
        Ok(SqlSettings {
            consumer: consumer.into(),
            table: DEFAULT_TABLE.into(),
            retention: DEFAULT_RETENTION,
            clock: Arc::new(SystemClock),
        })
    }

    /// The purge cutoff: rows processed before it are past retention.
    pub fn cutoff(&self) -> i64 {
        let now = self.clock.now().as_millis();
        now.saturating_sub(idem_core::duration_millis(self.retention))
    }
}

/// Table names are spliced into SQL, so only a [`Namespace`] is accepted, and one
/// that leaves room for the index name (`TABLE_processed_at`) within the same rule.
pub(crate) fn validate_table(name: &str) -> Result<()> {
    Namespace::new(name)
        .and_then(|table| table.suffixed(INDEX_SUFFIX))
        .map(drop)
        .map_err(|e| Error::Invalid {
            what: "table name",
            reason: e.to_string(),
        })
}

/// What the processed-message index's name adds to the table's.
pub(crate) const INDEX_SUFFIX: &str = "_processed_at";

/// Rows affected by a purge, as `usize`.
pub(crate) fn affected(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A purge limit as the `i64` SQL binds.
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_must_be_plain_identifiers() {
        for good in ["idem_inbox", "_x", "Inbox2", &"t".repeat(50)] {
            assert!(validate_table(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a;drop table x",
            "sch.tbl",
            "\"q\"",
            &"t".repeat(51),
        ] {
            assert!(
                matches!(validate_table(bad), Err(Error::Invalid { .. })),
                "{bad}"
            );
        }
    }
}
