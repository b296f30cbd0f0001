//! A reserve that runs out of time mid-statement leaves no reservation behind for its
//! lease to hold: whatever its insert committed unseen is released by its token.

mod common;

use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ReserveRequest, Store};
use idem_mysql::MySqlStore;
use idem_test_support::eventually;

/// Reserves through a store whose operations get no time: each times out, some before
/// their insert is sent, some after it committed. For every one that failed, the key has no
/// record a moment later (a retry would execute at once), where without the release
/// an insert that committed would hold the key for its whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_that_timed_out_leaves_no_reservation() {
    let ns = unique_namespace("timeout");
    let Some(store) = common::connect(MySqlStore::builder(), &ns).await else {
        return;
    };
    // No time at all, on the other store's warm pool: an operation is dropped after its
    // first poll, which may have sent the insert.
    let hasty = MySqlStore::builder()
        .table(common::table_for(&ns))
        .operation_timeout(Duration::ZERO)
        .migrate(false)
        .from_pool(store.pool().clone())
        .await
        .expect("a store");
    let mut failed = Vec::new();
    for i in 0..50 {
        let req = ReserveRequest::new(
            test_scope("/v1/charges", &format!("hasty-{i}")),
            test_fingerprint("{}"),
        );
        if hasty.reserve(&req).await.is_err() {
            failed.push(req.scope);
        }
    }
    eprintln!("{} of 50 reserves timed out", failed.len());
    for scope in &failed {
        eventually(
            format_args!("the timed-out reservation of {scope:?} released"),
            Duration::from_secs(10),
            async || store.get(scope).await.expect("get").is_none(),
        )
        .await;
    }
}
