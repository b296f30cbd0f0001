//! Helpers shared by the integration tests: the server's URL, a store on a table of
//! its own, and the table's removal when the test ends.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::testing::{service_unavailable, service_url};
use idem_core::{
    Lease, ManualClock, Record, Reservation, ReserveRequest, Scope, Store, StoreError,
    StoredResponse,
};
use idem_postgres::{Error, PgStore, PgStoreOptions};

/// The test server's URL.
pub fn pg_url() -> String {
    service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// The table name for a namespace from `idem_core::testing::unique_namespace`.
pub fn table_for(ns: &str) -> String {
    format!("idem_records_{ns}")
}

/// Connects `options` on a fresh table for `ns`, or reports the server unreachable
/// (loudly; a failure under `IDEM_REQUIRE_SERVICES=1`).
pub async fn connect(options: PgStoreOptions, ns: &str) -> Option<TempStore> {
    let url = pg_url();
    let table = table_for(ns);
    match options.table(&table).connect(&url).await {
        Ok(store) => Some(TempStore {
            store,
            _table: TempTable { url, table },
        }),
        Err(Error::Store(StoreError::Unavailable(e))) => {
            service_unavailable("PostgreSQL", &url, &e)
        }
        Err(e) => panic!("connecting to {url}: {e}"),
    }
}

/// A store on a fresh table, reading time from `clock`.
pub async fn store_with_clock(clock: &ManualClock, ns: &str) -> Option<TempStore> {
    connect(PgStore::options().clock(Arc::new(clock.clone())), ns).await
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

/// A [`PgStore`] whose table is dropped with it.
#[derive(Debug)]
pub struct TempStore {
    pub store: PgStore,
    _table: TempTable,
}

impl TempStore {
    /// Another store (a proxied one, say) on this table, still dropped with it.
    pub fn with_store(self, store: PgStore) -> TempStore {
        TempStore {
            store,
            _table: self._table,
        }
    }
}

impl std::ops::Deref for TempStore {
    type Target = PgStore;
    fn deref(&self) -> &PgStore {
        &self.store
    }
}

#[async_trait]
impl Store for TempStore {
    async fn reserve(&self, request: &ReserveRequest) -> idem_core::Result<Reservation> {
        self.store.reserve(request).await
    }
    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> idem_core::Result<()> {
        self.store.complete(lease, response).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> idem_core::Result<()> {
        self.store.renew(lease, lease_for).await
    }
    async fn release(&self, lease: &Lease) -> idem_core::Result<()> {
        self.store.release(lease).await
    }
    async fn get(&self, scope: &Scope) -> idem_core::Result<Option<Record>> {
        self.store.get(scope).await
    }
    async fn remove(&self, scope: &Scope) -> idem_core::Result<bool> {
        self.store.remove(scope).await
    }
    async fn purge_expired(&self, limit: usize) -> idem_core::Result<usize> {
        self.store.purge_expired(limit).await
    }
    async fn ping(&self) -> idem_core::Result<()> {
        self.store.ping().await
    }
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> idem_core::Result<Vec<u8>> {
        self.store.init_secret(name, candidate).await
    }
    fn metrics(&self) -> Vec<idem_core::StoreMetric> {
        self.store.metrics()
    }
}
