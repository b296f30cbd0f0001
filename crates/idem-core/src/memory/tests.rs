//! Tests of the in-memory store's own behaviour (its bound, eviction, purging across
//! shards); the store contract suite runs against it in `tests/contract.rs`.

use super::*;
use crate::testing::{test_fingerprint, test_scope};
use crate::{Clock, ManualClock};

fn request(scope: &Scope) -> ReserveRequest {
    ReserveRequest::new(scope.clone(), test_fingerprint("{}")).ttl(Duration::from_secs(60))
}

async fn acquire(store: &MemoryStore, scope: &Scope) -> Lease {
    match store.reserve(&request(scope)).await.unwrap() {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire {scope:?}, got {other:?}"),
    }
}

/// Reserves `req`, which must acquire, and completes it.
async fn execute(store: &MemoryStore, req: &ReserveRequest) {
    let Reservation::Acquired(lease) = store.reserve(req).await.unwrap() else {
        panic!("{:?} is new", req.scope)
    };
    store
        .complete(&lease, &StoredResponse::new(201, "{}"))
        .await
        .unwrap();
}

async fn executed(store: &MemoryStore, scope: &Scope) {
    execute(store, &request(scope)).await;
}

#[tokio::test]
async fn a_full_store_drops_expired_then_the_completed_record_closest_to_expiry() {
    let clock = ManualClock::starting_now();
    let store = MemoryStore::with_clock(Arc::new(clock.clone())).max_entries(3);
    let scopes: Vec<Scope> = (0..6).map(|i| test_scope("/x", &format!("k{i}"))).collect();
    // k0 expires first; k1 is completed; k2 stays in progress.
    let short = request(&scopes[0])
        .ttl(Duration::from_secs(5))
        .lease(Duration::from_secs(1));
    execute(&store, &short).await;
    clock.advance(Duration::from_secs(1));
    executed(&store, &scopes[1]).await;
    acquire(&store, &scopes[2]).await;

    clock.advance(Duration::from_secs(5));
    executed(&store, &scopes[3]).await;
    assert!(
        store.get(&scopes[0]).await.unwrap().is_none(),
        "k0 had expired"
    );
    assert_eq!(store.len(), 3);
    assert_eq!(evictions(&store), 0, "an expired record is no loss");

    // No expired record left: the completed one closest to expiry goes, k1 before k3.
    executed(&store, &scopes[4]).await;
    assert!(store.get(&scopes[1]).await.unwrap().is_none());
    assert!(store.get(&scopes[3]).await.unwrap().is_some());
    assert!(
        store.get(&scopes[2]).await.unwrap().is_some(),
        "in progress"
    );
    assert_eq!(store.len(), 3);
    assert_eq!(evictions(&store), 1);
    let figures: Vec<(&str, u64)> = store.metrics().iter().map(|m| (m.name, m.value)).collect();
    assert_eq!(
        figures,
        [
            ("idem_memory_records", 3),
            ("idem_memory_max_records", 3),
            ("idem_memory_evictions_total", 1)
        ]
    );
}

fn evictions(store: &MemoryStore) -> u64 {
    store.shards.evictions.load(Ordering::Relaxed)
}

#[tokio::test]
async fn a_store_full_of_records_in_progress_refuses_rather_than_evict_one() {
    let store = MemoryStore::new().max_entries(2);
    let a = test_scope("/x", "a");
    let b = test_scope("/x", "b");
    acquire(&store, &a).await;
    acquire(&store, &b).await;
    let refused = store.reserve(&request(&test_scope("/x", "c"))).await;
    assert!(matches!(refused, Err(StoreError::Full)), "{refused:?}");
    assert!(store.get(&a).await.unwrap().is_some());
    assert!(store.get(&b).await.unwrap().is_some());
}

