//! idem's store contract suite (SPEC S10) against `SqliteStore`, one test per case.
//!
//! Each case gets its own database file in a temporary directory, and its namespace as
//! the table name, so the suite also exercises a non-default table.

use std::sync::Arc;

use idem_core::ManualClock;
use idem_sqlite::SqliteStore;
use idem_test_support::{HookedStore, StoreHooks};

/// The case's database directory, deleted when the case drops its store.
struct CaseDir(#[allow(dead_code)] tempfile::TempDir);

impl StoreHooks<SqliteStore> for CaseDir {}

idem_core::store_contract_tests!(|clock: ManualClock, ns: String| async move {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("contract.db").display());
    let store = SqliteStore::builder()
        .clock(Arc::new(clock))
        .table(ns)
        .connect(&url)
        .await
        .expect("open the store");
    Some(HookedStore::new(store, CaseDir(dir)))
});
