//! Store outage (SPEC S10): when Redis cannot be reached every operation fails with
//! `StoreError::Unavailable`, never with a reservation the server did not record, and
//! operations work again once it is back.
//!
//! The outage is made by a relay ([`idem_test_support::Relay`]) that stands between the
//! store and the machine's Redis: `Refuse` closes its port and every relayed connection,
//! `Stall` accepts and passes nothing on. The Redis server itself is never touched.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{
    Lease, RecordState, Reservation, ReserveRequest, Store, StoreError, StoredResponse,
};
use idem_redis::RedisStore;
use idem_test_support::services::redis_url;
use idem_test_support::{
    Relay, RelayMode, WAIT, eventually, figure, service_addr, service_unavailable, url_via,
};

/// Guards each operation against hanging: far above the store's own timeouts.
const HANG_GUARD: Duration = Duration::from_secs(15);

/// A store through a fresh relay, and a direct one with the same prefix to inspect
/// what Redis really holds. `None` when Redis is unreachable (the skip is reported).
async fn setup(case: &str) -> Option<(Relay, RedisStore, RedisStore)> {
    let url = redis_url();
    let prefix = format!("idem-test:{}:", unique_namespace(case));
    let direct = match RedisStore::builder()
        .key_prefix(&prefix)
        .timeout(Duration::from_secs(5))
        .connect(&url)
        .await
    {
        Ok(s) => s,
        Err(e) => return service_unavailable("Redis", &url, &e),
    };
    let upstream = service_addr(&url, 6379).await;
    let relay = Relay::start(upstream).await;
    // Three times the default timeout: a stall still fails each operation well within
    // the hang guard, and a loaded machine's answers still come in time.
    let proxied = RedisStore::builder()
        .key_prefix(&prefix)
        .timeout(Duration::from_secs(3))
        .connect(&url_via(&url, relay.addr()))
        .await
        .expect("connect through the relay");
    Some((relay, proxied, direct))
}

fn request(key: &str) -> ReserveRequest {
    ReserveRequest::new(test_scope("/v1/charges", key), test_fingerprint("{}"))
}

fn assert_unavailable<T: std::fmt::Debug>(
    what: &str,
    result: Result<idem_core::Result<T>, tokio::time::error::Elapsed>,
) {
    match result {
        Ok(Err(StoreError::Unavailable(_))) => {}
        Ok(other) => panic!("{what} during the outage must fail Unavailable, got {other:?}"),
        Err(_) => panic!("{what} hung for {HANG_GUARD:?} during the outage"),
    }
}

