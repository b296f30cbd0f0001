//! Expiry and purge (SPEC S8).

use super::*;
use crate::Clock;

/// An expired record counts as absent: the key executes again, any payload.
pub async fn expired_record_counts_as_absent<S: Store>(store: S, clock: ManualClock) {
    let scope = test_scope("/v1/charges", "expiry-key");
    let req = request(&scope, r#"{"amount":1}"#);
    let lease = acquire(&store, &req).await;
    store.complete(&lease, &response()).await.expect("complete");
    clock.advance(TTL - Duration::from_secs(1));
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(response())
    );
    clock.advance(Duration::from_secs(1));
    let other = request(&scope, r#"{"amount":2}"#);
    let again = acquire(&store, &other).await;
    assert_eq!(again.attempt, 1);
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.fingerprint, test_fingerprint(r#"{"amount":2}"#));
    assert!(!record.is_completed());
    // The old attempt cannot write into the new record.
    assert_fenced(
        store
            .complete(&lease, &StoredResponse::new(200, "old"))
            .await,
        "complete after expiry",
    );
}

/// A TTL shorter than the lease (SPEC S8): the lease keeps a running attempt's record
/// alive past the TTL, but a completed record expires at its creation plus the TTL,
/// and purge removes it then.
pub async fn completed_record_expires_at_its_ttl_though_the_lease_is_longer<S: Store>(
    store: S,
    clock: ManualClock,
) {
    let ttl = Duration::from_secs(2);
    let short = |scope: &Scope| {
        ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
            .ttl(ttl)
            .lease(LEASE)
    };
    let start = clock.now();
    // Completed within the TTL: replayed until creation + TTL, then absent.
    let done = test_scope("/short-ttl", "completed");
    let lease = acquire(&store, &short(&done)).await;
    // Running past the TTL: still in progress, as its lease says.
    let running = test_scope("/short-ttl", "running");
    let running_lease = acquire(&store, &short(&running)).await;
    clock.advance(Duration::from_secs(1));
    store.complete(&lease, &response()).await.expect("complete");
    clock.advance(Duration::from_millis(999));
    assert_eq!(
        store.reserve(&short(&done)).await.expect("reserve"),
        Reservation::Replay(response())
    );
    let record = store.get(&done).await.expect("get").expect("stored");
    assert_eq!(record.expires_at, start.plus(ttl), "creation + TTL");
    clock.advance(Duration::from_millis(1));
    assert!(matches!(
        store.reserve(&short(&running)).await.expect("reserve"),
        Reservation::InProgress { .. }
    ));
    assert_eq!(
        store.purge_expired(100).await.expect("purge"),
        1,
        "the completed record, not the running one"
    );
    assert!(store.get(&done).await.expect("get").is_none());
    let again = acquire(&store, &short(&done)).await;
    assert_eq!((again.attempt, again.recovered()), (1, false));

    // An attempt that outlives the TTL is recorded, and its record expires at once:
    // the TTL is how long an answer is kept, counted from the first request.
    clock.advance(Duration::from_secs(30));
    store.renew(&running_lease, LEASE).await.expect("renew");
    store
        .complete(&running_lease, &response())
        .await
        .expect("complete past the TTL");
    let next = acquire(&store, &short(&running)).await;
    assert_eq!((next.attempt, next.recovered()), (1, false));
}

/// Purge deletes only expired records, at most `limit` per call.
pub async fn purge_removes_only_expired_in_bounded_batches<S: Store>(store: S, clock: ManualClock) {
    let short = Duration::from_secs(10);
    let mut old = Vec::new();
    for i in 0..25 {
        let scope = test_scope("/purge", &format!("old-{i}"));
        let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
            .ttl(short)
            .lease(Duration::from_secs(5));
        let lease = acquire(&store, &req).await;
        if i % 2 == 0 {
            store.complete(&lease, &response()).await.expect("complete");
        }
        old.push(scope);
    }
    let mut live = Vec::new();
    for i in 0..5 {
        let scope = test_scope("/purge", &format!("live-{i}"));
        let lease = acquire(&store, &request(&scope, "{}")).await;
        store.complete(&lease, &response()).await.expect("complete");
        live.push(scope);
    }
    assert_eq!(
        store.purge_expired(100).await.expect("purge"),
        0,
        "nothing expired yet"
    );
    clock.advance(short);
    let mut purged = 0;
    let mut calls = 0;
    loop {
        let n = store.purge_expired(10).await.expect("purge");
        assert!(n <= 10, "a batch removed {n} > 10 records");
        purged += n;
        calls += 1;
        if n == 0 {
            break;
        }
        assert!(calls < 100, "purge does not converge");
    }
    assert_eq!(purged, 25);
    assert!(
        calls >= 3,
        "25 records in batches of 10 take at least 3 calls"
    );
    for s in &old {
        assert!(
            store.get(s).await.expect("get").is_none(),
            "{s:?} not purged"
        );
    }
    for s in &live {
        assert!(
            store.get(s).await.expect("get").is_some(),
            "{s:?} purged too early"
        );
    }
}
