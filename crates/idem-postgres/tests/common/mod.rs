//! Helpers shared by the integration tests: the server's URL, and a store on a table of
//! its own, dropped when the test ends (`idem_test_support::TempTable`).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use idem_core::ManualClock;
use idem_postgres::{PgStore, PgStoreBuilder};
pub use idem_test_support::services::postgres_url as pg_url;
use idem_test_support::{DROP_CONNECT_TIMEOUT, DropFuture, on_temp_table};

/// The table name for a namespace from `idem_core::testing::unique_namespace`.
pub fn table_for(ns: &str) -> String {
    format!("idem_records_{ns}")
}

/// Connects `options` on a fresh table for `ns`, or reports the server unreachable
/// (loudly; a failure under `IDEM_REQUIRE_SERVICES=1`).
pub async fn connect(options: PgStoreBuilder, ns: &str) -> Option<TempStore> {
    let (url, table) = (pg_url(), table_for(ns));
    let opened = options.table(&table).connect(&url).await;
    on_temp_table("PostgreSQL", url, table, drop_table, opened)
}

/// A store on a fresh table, reading time from `clock`. Its timeouts are the
/// defaults' several times over: a case that waits on a lock, or queues 64 callers for
/// a few connections, still gets through on a loaded machine; none of these tests is
/// about the timeouts themselves.
pub async fn store_with_clock(clock: &ManualClock, ns: &str) -> Option<TempStore> {
    let options = PgStore::builder()
        .clock(Arc::new(clock.clone()))
        .acquire_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(30));
    connect(options, ns).await
}

/// Drops a test's table and its migration rows.
fn drop_table(url: String, table: String) -> DropFuture {
    Box::pin(async move {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(DROP_CONNECT_TIMEOUT)
            .connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        idem_postgres::schema::drop_table(&pool, &table)
            .await
            .map_err(|e| e.to_string())?;
        pool.close().await;
        Ok(())
    })
}

/// A [`PgStore`] whose table is dropped with it. Another store on the same table (a
/// proxied one, say) takes its place with `TempStore { inner: other, ..temp }`.
pub type TempStore = idem_test_support::TempStore<PgStore>;
