//! idem's store contract suite (SPEC S10) against `SqliteStore`, one test per case.
//!
//! Each case gets its own database file in a temporary directory, and its namespace as
//! the table name, so the suite also exercises a non-default table.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Lease, ManualClock, Record, Reservation, ReserveRequest, Result, Scope, Store, StoredResponse,
};
use idem_sqlite::SqliteStore;

/// A store that deletes its database directory when the case drops it.
struct CaseStore {
    store: SqliteStore,
    _dir: tempfile::TempDir,
}

#[async_trait]
impl Store for CaseStore {
    async fn reserve(&self, request: &ReserveRequest) -> Result<Reservation> {
        self.store.reserve(request).await
    }
    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        self.store.complete(lease, response).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        self.store.renew(lease, lease_for).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.store.release(lease).await
    }
    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        self.store.get(scope).await
    }
    async fn remove(&self, scope: &Scope) -> Result<bool> {
        self.store.remove(scope).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        self.store.purge_expired(limit).await
    }
    async fn ping(&self) -> Result<()> {
        self.store.ping().await
    }
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        self.store.init_secret(name, candidate).await
    }
}

idem_core::store_contract_tests!(|clock: ManualClock, ns: String| async move {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("contract.db").display());
    let store = SqliteStore::builder()
        .clock(Arc::new(clock))
        .table(ns)
        .connect(&url)
        .await
        .expect("open the store");
    Some(CaseStore { store, _dir: dir })
});
