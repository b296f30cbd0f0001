//! Store outages (SPEC S10): an unreachable or silent server is a typed
//! `StoreError::Unavailable`, never a reservation, and the store serves again once the
//! server is back.
//!
//! The tests put a relay ([`idem_test_support::Relay`]) between the store and the
//! server and break it, so the server itself is never disturbed.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ManualClock, Reservation, ReserveRequest, Store, StoreError, StoredResponse};
use idem_postgres::{PgStore, SetupError};
use idem_test_support::{Relay, RelayMode, service_addr, url_via};
use tokio::task::JoinSet;

/// A relay to the test server.
async fn relay() -> Relay {
    Relay::start(service_addr(&common::pg_url(), 5432).await).await
}

/// A store through `relay` on its own table, with timeouts short enough that an outage
/// fails fast and long enough that a loaded machine's round trips stay within them.
async fn store_via(relay: &Relay, clock: &ManualClock, ns: &str) -> Option<common::TempStore> {
    // Create the table directly, so that the relayed store starts on a migrated table
    // and the table is dropped at the end whatever the relay's state.
    let direct = common::store_with_clock(clock, ns).await?;
    let via = PgStore::builder()
        .table(direct.table())
        .clock(Arc::new(clock.clone()))
        .acquire_timeout(Duration::from_secs(3))
        .operation_timeout(Duration::from_secs(5))
        .max_connections(4)
        .migrate(false)
        .connect(&url_via(&common::pg_url(), relay.addr()))
        .await
        .expect("connect through the relay");
    Some(common::TempStore {
        inner: via,
        ..direct
    })
}

fn request(key: &str) -> ReserveRequest {
    ReserveRequest::new(test_scope("/v1/charges", key), test_fingerprint("{}"))
}

fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    match result {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("{what} during the outage must be Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_link_is_unavailable_then_recovers() {
    let relay = relay().await;
    let clock = ManualClock::starting_now();
    let Some(store) = store_via(&relay, &clock, &unique_namespace("cut")).await else {
        return;
    };
    let before = request("before-outage");
    let Reservation::Acquired(lease) = store.reserve(&before).await.expect("reserve") else {
        panic!("first reserve must acquire")
    };

    relay.set_mode(RelayMode::Reset);
    let during = request("during-outage");
    assert_unavailable(store.reserve(&during).await, "reserve");
    assert_unavailable(
        store
            .complete(&lease, &StoredResponse::new(201, "done"))
            .await,
        "complete",
    );
    assert_unavailable(store.renew(&lease, Duration::from_secs(60)).await, "renew");
    assert_unavailable(store.get(&before.scope).await, "get");
    assert_unavailable(store.purge_expired(10).await, "purge");
    assert_unavailable(store.ping().await, "ping");

    relay.set_mode(RelayMode::Forward);
    store.ping().await.expect("ping after the link is back");
    store
        .complete(&lease, &StoredResponse::new(201, "done"))
        .await
        .expect("the lease taken before the outage still completes");
    assert_eq!(
        store.reserve(&before).await.expect("reserve"),
        Reservation::Replay(StoredResponse::new(201, "done"))
    );
    // Nothing of the failed reserve reached the server: the key executes now, once.
    assert!(store.get(&during.scope).await.expect("get").is_none());
    let Reservation::Acquired(again) = store.reserve(&during).await.expect("reserve") else {
        panic!("the key refused during the outage must acquire afterwards")
    };
    assert_eq!(again.attempt, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_times_out_unavailable_then_recovers() {
    let relay = relay().await;
    let clock = ManualClock::starting_now();
    let Some(store) = store_via(&relay, &clock, &unique_namespace("silent")).await else {
        return;
    };
    store.ping().await.expect("ping");

    relay.set_mode(RelayMode::Stall);
    let req = request("silent-key");
    let started = std::time::Instant::now();
    assert_unavailable(store.reserve(&req).await, "reserve");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the operation timeout must bound a silent server"
    );
    assert_unavailable(store.ping().await, "ping");

    relay.set_mode(RelayMode::Forward);
    let Reservation::Acquired(lease) = store.reserve(&req).await.expect("reserve after") else {
        panic!("reserve after the outage must acquire")
    };
    store
        .complete(&lease, &StoredResponse::new(200, "ok"))
        .await
        .expect("complete after the outage");
}

#[tokio::test]
async fn wrong_port_is_unavailable() {
    // A port nothing listens on: bind one, note it, let it go.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    match PgStore::builder()
        .acquire_timeout(Duration::from_millis(500))
        .connect(&url)
        .await
    {
        Err(e @ SetupError::Unreachable { .. }) => assert!(e.may_pass(), "{e:?}"),
        other => panic!("connecting to a closed port must be Unreachable, got {other:?}"),
    }
    // A lazily built store starts, then fails closed on every operation.
    let store = PgStore::builder()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&url)
        .expect("lazy store");
    assert_unavailable(store.reserve(&request("k")).await, "reserve");
    assert_unavailable(store.ping().await, "ping");
}

/// While the link is cut under load, no caller is told to proceed unless its record
/// is really stored with its token, and no key is handed to two callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_false_proceed_when_the_link_is_cut_under_load() {
    let relay = relay().await;
    let clock = ManualClock::starting_now();
    let Some(store) = store_via(&relay, &clock, &unique_namespace("cut_load")).await else {
        return;
    };
    let store = Arc::new(store);
    let requests: Vec<ReserveRequest> = (0..200)
        .map(|i| request(&format!("load-{}", i % 50)))
        .collect();
    let mut tasks = JoinSet::new();
    for (i, req) in requests.iter().cloned().enumerate() {
        let store = store.clone();
        tasks.spawn(async move { (i, store.reserve(&req).await) });
        if i == 100 {
            relay.set_mode(RelayMode::Reset);
        }
    }
    let mut leases = HashMap::new();
    let mut unavailable = 0;
    while let Some(joined) = tasks.join_next().await {
        let (i, result) = joined.expect("task");
        match result {
            Ok(Reservation::Acquired(lease)) => {
                let scope = requests[i].scope.clone();
                assert!(
                    leases.insert(scope, lease).is_none(),
                    "a key was handed to two callers"
                );
            }
            Ok(Reservation::InProgress { .. }) => {}
            Ok(other) => panic!("unexpected {other:?}"),
            Err(StoreError::Unavailable(_)) => unavailable += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(unavailable > 0, "the cut must have failed some reserves");
    relay.set_mode(RelayMode::Forward);
    for (scope, lease) in &leases {
        let record = store
            .get(scope)
            .await
            .expect("get")
            .expect("an acquired key has a stored record");
        assert_eq!(
            record.token, lease.token,
            "the stored attempt is the caller's"
        );
    }
}

/// A reserve that committed on the server but whose reply was lost (the connection
/// dropped after the statement ran) does not hold its key for the whole lease: the
/// store releases the reservation it may have written, fenced by the token it sent,
/// and the next reserve of the key acquires it as attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_whose_reply_was_lost_does_not_hold_its_key() {
    let clock = ManualClock::starting_now();
    let Some(direct) = common::store_with_clock(&clock, &unique_namespace("lost_reply")).await
    else {
        return;
    };
    let relay = relay().await;
    // One connection, so the reserve below runs on the warmed one: the statement is
    // prepared already, and its one reply is the one lost.
    let store = PgStore::builder()
        .table(direct.table())
        .clock(Arc::new(clock.clone()))
        .max_connections(1)
        .migrate(false)
        .connect(&url_via(&common::pg_url(), relay.addr()))
        .await
        .expect("connect through the relay");
    let Reservation::Acquired(_) = store.reserve(&request("warm-up")).await.expect("reserve")
    else {
        panic!("a fresh key is acquired")
    };

    let req = request("lost-reply");
    relay.lose_reply_to(b"lost-reply");
    assert_unavailable(store.reserve(&req).await, "a reserve whose reply was lost");
    assert_eq!(relay.replies_lost(), 1);

    // The default lease is 60 s; without the release the key would be held that long.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while direct.get(&req.scope).await.expect("get").is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the lost reservation still holds the key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Reservation::Acquired(lease) = store.reserve(&req).await.expect("reserve") else {
        panic!("the key is free again")
    };
    assert_eq!(lease.attempt, 1);
}
