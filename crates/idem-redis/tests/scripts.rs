//! What the Redis store counts when Redis forgets its scripts.
//!
//! Alone in its test binary: `SCRIPT FLUSH` empties the script cache of the whole
//! server, and a test beside it in the same process could load the same script between
//! the flush and this test's call (then nothing is reloaded here), or meet a second
//! flush between its own reload and retry. Cargo runs test binaries one at a time.

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ManualClock, Reservation, ReserveRequest, Store, StoreError, StoredResponse};
use idem_redis::RedisStore;
use idem_test_support::services::redis_url;
use idem_test_support::{figure, service_unavailable};

/// A script that Redis forgot (`SCRIPT FLUSH`) and the store loaded again is counted
/// once; a completion refused by the fence is no failed command.
#[tokio::test]
async fn script_reloads_are_counted_and_a_fence_is_no_failure() {
    let url = redis_url();
    let clock = ManualClock::starting_now();
    let store = match RedisStore::builder()
        .clock(Arc::new(clock.clone()))
        .key_prefix(format!("idem-test:{}:", unique_namespace("scripts")))
        // Five times the default response timeout, so that a loaded machine does not
        // turn a slow answer into an outage.
        .timeout(Duration::from_secs(5))
        .connect(&url)
        .await
    {
        Ok(s) => s,
        Err(e) => {
            service_unavailable::<()>("Redis", &url, &e);
            return;
        }
    };
    let mut raw = redis::Client::open(url.as_str())
        .expect("URL")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection");
    const LOADS: &str = "idem_redis_script_loads_total";
    const FAILED: &str = "idem_redis_failed_commands_total";
    let scope = test_scope("/v1/charges", "metrics-key");
    let req =
        ReserveRequest::new(scope.clone(), test_fingerprint("{}")).lease(Duration::from_secs(30));
    let first = store.reserve(&req).await.expect("reserve");
    let first = first.lease().cloned().expect("acquired");
    clock.advance(Duration::from_secs(31));
    let second = store.reserve(&req).await.expect("take over");
    let second = second.lease().cloned().expect("acquired");
    assert_eq!(second.attempt, 2);

    // The first attempt's late answer is refused, and that is no failed command.
    let late = store
        .complete(&first, &StoredResponse::new(200, "late"))
        .await;
    assert!(matches!(late, Err(StoreError::Fenced)), "{late:?}");
    assert_eq!(figure(&store, FAILED), 0);

    // Redis forgets its scripts; the next completion loads its script once and works.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .expect("SCRIPT FLUSH");
    let loads = figure(&store, LOADS);
    store
        .complete(&second, &StoredResponse::new(201, "made"))
        .await
        .expect("complete after the flush");
    assert_eq!(figure(&store, LOADS), loads + 1);
    assert_eq!(figure(&store, FAILED), 0);
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(StoredResponse::new(201, "made"))
    );
    store.remove(&scope).await.expect("clean up");
}