async fn acquire(store: &RedisStore, req: &ReserveRequest) -> Lease {
    match store.reserve(req).await.expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// Waits (bounded) for the reconnecting store to answer again.
async fn until_back(store: &RedisStore) {
    eventually("the store reconnected after the outage", WAIT, async || {
        store.ping().await.is_ok()
    })
    .await;
}

/// Every operation, while the relay is in `mode`, fails Unavailable; returns the
/// slowest operation's time.
async fn every_operation_fails(
    store: &RedisStore,
    completed: &ReserveRequest,
    running: &Lease,
    fresh: &ReserveRequest,
) -> Duration {
    let mut slowest = Duration::ZERO;
    macro_rules! check {
        ($what:expr, $op:expr) => {{
            let started = Instant::now();
            assert_unavailable($what, tokio::time::timeout(HANG_GUARD, $op).await);
            slowest = slowest.max(started.elapsed());
        }};
    }
    check!("reserve of a new key", store.reserve(fresh));
    check!("reserve of a completed key", store.reserve(completed));
    check!(
        "complete",
        store.complete(running, &StoredResponse::new(200, "late"))
    );
    check!("renew", store.renew(running, Duration::from_secs(60)));
    check!("release", store.release(running));
    check!("get", store.get(&completed.scope));
    check!("remove", store.remove(&completed.scope));
    check!("purge_expired", store.purge_expired(10));
    check!("ping", store.ping());
    slowest
}

async fn fails_closed_then_recovers(mode: RelayMode, case: &str) {
    let Some((relay, store, direct)) = setup(case).await else {
        return;
    };
    let completed = request("completed-key");
    let lease = acquire(&store, &completed).await;
    store
        .complete(&lease, &StoredResponse::new(201, "charged"))
        .await
        .expect("complete");
    let running_req = request("running-key");
    let running = acquire(&store, &running_req).await;
    let fresh = request("fresh-key");

    let failed_before = figure(&store, "idem_redis_failed_commands_total");
    relay.set_mode(mode);
    let slowest = every_operation_fails(&store, &completed, &running, &fresh).await;
    eprintln!("{mode:?}: the slowest operation failed after {slowest:?}");
    // Each of the nine operations failed at least once (the background release of a
    // reservation whose reply was lost may fail too, and add to it).
    let failed = figure(&store, "idem_redis_failed_commands_total") - failed_before;
    assert!(failed >= 9, "{failed} failed commands counted");
    if mode == RelayMode::Stall {
        // The reserve of the fresh key was sent, and timed out: it may have run.
        assert!(figure(&store, "idem_redis_unconfirmed_reservations_total") >= 1);
    }

    // Nothing was written while the store could not answer.
    assert!(direct.get(&fresh.scope).await.expect("get").is_none());
    let record = direct
        .get(&running_req.scope)
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(record.token, running.token);
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    assert!(
        direct
            .get(&completed.scope)
            .await
            .expect("get")
            .expect("kept")
            .is_completed()
    );

    relay.set_mode(RelayMode::Forward);
    until_back(&store).await;
    assert_eq!(
        store.reserve(&completed).await.expect("reserve"),
        Reservation::Replay(StoredResponse::new(201, "charged"))
    );
    acquire(&store, &fresh).await;
    store
        .complete(&running, &StoredResponse::new(200, "finished"))
        .await
        .expect("the running attempt completes after the outage");
    for req in [&completed, &running_req, &fresh] {
        direct.remove(&req.scope).await.expect("clean up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_fails_closed_then_recovers() {
    fails_closed_then_recovers(RelayMode::Refuse, "outage_down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_store_times_out_as_unavailable_then_recovers() {
    fails_closed_then_recovers(RelayMode::Stall, "outage_stalled").await;
}

/// Reservers keep going while the connection is cut under them. Whatever each one
/// was told, Redis agrees: an acquired lease always has its record, and a key whose
/// reserve failed is either untouched or held in progress (the reply was lost), never
/// executable twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cut_mid_flight_never_acquires_without_a_record() {
    let Some((relay, store, direct)) = setup("outage_mid_flight").await else {
        return;
    };
    const WORKERS: usize = 8;
    const MAX_PER_WORKER: usize = 5_000;
    let store = Arc::new(store);
    let succeeded = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (store, succeeded) = (store.clone(), succeeded.clone());
            tokio::spawn(async move {
                let mut acquired = Vec::new();
                for i in 0..MAX_PER_WORKER {
                    let req = request(&format!("mid-flight-{w}-{i}"));
                    match store.reserve(&req).await {
                        Ok(Reservation::Acquired(lease)) => {
                            succeeded.fetch_add(1, Ordering::Relaxed);
                            acquired.push(lease);
                        }
                        Ok(other) => panic!("a fresh key answered {other:?}"),
                        Err(StoreError::Unavailable(_)) => return (acquired, Some(req)),
                        Err(e) => panic!("unexpected error {e}"),
                    }
                }
                (acquired, None)
            })
        })
        .collect();
    while succeeded.load(Ordering::Relaxed) < 200 {
        tokio::task::yield_now().await;
    }
    relay.set_mode(RelayMode::Refuse);
    let mut leases = Vec::new();
    let mut failed = Vec::new();
    for w in workers {
        let (acquired, failed_req) = w.await.expect("worker");
        leases.extend(acquired);
        failed.push(failed_req.expect("every worker runs into the outage"));
    }

    for lease in &leases {
        let record = direct.get(&lease.scope).await.expect("get");
        let record = record.expect("an acquired lease has its record");
        assert_eq!(record.token, lease.token);
    }
    relay.set_mode(RelayMode::Forward);
    until_back(&store).await;
    let mut lost_replies = 0;
    for req in &failed {
        match store.reserve(req).await.expect("reserve after the outage") {
            // The reserve never reached Redis: the key is free.
            Reservation::Acquired(_) => {}
            // It ran, but its reply was lost: the key is held until the store's own
            // release of that reservation gets through (or the lease lapses).
            Reservation::InProgress { .. } => lost_replies += 1,
            other => panic!("a key whose reserve failed answered {other:?}"),
        }
    }
    eprintln!(
        "{} reservations acquired before the cut, {} failed at it ({lost_replies} had run)",
        leases.len(),
        failed.len()
    );
    for scope in leases
        .iter()
        .map(|l| &l.scope)
        .chain(failed.iter().map(|r| &r.scope))
    {
        direct.remove(scope).await.expect("clean up");
    }
}

/// A reserve that ran on Redis but whose reply was lost (the connection dropped after
/// the command was sent) does not hold its key for the whole lease: the store releases
/// the reservation it may have written by itself, fenced by the token it sent, and the
/// next reserve of the key acquires it. Nothing was executed under that reservation,
/// since the caller was told the store is unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_whose_reply_was_lost_does_not_hold_its_key() {
    let Some((relay, store, direct)) = setup("lost_reply").await else {
        return;
    };
    store.ping().await.expect("the relay works");

    let req = request("lost-reply");
    relay.lose_reply_to(b"lost-reply");
    let lost = tokio::time::timeout(HANG_GUARD, store.reserve(&req)).await;
    assert_unavailable("a reserve whose reply was lost", lost);
    assert_eq!(relay.replies_lost(), 1, "the SET's reply was the one lost");

    // The default lease is 60 s; without the release the key would be held that long.
    let deadline = Instant::now() + Duration::from_secs(30);
    while direct.get(&req.scope).await.expect("get").is_some() {
        assert!(
            Instant::now() < deadline,
            "the lost reservation still holds the key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lease = acquire(&store, &req).await;
    assert_eq!(lease.attempt, 1);
    direct.remove(&req.scope).await.expect("clean up");
}
