//! The idem-core store contract suite against a live MySQL or MariaDB, one table per
//! case.

mod common;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ManualClock, MetricKind, ReserveRequest, Store};
use idem_mysql::MySqlStore;

idem_core::store_contract_tests!(|clock: ManualClock, ns: String| async move {
    common::store_with_clock(&clock, &ns).await
});

/// The pool's figures, for the gateway's `/metrics`: connections open and idle, and the
/// configured most.
#[tokio::test]
async fn metrics_report_the_pool() {
    let ns = unique_namespace("metrics");
    let Some(store) = common::connect(MySqlStore::builder().max_connections(3), &ns).await else {
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
    assert_eq!(value("idem_mysql_pool_max_connections"), 3);
    let open = value("idem_mysql_pool_connections");
    assert!((1..=3).contains(&open), "{open} connections open");
    assert!(value("idem_mysql_pool_idle_connections") <= open);
}

/// Two stores on one table (two gateways), each offering its own tenant secret at
/// once, agree on one, and a store connected afterwards reads it again.
#[tokio::test]
async fn secrets_are_shared_by_instances_and_survive_reconnecting() {
    let ns = unique_namespace("secret");
    let Some(a) = common::connect(MySqlStore::builder(), &ns).await else {
        return;
    };
    let connect = || {
        MySqlStore::builder()
            .table(common::table_for(&ns))
            .connect_lazy(&common::mysql_url())
            .unwrap()
    };
    let b = connect();
    let name = idem_core::TENANT_SECRET_NAME;
    let (from_a, from_b) =
        tokio::join!(a.init_secret(name, &[1; 32]), b.init_secret(name, &[2; 32]));
    let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
    assert_eq!(from_a, from_b);
    assert!(from_a == [1; 32] || from_a == [2; 32], "{from_a:?}");
    assert_eq!(connect().init_secret(name, &[3; 32]).await.unwrap(), from_a);
}
