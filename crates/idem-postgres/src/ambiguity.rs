//! The `ambiguity` column (migration 6) written on its own, for an attempt that leaves
//! its record in progress ([`PgStore::mark_row`]); an answer's reason is written with
//! the answer (`statements::RowAnswer`).

use idem_core::{Ambiguity, Lease, StoreError};
use sqlx::AssertSqlSafe;

use crate::error::{fenced_unless_one, store_error};
use crate::store::PgStore;

impl PgStore {
    /// [`Store::mark_ambiguous`](idem_core::Store::mark_ambiguous): the reason set on
    /// `lease`'s in-progress record, fenced.
    pub(crate) async fn mark_row(
        &self,
        lease: &Lease,
        reason: Ambiguity,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let scope = &lease.scope;
        let done = self
            .bounded(async {
                sqlx::query(AssertSqlSafe(self.sql.mark.clone()))
                    .bind(scope.tenant().as_str())
                    .bind(scope.endpoint_str())
                    .bind(scope.key().as_str())
                    .bind(lease.token.as_i64())
                    .bind(now.as_millis())
                    .bind(reason.as_str())
                    .execute(&self.pool)
                    .await
                    .map_err(store_error)
            })
            .await?;
        fenced_unless_one(done.rows_affected())
    }
}
