//! What names a record, what an operator sees of it, and the secret kept beside the records.

use std::collections::HashSet;
use std::sync::Arc;

use super::*;
use crate::{Endpoint, Key, RecordState, ScopeMode, Tenant};

/// The same key under two tenants, or two endpoints in public mode, names two
/// records; in internal mode two endpoints share one.
pub async fn scopes_never_collide<S: Store>(store: S, _clock: ManualClock) {
    let key = Key::new("shared-key").expect("key");
    let a = Tenant::new(format!("a-{:x}", getrandom::u64().unwrap_or(1)));
    let b = Tenant::new(format!("b-{:x}", getrandom::u64().unwrap_or(2)));
    let ep1 = Endpoint::new("POST", "/v1/orders");
    let ep2 = Endpoint::new("POST", "/v1/refunds");
    let scopes = [
        Scope::new(ScopeMode::Public, a.clone(), ep1.clone(), key.clone()),
        Scope::new(ScopeMode::Public, b.clone(), ep1.clone(), key.clone()),
        Scope::new(ScopeMode::Public, a.clone(), ep2.clone(), key.clone()),
        Scope::new(ScopeMode::Internal, a.clone(), ep1.clone(), key.clone()),
    ];
    let mut tokens = HashSet::new();
    for (i, scope) in scopes.iter().enumerate() {
        let lease = acquire(&store, &request(scope, "{}")).await;
        tokens.insert(lease.token);
        let resp = StoredResponse::new(200, format!("answer {i}"));
        store.complete(&lease, &resp).await.expect("complete");
    }
    assert_eq!(tokens.len(), 4);
    for (i, scope) in scopes.iter().enumerate() {
        assert_eq!(
            store.reserve(&request(scope, "{}")).await.expect("reserve"),
            Reservation::Replay(StoredResponse::new(200, format!("answer {i}"))),
            "{scope:?} must see only its own answer"
        );
    }
    let internal_other_endpoint = Scope::new(ScopeMode::Internal, a, ep2, key);
    assert_eq!(
        store
            .reserve(&request(&internal_other_endpoint, "{}"))
            .await
            .expect("reserve"),
        Reservation::Replay(StoredResponse::new(200, "answer 3"))
    );
}

/// `get` shows every field of a record; `remove` deletes it whatever its state.
pub async fn get_and_remove_show_and_delete_records<S: Store>(store: S, clock: ManualClock) {
    use crate::Clock;
    let scope = test_scope("/v1/charges", "inspect-key");
    assert!(store.get(&scope).await.expect("get").is_none());
    assert!(!store.remove(&scope).await.expect("remove"));
    let start = clock.now();
    let lease = acquire(&store, &request(&scope, r#"{"a":1}"#)).await;
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.scope, scope);
    assert_eq!(record.fingerprint, test_fingerprint(r#"{"a":1}"#));
    assert_eq!(record.created_at, start);
    assert_eq!(record.expires_at, start.plus(TTL));
    assert_eq!(record.attempt, 1);
    assert_eq!(record.token, lease.token);
    assert_eq!(
        record.state,
        RecordState::InProgress {
            lease_until: start.plus(LEASE)
        }
    );
    clock.advance(Duration::from_secs(3));
    store.complete(&lease, &response()).await.expect("complete");
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: response(),
            completed_at: start.plus(Duration::from_secs(3))
        }
    );
    assert!(store.remove(&scope).await.expect("remove"));
    assert!(store.get(&scope).await.expect("get").is_none());
    assert_fenced(
        store.complete(&lease, &response()).await,
        "complete after remove",
    );
}

/// 32 tasks offer different secrets under one name at once: every one gets the same
/// value back, one of those offered, and later callers get it too. A purge after
/// every record's expiry leaves it, and another name is a secret of its own.
pub async fn secret_is_stored_once_and_never_purged<S: Store>(store: S, clock: ManualClock) {
    let store = Arc::new(store);
    let name = crate::TENANT_SECRET_NAME;
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let candidates: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 32]).collect();
    let tasks: Vec<_> = candidates
        .iter()
        .cloned()
        .map(|candidate| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .init_secret(name, &candidate)
                    .await
                    .expect("init_secret")
            })
        })
        .collect();
    let mut got = HashSet::new();
    for t in tasks {
        got.insert(t.await.expect("task"));
    }
    assert_eq!(got.len(), 1, "callers at once got different secrets");
    let stored = got.into_iter().next().expect("one secret");
    assert!(candidates.contains(&stored), "the secret is one offered");
    assert_eq!(
        store.init_secret(name, &[0xff; 32]).await.expect("again"),
        stored,
        "a later caller gets the stored secret"
    );
    let other = store
        .init_secret("other", &[0xee; 40])
        .await
        .expect("other");
    assert_eq!(other, vec![0xee; 40], "another name is its own secret");

    let lease = acquire(&*store, &request(&test_scope("/secret", "k"), "{}")).await;
    store.complete(&lease, &response()).await.expect("complete");
    clock.advance(TTL * 3);
    while store.purge_expired(100).await.expect("purge") > 0 {}
    assert_eq!(
        store
            .init_secret(name, &[0xfe; 32])
            .await
            .expect("after purge"),
        stored,
        "a purge deleted the secret"
    );
}

/// A store that keeps rate buckets for every instance ([`Store::take_rate_token`]
/// answers `Some`) gives exactly a bucket's burst to callers at once, refills it at the
/// rate by its clock, keeps each bucket apart, and never lists a bucket as a record. A
/// store that answers `None` leaves buckets to each process, which is allowed.
pub async fn rate_buckets_give_their_burst_then_their_rate<S: Store>(store: S, clock: ManualClock) {
    let rate = crate::KeyRate::new(2.0, 5).expect("a rate");
    let bucket = format!("hmac-sha256:{:016x}", getrandom::u64().unwrap_or(0));
    let Some(_) = store
        .take_rate_token("probe-only", &rate)
        .await
        .expect("take")
    else {
        return;
    };
    let store = Arc::new(store);
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (store, bucket) = (store.clone(), bucket.clone());
            tokio::spawn(async move { store.take_rate_token(&bucket, &rate).await })
        })
        .collect();
    let mut taken = 0;
    for t in tasks {
        taken += usize::from(t.await.expect("task").expect("take") == Some(true));
    }
    assert_eq!(taken, 5, "12 callers at once on a bucket of 5");
    clock.advance(Duration::from_millis(499));
    assert_eq!(
        store.take_rate_token(&bucket, &rate).await.unwrap(),
        Some(false)
    );
    clock.advance(Duration::from_millis(2));
    assert_eq!(
        store.take_rate_token(&bucket, &rate).await.unwrap(),
        Some(true),
        "one token back after half a second at 2/s"
    );
    let other = format!("{bucket}-other");
    assert_eq!(
        store.take_rate_token(&other, &rate).await.unwrap(),
        Some(true)
    );
    let page = store
        .list(&crate::ListQuery::new().with_limit(100))
        .await
        .expect("list");
    assert!(page.records.is_empty(), "a bucket is no record: {page:?}");
}
