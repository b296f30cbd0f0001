//! Many callers at once on one key: exactly one of them wins.

use std::sync::Arc;

use super::*;

/// 64 tasks reserve one key at once: exactly one acquires; every other sees the
/// record in progress.
pub async fn concurrent_reservers_exactly_one_wins<S: Store>(store: S, _clock: ManualClock) {
    let store = Arc::new(store);
    let scope = test_scope("/race", "race-key");
    let req = request(&scope, r#"{"amount":100}"#);
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, req, barrier) = (store.clone(), req.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.reserve(&req).await.expect("reserve")
            })
        })
        .collect();
    let mut acquired = 0;
    let mut in_progress = 0;
    for t in tasks {
        match t.await.expect("task") {
            Reservation::Acquired(l) => {
                assert_eq!(l.attempt, 1);
                acquired += 1;
            }
            Reservation::InProgress { retry_after } => {
                assert!(retry_after >= Duration::from_secs(1));
                in_progress += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acquired, 1, "exactly one reserver may win");
    assert_eq!(in_progress, 63);
}

/// After the lease lapses, 64 tasks race to take over: exactly one gets attempt 2.
pub async fn concurrent_takeover_exactly_one_wins<S: Store>(store: S, clock: ManualClock) {
    let store = Arc::new(store);
    let scope = test_scope("/race", "takeover-key");
    let req = request(&scope, "{}");
    acquire(&*store, &req).await;
    clock.advance(LEASE + Duration::from_millis(1));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, req, barrier) = (store.clone(), req.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.reserve(&req).await.expect("reserve")
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Reservation::Acquired(l) => winners.push(l),
            Reservation::InProgress { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one taker-over may win");
    assert_eq!(winners[0].attempt, 2);
    assert!(winners[0].recovered());
}
