//! Helpers shared by the integration tests: the server's URL, a store on a table of
//! its own, and the table's removal when the test ends.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use idem_core::ManualClock;
use idem_postgres::{PgStore, PgStoreBuilder, SetupError};
pub use idem_test_support::services::postgres_url as pg_url;
use idem_test_support::{HookedStore, StoreHooks, service_unavailable};

/// The table name for a namespace from `idem_core::testing::unique_namespace`.
pub fn table_for(ns: &str) -> String {
    format!("idem_records_{ns}")
}

/// Connects `options` on a fresh table for `ns`, or reports the server unreachable
/// (loudly; a failure under `IDEM_REQUIRE_SERVICES=1`).
pub async fn connect(options: PgStoreBuilder, ns: &str) -> Option<TempStore> {
    let url = pg_url();
    let table = table_for(ns);
    match options.table(&table).connect(&url).await {
        Ok(store) => Some(HookedStore::new(store, TempTable { url, table })),
        Err(e @ SetupError::Unreachable { .. }) => service_unavailable("PostgreSQL", &url, &e),
        Err(e) => panic!("connecting to {url}: {e}"),
    }
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
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(&url)
                    .await?;
                idem_postgres::schema::drop_table(&pool, &table)
                    .await
                    .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                pool.close().await;
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        if let Ok(Err(e)) = done {
            eprintln!("could not drop test table {}: {e}", self.table);
        }
    }
}

/// A [`PgStore`] whose table is dropped with it. Another store on the same table (a
/// proxied one, say) takes its place with `TempStore { inner: other, ..temp }`.
pub type TempStore = HookedStore<PgStore, TempTable>;

/// Every call passes on to the store: the table only has to outlive it.
impl StoreHooks<PgStore> for TempTable {}
