//! Helpers shared by the integration tests: the server's URL, a store on a table of
//! its own, and the table's removal when the test ends.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use idem_core::ManualClock;
use idem_mysql::{MySqlStore, MySqlStoreBuilder, SetupError};
pub use idem_test_support::services::mysql_url;
use idem_test_support::{HookedStore, StoreHooks, service_unavailable};

/// The table name for a namespace from `idem_core::testing::unique_namespace`: each
/// test's own, so that no test assumes an empty database.
pub fn table_for(ns: &str) -> String {
    format!("idem_records_{ns}")
}

/// Connects `options` on a fresh table for `ns`, or reports the server unreachable
/// (loudly; a failure under `IDEM_REQUIRE_SERVICES=1`).
pub async fn connect(options: MySqlStoreBuilder, ns: &str) -> Option<TempStore> {
    let url = mysql_url();
    let table = table_for(ns);
    match options.table(&table).connect(&url).await {
        Ok(store) => Some(HookedStore::new(store, TempTable { url, table })),
        Err(e @ SetupError::Unreachable { .. }) => service_unavailable("MySQL", &url, &e),
        Err(e) => panic!("connecting to {url}: {e}"),
    }
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

/// Drops its table (and its migration rows) when dropped, even when the test panics.
#[derive(Debug)]
pub struct TempTable {
    pub url: String,
    pub table: String,
}

impl Drop for TempTable {
    fn drop(&mut self) {
        let (url, table) = (self.url.clone(), self.table.clone());
        // Drop may run inside the test's runtime, which must not be blocked on; a
        // thread with its own small runtime does the work and is waited for.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let pool = sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                idem_mysql::schema::drop_table(&pool, &table)
                    .await
                    .map_err(|e| e.to_string())?;
                pool.close().await;
                Ok::<_, String>(())
            })
        })
        .join();
        if let Ok(Err(e)) = done {
            eprintln!("could not drop test table {}: {e}", self.table);
        }
    }
}

/// A [`MySqlStore`] whose table is dropped with it.
pub type TempStore = HookedStore<MySqlStore, TempTable>;

/// Every call passes on to the store: the table only has to outlive it.
impl StoreHooks<MySqlStore> for TempTable {}
