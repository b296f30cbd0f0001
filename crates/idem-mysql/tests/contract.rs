//! The idem-core store contract kit against a live MySQL or MariaDB, one table per
//! case, run as any store's crate runs it.

mod common;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ManualClock, ReserveRequest, Store, TENANT_SECRET_NAME};
use idem_mysql::MySqlStore;
use idem_test_support::{agreed_secret, assert_pool_figures};

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
    assert_pool_figures(&store, "idem_mysql", 3);
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
    let agreed = agreed_secret(&a, &connect()).await;
    let again = connect().init_secret(TENANT_SECRET_NAME, &[3; 32]).await;
    assert_eq!(again.unwrap(), agreed);
}
