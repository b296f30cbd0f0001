//! Helpers shared by the integration tests: the server's URL, and a store on a table of
//! its own, dropped when the test ends (`idem_test_support::TempTable`).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use idem_core::ManualClock;
use idem_mysql::{MySqlStore, MySqlStoreBuilder};
pub use idem_test_support::services::mysql_url;
use idem_test_support::{DROP_CONNECT_TIMEOUT, DropFuture, on_temp_table};

/// The table name for a namespace from `idem_core::testing::unique_namespace`: each
/// test's own, so that no test assumes an empty database.
pub fn table_for(ns: &str) -> String {
    format!("idem_records_{ns}")
}

/// Connects `options` on a fresh table for `ns`, or reports the server unreachable
/// (loudly; a failure under `IDEM_REQUIRE_SERVICES=1`).
pub async fn connect(options: MySqlStoreBuilder, ns: &str) -> Option<TempStore> {
    let (url, table) = (mysql_url(), table_for(ns));
    let opened = options.table(&table).connect(&url).await;
    on_temp_table("MySQL", url, table, drop_table, opened)
}

/// A store on a fresh table, reading time from `clock`, with timeouts several times the
/// defaults: a case that queues 64 callers for a few connections still gets through on
/// a loaded machine.
pub async fn store_with_clock(clock: &ManualClock, ns: &str) -> Option<TempStore> {
    let options = MySqlStore::builder()
        .clock(Arc::new(clock.clone()))
        .acquire_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(30));
    connect(options, ns).await
}

/// Drops a test's table and its migration rows.
fn drop_table(url: String, table: String) -> DropFuture {
    Box::pin(async move {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(DROP_CONNECT_TIMEOUT)
            .connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        idem_mysql::schema::drop_table(&pool, &table)
            .await
            .map_err(|e| e.to_string())?;
        pool.close().await;
        Ok(())
    })
}

/// A [`MySqlStore`] whose table is dropped with it.
pub type TempStore = idem_test_support::TempStore<MySqlStore>;