#[tokio::test]
async fn a_sharded_store_holds_its_bound_and_never_evicts_a_record_in_progress() {
    let store = MemoryStore::new().max_entries(8192);
    assert_eq!(store.shards.shards.len(), 8);
    let in_progress: Vec<Scope> = (0..100)
        .map(|i| test_scope("/x", &format!("p{i}")))
        .collect();
    for scope in &in_progress {
        acquire(&store, scope).await;
    }
    // About 2 500 arrivals per shard, each bounded to 1 024: every shard fills.
    for i in 0..20_000 {
        executed(&store, &test_scope("/x", &format!("c{i}"))).await;
    }
    assert_eq!(store.len(), 8192);
    for scope in &in_progress {
        let record = store.get(scope).await.unwrap();
        assert!(
            record.is_some_and(|r| !r.is_completed()),
            "{scope:?} was evicted"
        );
    }
}

#[tokio::test]
async fn setting_the_bound_keeps_the_records_held() {
    let store = MemoryStore::new().max_entries(4);
    let done = test_scope("/x", "done");
    executed(&store, &done).await;
    let running = test_scope("/x", "running");
    let lease = acquire(&store, &running).await;

    let store = store.max_entries(50_000);
    assert_eq!(store.len(), 2);
    let again = store.reserve(&request(&done)).await.unwrap();
    assert!(matches!(again, Reservation::Replay(_)), "{again:?}");
    store
        .complete(&lease, &StoredResponse::new(200, "{}"))
        .await
        .unwrap();
    assert!(store.get(&running).await.unwrap().unwrap().is_completed());
}

#[tokio::test]
async fn purging_spans_the_shards_and_stops_at_the_limit() {
    let clock = ManualClock::starting_now();
    let store = MemoryStore::with_clock(Arc::new(clock.clone())).max_entries(100_000);
    for i in 0..300 {
        executed(&store, &test_scope("/x", &format!("k{i}"))).await;
    }
    clock.advance(Duration::from_secs(61));
    assert_eq!(store.purge_expired(250).await.unwrap(), 250);
    assert_eq!(store.len(), 50);
    assert_eq!(store.purge_expired(250).await.unwrap(), 50);
    assert!(store.is_empty());
}

#[tokio::test]
async fn purging_takes_the_records_that_expired_first_across_the_shards() {
    let clock = ManualClock::starting_now();
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let scopes: Vec<Scope> = (0..300)
        .map(|i| test_scope("/x", &format!("k{i}")))
        .collect();
    // Three expiry times, a hundred records each, over all the shards.
    for (i, scope) in scopes.iter().enumerate() {
        let ttl = Duration::from_secs(10 * (1 + i as u64 % 3));
        execute(
            &store,
            &request(scope).ttl(ttl).lease(Duration::from_secs(1)),
        )
        .await;
    }
    clock.advance(Duration::from_secs(60));

    // The hundred that expired first, then fifty of those that expired next, in
    // scope order.
    assert_eq!(store.purge_expired(150).await.unwrap(), 150);
    let mut second: Vec<&Scope> = scopes.iter().skip(1).step_by(3).collect();
    second.sort();
    for (i, scope) in scopes.iter().enumerate() {
        let kept = match i % 3 {
            0 => false,
            1 => !second[..50].contains(&scope),
            _ => true,
        };
        let held = store.get(scope).await.unwrap().is_some();
        assert_eq!(held, kept, "record {i}");
    }
    assert_eq!(store.purge_expired(1_000).await.unwrap(), 150);
    assert!(store.is_empty());
}

#[tokio::test]
async fn takeover_that_keeps_the_expiry_stays_purgeable() {
    let clock = ManualClock::starting_now();
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let req = ReserveRequest::new(test_scope("/x", "k"), test_fingerprint("{}"))
        .ttl(Duration::from_secs(90))
        .lease(Duration::from_secs(30));
    let expires_at = req.expires_at(clock.now());
    assert!(store.reserve(&req).await.unwrap().lease().is_some());
    clock.advance(Duration::from_secs(30));
    let Reservation::Acquired(l) = store.reserve(&req).await.unwrap() else {
        panic!("lapsed lease is taken over")
    };
    assert_eq!(l.attempt, 2);
    let record = store.get(&req.scope).await.unwrap().unwrap();
    assert_eq!(
        record.expires_at, expires_at,
        "the takeover kept the expiry"
    );
    clock.set(expires_at);
    assert_eq!(store.purge_expired(10).await.unwrap(), 1);
    assert!(store.is_empty());
}
