//! Tombstones after expiry (SPEC S16).

use super::*;
use crate::{Clock, RecordState, Timestamp};

/// How long the cases' tombstones outlive their records.
const TOMBSTONE: Duration = Duration::from_secs(7 * 24 * 3600);

fn with_tombstone(scope: &Scope, body: &str) -> ReserveRequest {
    request(scope, body).tombstone(TOMBSTONE)
}

/// Completes a record kept with a tombstone, one second after it was reserved; returns
/// its lease and when it completed.
async fn complete_one<S: Store>(
    store: &S,
    clock: &ManualClock,
    scope: &Scope,
) -> (Lease, Timestamp) {
    let lease = acquire(store, &with_tombstone(scope, r#"{"amount":1}"#)).await;
    assert_eq!(lease.tombstone, TOMBSTONE);
    clock.advance(Duration::from_secs(1));
    let completed_at = clock.now();
    store.complete(&lease, &response()).await.expect("complete");
    (lease, completed_at)
}

/// After a completed record's TTL its tombstone refuses the same payload with `Gone`
/// (when it completed, with what status) and a different one with `Mismatch`, before
/// and after a purge has compacted it into a tombstone without its answer; once the
/// tombstone's own TTL is over, a purge deletes it and the key executes afresh.
pub async fn tombstone_refuses_a_retry_after_expiry<S: Store>(store: S, clock: ManualClock) {
    let scope = test_scope("/v1/charges", "tombstone-key");
    let created = clock.now();
    let (lease, completed_at) = complete_one(&store, &clock, &scope).await;
    let same = with_tombstone(&scope, r#"{"amount":1}"#);
    let other = with_tombstone(&scope, r#"{"amount":2}"#);
    // Not yet expired: replayed as usual.
    clock.advance(TTL - Duration::from_secs(2));
    assert_eq!(
        store.reserve(&same).await.expect("reserve"),
        Reservation::Replay(response())
    );
    clock.advance(Duration::from_secs(1));
    let gone = Reservation::Gone {
        completed_at,
        status: 201,
    };
    assert_eq!(store.reserve(&same).await.expect("reserve"), gone);
    assert_eq!(
        store.reserve(&other).await.expect("reserve"),
        Reservation::Mismatch
    );

    // A purge keeps it, compacted: no answer, only the completion.
    store.purge_expired(100).await.expect("purge");
    let tombstone = store.get(&scope).await.expect("get").expect("kept");
    assert_eq!(
        tombstone.state,
        RecordState::Tombstone {
            completed_at,
            status: 201
        },
        "a purged record leaves its tombstone, without body or headers"
    );
    assert_eq!(tombstone.expires_at, created.plus(TTL).plus(TOMBSTONE));
    assert_eq!(tombstone.fingerprint, test_fingerprint(r#"{"amount":1}"#));
    // Listings are of records to reconcile: a tombstone is not one.
    let listed = store.list(&crate::ListQuery::new()).await.expect("list");
    assert!(
        listed.records.iter().all(|r| r.scope != scope),
        "{listed:?}"
    );
    assert_eq!(store.reserve(&same).await.expect("reserve"), gone);
    assert_eq!(
        store.reserve(&other).await.expect("reserve"),
        Reservation::Mismatch
    );
    // The attempt that completed it cannot write to its tombstone.
    assert_fenced(
        store
            .complete(&lease, &StoredResponse::new(200, "again"))
            .await,
        "complete of a tombstone",
    );
    assert_fenced(store.release(&lease).await, "release of a tombstone");
    assert_fenced(store.renew(&lease, LEASE).await, "renew of a tombstone");
    assert_eq!(store.reserve(&same).await.expect("reserve"), gone);

    // Just before its end it still refuses; at its end a purge deletes it.
    clock.advance(TOMBSTONE - Duration::from_millis(1));
    assert_eq!(store.reserve(&same).await.expect("reserve"), gone);
    clock.advance(Duration::from_millis(1));
    assert!(store.purge_expired(100).await.expect("purge") >= 1);
    assert!(store.get(&scope).await.expect("get").is_none());
    let again = acquire(&store, &other).await;
    assert_eq!(again.attempt, 1);
}

/// A tombstone that no purge has reached is over at its end all the same: the key
/// executes afresh, as attempt 1, with any payload.
pub async fn a_lapsed_tombstone_counts_as_absent<S: Store>(store: S, clock: ManualClock) {
    let scope = test_scope("/v1/charges", "lapsed-tombstone");
    complete_one(&store, &clock, &scope).await;
    clock.advance(TTL + TOMBSTONE);
    let again = acquire(&store, &with_tombstone(&scope, r#"{"amount":2}"#)).await;
    assert_eq!(again.attempt, 1);
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    assert_eq!(record.fingerprint, test_fingerprint(r#"{"amount":2}"#));
}

/// An operator's removal deletes the tombstone too, and a record kept without one
/// leaves nothing behind after expiry.
pub async fn removing_a_tombstone_lets_the_key_execute_again<S: Store>(
    store: S,
    clock: ManualClock,
) {
    let scope = test_scope("/v1/charges", "removed-tombstone");
    complete_one(&store, &clock, &scope).await;
    let plain = test_scope("/v1/charges", "no-tombstone");
    let lease = acquire(&store, &request(&plain, "{}")).await;
    assert_eq!(lease.tombstone, Duration::ZERO);
    store.complete(&lease, &response()).await.expect("complete");
    clock.advance(TTL);
    assert!(matches!(
        store
            .reserve(&with_tombstone(&scope, r#"{"amount":1}"#))
            .await
            .expect("reserve"),
        Reservation::Gone { .. }
    ));
    store.purge_expired(100).await.expect("purge");
    assert!(store.get(&plain).await.expect("get").is_none());
    assert!(store.remove(&scope).await.expect("remove"));
    assert!(store.get(&scope).await.expect("get").is_none());
    let again = acquire(&store, &with_tombstone(&scope, r#"{"amount":1}"#)).await;
    assert_eq!(again.attempt, 1);
}
