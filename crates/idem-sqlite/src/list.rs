//! [`Store::list`](idem_core::Store::list) for SQLite: one read through the pool, in
//! primary-key order, so the cursor is the last row's key and every page a range scan.

use idem_core::{ListCursor, ListPage, ListQuery, Scope, StateFilter, StoreError};
use sqlx::{AssertSqlSafe, Row};

use crate::error::store_error;
use crate::row::StoredRow;
use crate::schema::RECORD_COLUMNS;
use crate::store::SqliteStore;

/// The listing's statement for table `t`, resuming after a key when `after`.
///
/// ?1–?3 the cursor's key, ?4 now, ?5 the state or NULL, ?6 the latest creation or
/// NULL, ?7 1 for ambiguous records only, ?8 the row limit. The ambiguity test is the
/// one `Record::ambiguity` makes, the stored reason read from its indexed column.
fn statement(t: &str, after: bool) -> String {
    let resume = if after {
        "(tenant, endpoint, idem_key) > (?1, ?2, ?3) AND"
    } else {
        ""
    };
    format!(
        "SELECT tenant, endpoint, idem_key, {RECORD_COLUMNS} FROM {t}
         WHERE {resume} expires_at > ?4 AND state <> 'tombstone'
           AND (?5 IS NULL OR state = ?5)
           AND (?6 IS NULL OR created_at <= ?6)
           AND (?7 = 0 OR ambiguity IS NOT NULL OR attempt > 1
                OR (state = 'in_progress' AND lease_until <= ?4))
         ORDER BY tenant, endpoint, idem_key
         LIMIT ?8"
    )
}

impl SqliteStore {
    /// One page: at most `limit` rows read, and one more to learn whether there are.
    pub(crate) async fn list_page(&self, query: &ListQuery) -> idem_core::Result<ListPage> {
        let now = self.clock.now();
        let limit = query.limit();
        let after = query
            .after
            .as_ref()
            .map(ListCursor::scope_parts)
            .transpose()?;
        let sql = statement(&self.table, after.is_some());
        let [t, e, k] = after.unwrap_or_default();
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(t)
            .bind(e)
            .bind(k)
            .bind(now.as_millis())
            .bind(query.state.map(StateFilter::as_str))
            .bind(query.created_by(now).map(|at| at.as_millis()))
            .bind(i64::from(query.ambiguous))
            .bind(limit as i64 + 1)
            .fetch_all(&self.pool)
            .await
            .map_err(store_error)?;
        let read = rows
            .iter()
            .take(limit)
            .map(|row| {
                let scope = scope_of(row)?;
                // The row's own columns start after the scope's three.
                StoredRow::from_sqlx_at(row, 3)
                    .map_err(store_error)?
                    .into_record(&scope)
            })
            .collect::<idem_core::Result<Vec<_>>>()?;
        Ok(ListPage::in_scope_order(
            read,
            rows.len() > limit,
            query,
            now,
        ))
    }
}

fn scope_of(row: &sqlx::sqlite::SqliteRow) -> idem_core::Result<Scope> {
    let column = |i: usize| row.try_get::<String, _>(i).map_err(store_error);
    Scope::from_columns(&column(0)?, &column(1)?, &column(2)?).map_err(|e| match e {
        StoreError::Corrupt(why) => StoreError::Corrupt(format!("idem-sqlite record: {why}")),
        other => other,
    })
}
