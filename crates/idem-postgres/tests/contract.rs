//! The idem-core store contract suite against a live PostgreSQL, one table per case.

mod common;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ManualClock, MetricKind, ReserveRequest, Store};
use idem_postgres::PgStore;

idem_core::store_contract_tests!(|clock: ManualClock, ns: String| async move {
    common::store_with_clock(&clock, &ns).await
});

/// The pool's figures, for the gateway's `/metrics`: connections open and idle, and the
/// configured most.
#[tokio::test]
async fn metrics_report_the_pool() {
    let ns = unique_namespace("metrics");
    let Some(store) = common::connect(PgStore::options().max_connections(3), &ns).await else {
        return;
    };
    let request = ReserveRequest::new(test_scope("/v1/charges", "k"), test_fingerprint("{}"));
    store.reserve(&request).await.unwrap();
    let figures = store.metrics();
    let value = |name: &str| {
        let m = figures
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} missing from {figures:?}"));
        assert_eq!(m.kind, MetricKind::Gauge, "{name}");
        m.value
    };
    assert_eq!(value("idem_postgres_pool_max_connections"), 3);
    let open = value("idem_postgres_pool_connections");
    assert!((1..=3).contains(&open), "{open} connections open");
    assert!(value("idem_postgres_pool_idle_connections") <= open);
}
