//! Leases (SPEC S7): in progress while live, taken over once lapsed, fenced by token.

use super::*;
use crate::RecordState;

/// A live lease answers in progress, asking to wait as long as the record has
/// existed (at least a second) but no longer than the lease has left, rounded up to
/// seconds.
pub async fn live_lease_is_in_progress_with_retry_after<S: Store>(store: S, clock: ManualClock) {
    let scope = test_scope("/v1/charges", "busy-key");
    let req = request(&scope, "{}");
    acquire(&store, &req).await;
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::InProgress {
            retry_after: Duration::from_secs(1)
        }
    );
    clock.advance(Duration::from_millis(4_200));
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::InProgress {
            retry_after: Duration::from_secs(5)
        }
    );
    clock.advance(Duration::from_millis(46_300));
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::InProgress {
            retry_after: Duration::from_secs(10)
        }
    );
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert!(matches!(record.state, RecordState::InProgress { .. }));
}

/// A lapsed lease is taken over as attempt n+1, marked recovered, with a new token.
pub async fn expired_lease_is_taken_over_as_next_attempt<S: Store>(store: S, clock: ManualClock) {
    use crate::Clock;
    let scope = test_scope("/v1/charges", "takeover-key");
    let req = request(&scope, "{}");
    let start = clock.now();
    let first = acquire(&store, &req).await;
    assert!(!first.recovered());
    clock.advance(LEASE);
    let second = acquire(&store, &req).await;
    assert_eq!(second.attempt, 2);
    assert!(second.recovered());
    assert_ne!(second.token, first.token);
    clock.advance(LEASE + Duration::from_secs(1));
    let third = acquire(&store, &req).await;
    assert_eq!(third.attempt, 3);
    store.complete(&third, &response()).await.expect("complete");
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.attempt, 3);
    // Takeover keeps the creation time: expiry counts from the first attempt.
    assert_eq!(record.created_at, start);
    assert_eq!(record.expires_at, start.plus(TTL));
}

/// The attempt whose lease was taken over cannot complete, renew or release; the
/// new attempt's record is untouched.
pub async fn stale_token_cannot_complete_renew_or_release<S: Store>(store: S, clock: ManualClock) {
    let scope = test_scope("/v1/charges", "fence-key");
    let req = request(&scope, "{}");
    let stale = acquire(&store, &req).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let current = acquire(&store, &req).await;
    assert_fenced(
        store
            .complete(&stale, &StoredResponse::new(500, "late"))
            .await,
        "complete",
    );
    assert_fenced(store.renew(&stale, LEASE).await, "renew");
    assert_fenced(store.release(&stale).await, "release");
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.token, current.token);
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    store
        .complete(&current, &response())
        .await
        .expect("complete");
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(response())
    );
    // A forged token is no better than a stale one.
    let forged = Lease {
        token: crate::FencingToken::generate(),
        ..current
    };
    assert_fenced(store.release(&forged).await, "release");
}

/// Renewal pushes the lease out, so a running attempt is not taken over.
pub async fn renew_extends_the_lease<S: Store>(store: S, clock: ManualClock) {
    let scope = test_scope("/v1/charges", "renew-key");
    let req = request(&scope, "{}");
    let lease = acquire(&store, &req).await;
    for _ in 0..3 {
        clock.advance(Duration::from_secs(50));
        store.renew(&lease, LEASE).await.expect("renew");
    }
    clock.advance(Duration::from_secs(50));
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::InProgress {
            retry_after: Duration::from_secs(10)
        }
    );
    store.complete(&lease, &response()).await.expect("complete");
    assert_fenced(store.renew(&lease, LEASE).await, "renew after complete");
}

/// A released key executes again as a fresh first attempt.
pub async fn release_lets_the_key_execute_again<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/charges", "release-key");
    let req = request(&scope, r#"{"amount":1}"#);
    let lease = acquire(&store, &req).await;
    store.release(&lease).await.expect("release");
    assert!(store.get(&scope).await.expect("get").is_none());
    // Even a corrected payload may now use the key.
    let corrected = request(&scope, r#"{"amount":2}"#);
    let again = acquire(&store, &corrected).await;
    assert_eq!(again.attempt, 1);
    assert!(!again.recovered());
    assert_ne!(again.token, lease.token);
}
