//! [`Store::list`](idem_core::Store::list) for PostgreSQL: one query through the pool,
//! in primary-key order (the scope's columns are `COLLATE "C"`, so that order is the
//! bytes'), so the cursor is the last row's key and every page a range scan.

use idem_core::{ListCursor, ListPage, ListQuery, Scope, StateFilter, StoreError};
use sqlx::{AssertSqlSafe, Row};

use crate::error::store_error;
use crate::statements::{RECORD_COLUMNS, record_from_row};
use crate::store::PgStore;

/// The listing's statement for table `t`, resuming after a key when `after`.
///
/// $1–$3 the cursor's key, $4 now, $5 the state or NULL, $6 the latest creation or
/// NULL, $7 whether ambiguous records only, $8 the row limit. The ambiguity test is the
/// one `Record::ambiguity` makes, the stored reason read from its indexed column.
fn statement(t: &str, after: bool) -> String {
    let resume = if after {
        "(tenant, endpoint, idem_key) > ($1::text, $2::text, $3::text) AND"
    } else {
        "$1::text IS NULL AND $2::text IS NULL AND $3::text IS NULL AND"
    };
    format!(
        "SELECT tenant, endpoint, idem_key, {RECORD_COLUMNS} FROM {t}
         WHERE {resume} expires_at > $4 AND state <> 'tombstone'
           AND ($5::text IS NULL OR state = $5::text)
           AND ($6::bigint IS NULL OR created_at <= $6::bigint)
           AND (NOT $7::boolean OR ambiguity IS NOT NULL OR attempt > 1
                OR (state = 'in_progress' AND lease_until <= $4))
         ORDER BY tenant, endpoint, idem_key
         LIMIT $8"
    )
}

impl PgStore {
    /// One page: at most `limit` rows read, and one more to learn whether there are.
    pub(crate) async fn list_page(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let now = self.clock.now();
        let limit = query.limit();
        let after = query
            .after
            .as_ref()
            .map(ListCursor::scope_parts)
            .transpose()?;
        let sql = statement(&self.sql.table, after.is_some());
        let [t, e, k] = match after {
            Some([t, e, k]) => [Some(t), Some(e), Some(k)],
            None => [None, None, None],
        };
        let rows = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(t)
                    .bind(e)
                    .bind(k)
                    .bind(now.as_millis())
                    .bind(query.state.map(StateFilter::as_str))
                    .bind(query.created_by(now).map(|at| at.as_millis()))
                    .bind(query.ambiguous)
                    .bind(limit as i64 + 1)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        let read = rows
            .iter()
            .take(limit)
            .map(|row| {
                let column = |name: &str| row.try_get::<String, _>(name).map_err(store_error);
                let scope = Scope::from_columns(
                    &column("tenant")?,
                    &column("endpoint")?,
                    &column("idem_key")?,
                )?;
                record_from_row(&scope, row)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ListPage::in_scope_order(
            read,
            rows.len() > limit,
            query,
            now,
        ))
    }
}
