//! The idem-core store contract (SPEC S10) against the live Redis server.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{ManualClock, Store};
use idem_redis::RedisStore;
use idem_test_support::service_unavailable;
use idem_test_support::services::redis_url;

async fn store(clock: ManualClock, ns: String) -> Option<RedisStore> {
    let url = redis_url();
    match RedisStore::builder()
        .clock(Arc::new(clock))
        .key_prefix(format!("idem-test:{ns}:"))
        // Five times the default response timeout, so that a loaded machine does not
        // turn a slow answer into an outage.
        .timeout(Duration::from_secs(5))
        .connect(&url)
        .await
    {
        Ok(store) => Some(store),
        Err(e) => service_unavailable("Redis", &url, &e),
    }
}

idem_core::store_contract_tests!(store);

/// Two stores on one prefix (two gateways), each offering its own tenant secret at
/// once, agree on one; a store connected afterwards reads it again, and it has no
/// TTL. The test deletes its key afterwards.
#[tokio::test]
async fn secrets_are_shared_by_instances_and_survive_reconnecting() {
    let clock = ManualClock::starting_now();
    let ns = idem_core::testing::unique_namespace("secret");
    let Some(a) = store(clock.clone(), ns.clone()).await else {
        return;
    };
    let b = store(clock.clone(), ns.clone())
        .await
        .expect("second store");
    let name = idem_core::TENANT_SECRET_NAME;
    let (from_a, from_b) =
        tokio::join!(a.init_secret(name, &[1; 32]), b.init_secret(name, &[2; 32]));
    let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
    assert_eq!(from_a, from_b);
    assert!(from_a == [1; 32] || from_a == [2; 32], "{from_a:?}");
    let c = store(clock, ns).await.expect("third store");
    assert_eq!(c.init_secret(name, &[3; 32]).await.unwrap(), from_a);

    let url = redis_url();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = c.secret_key(name);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ttl, -1, "the secret has no TTL");
    let _: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}
