//! `?wait=N` on one server: a `redis-server` and its replica, started by the test.
//! With the replica linked, reservations and completions go through; with it
//! stopped, a reservation is refused as unavailable and released.

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{
    Endpoint, Key, ManualClock, Reservation, ReserveRequest, Scope, ScopeMode, Store, StoreError,
    StoredResponse, Tenant,
};
use idem_redis::RedisStore;
use idem_test_support::{RedisCluster, service_unavailable};

async fn connect(url: &str) -> RedisStore {
    RedisStore::builder()
        .clock(Arc::new(ManualClock::starting_now()))
        .key_prefix(format!("idem-test:{}:", unique_namespace("wait")))
        .timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn request(i: usize) -> ReserveRequest {
    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::new("wait-tenant"),
        Endpoint::new("POST", "/v1/wait"),
        Key::new(format!("wait-{i}")).expect("valid key"),
    );
    ReserveRequest::new(scope, test_fingerprint("wait"))
}

#[tokio::test]
async fn a_reservation_waits_for_the_replica_and_is_released_when_it_is_gone() {
    let mut servers = match RedisCluster::start_replicated(1) {
        Ok(servers) => servers,
        Err(e) => {
            return service_unavailable::<()>("redis-server with a replica", "127.0.0.1", &e)
                .unwrap_or(());
        }
    };
    let url = servers.url();
    let waiting = connect(&format!("{url}/?wait=1&wait_timeout=2s")).await;
    for i in 0..8 {
        let req = request(i);
        let Reservation::Acquired(lease) = waiting.reserve(&req).await.unwrap() else {
            panic!("key {i} was fresh");
        };
        waiting
            .complete(&lease, &StoredResponse::new(201, "held by the replica"))
            .await
            .unwrap();
    }

    servers.kill(servers.ports()[1]);
    let impatient = RedisStore::builder()
        .key_prefix(waiting.key_prefix())
        .connect(&format!("{url}/?wait=1&wait_timeout=100ms"))
        .await
        .unwrap();
    let req = request(100);
    match impatient.reserve(&req).await {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("0 of the 1 replicas"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(impatient.get(&req.scope).await.unwrap(), None, "released");
    // What the replica acknowledged before it went is still there.
    assert!(impatient.get(&request(0).scope).await.unwrap().is_some());
}
