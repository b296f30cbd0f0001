//! [`Store::list`](idem_core::Store::list) for MySQL: one query through the pool, in
//! primary-key order (the scope's digest), so the cursor is the last row's key and every
//! page a range scan of the primary key.

use idem_core::{ListCursor, ListPage, ListQuery, Scope, StateFilter, StoreError};
use sqlx::{AssertSqlSafe, Row};

use crate::statements::{RECORD_COLUMNS, record_from_row};
use crate::store::MySqlStore;

/// The listing's statement for table `t`, resuming after a key when `after`.
///
/// Parameters: the cursor's key (when `after`), now, the state twice, the latest
/// creation twice, whether ambiguous records only, now, the row limit. The ambiguity
/// test is the one `Record::ambiguity` makes.
fn statement(t: &str, after: bool) -> String {
    let resume = if after { "id > ? AND" } else { "" };
    format!(
        "SELECT id, tenant, endpoint, idem_key, {RECORD_COLUMNS} FROM {t}
         WHERE {resume} expires_at > ? AND state <> 'tombstone'
           AND (? IS NULL OR state = ?)
           AND (? IS NULL OR created_at <= ?)
           AND (NOT ? OR ambiguity IS NOT NULL OR attempt > 1
                OR (state = 'in_progress' AND lease_until <= ?))
         ORDER BY id
         LIMIT ?"
    )
}

impl MySqlStore {
    /// One page: at most `limit` rows read, and one more to learn whether there are.
    pub(crate) async fn list_page(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let now = self.clock.now();
        let limit = query.limit();
        let after = match &query.after {
            Some(cursor) => Some(cursor.byte_parts(1)?.remove(0)),
            None => None,
        };
        let sql = statement(&self.sql.table, after.is_some());
        let state = query.state.map(StateFilter::as_str);
        let created_by = query.created_by(now).map(|at| at.as_millis());
        let rows = self
            .retrying(|| {
                let mut q = sqlx::query(AssertSqlSafe(sql.as_str()));
                if let Some(after) = &after {
                    q = q.bind(after);
                }
                q.bind(now.as_millis())
                    .bind(state)
                    .bind(state)
                    .bind(created_by)
                    .bind(created_by)
                    .bind(query.ambiguous)
                    .bind(now.as_millis())
                    .bind(limit as u64 + 1)
                    .fetch_all(&self.pool)
            })
            .await?;
        let more = rows.len() > limit;
        let mut read = Vec::with_capacity(limit.min(rows.len()));
        let mut last = None;
        for row in rows.iter().take(limit) {
            let column = |name: &str| {
                row.try_get::<String, _>(name)
                    .map_err(crate::error::store_error)
            };
            let scope = Scope::from_columns(
                &column("tenant")?,
                &column("endpoint")?,
                &column("idem_key")?,
            )?;
            read.push(record_from_row(&scope, row)?);
            last = Some(
                row.try_get::<Vec<u8>, _>("id")
                    .map_err(crate::error::store_error)?,
            );
        }
        read.retain(|r| query.matches(r, now));
        Ok(ListPage {
            records: read,
            next: last
                .filter(|_| more)
                .map(|id| ListCursor::from_parts(&[id])),
        })
    }
}
