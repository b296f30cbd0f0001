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
                assert_eq!(l.attempt, 1, "a first reservation is attempt 1");
                acquired += 1;
            }
            Reservation::InProgress { retry_after } => {
                assert!(
                    retry_after >= Duration::from_secs(1),
                    "Retry-After {retry_after:?} is under a second"
                );
                in_progress += 1;
            }
            other => panic!("a reservation racing on one fresh scope answered {other:?}"),
        }
    }
    assert!(
        acquired == 1,
        "{acquired} of 64 concurrent reservations of one scope won; exactly one may"
    );
    assert_eq!(in_progress, 63, "the 63 others see the record in progress");
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
            other => panic!("a takeover racing on one lapsed lease answered {other:?}"),
        }
    }
    assert!(
        winners.len() == 1,
        "{} of 64 concurrent takeovers of one lapsed lease won; exactly one may",
        winners.len()
    );
    assert_eq!(winners[0].attempt, 2, "the takeover is attempt 2");
    assert!(winners[0].recovered(), "the takeover is marked recovered");
}
