//! What a duplicate waiting for an attempt hears (SPEC S15): a watch made before a
//! completion, a release or a removal fires after it, and only for its own scope.
//!
//! A store that cannot tell (its [`Store::watch`] is [`Watch::poll`], as on a Redis
//! Cluster) has its waiters poll; for it these cases check only what the reserve after
//! the change answers.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use super::*;
use crate::Watch;

/// Long enough for a notification to cross a loaded shared server; a store whose watch
/// never fires fails here rather than hanging.
const HEARD_WITHIN: Duration = Duration::from_secs(10);

async fn heard(watch: Watch, what: &str) {
    if !watch.notifies() {
        return;
    }
    tokio::time::timeout(HEARD_WITHIN, watch)
        .await
        .unwrap_or_else(|_| panic!("no watch fired within {HEARD_WITHIN:?} of a record {what}"));
}

/// Whether `watch` has fired, without waiting for it.
fn fired_yet(watch: &mut Watch) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(pin!(watch).poll(&mut cx), Poll::Ready(()))
}

/// A watch made while the attempt runs fires when it completes, and the reserve after
/// it replays the answer.
pub async fn watch_fires_when_the_record_completes<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/charges", "watch-complete");
    let req = request(&scope, "{}");
    let lease = acquire(&store, &req).await;
    let watch = store.watch(&scope);
    store.complete(&lease, &response()).await.expect("complete");
    heard(watch, "completed").await;
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(response())
    );
}

/// A watch fires when the attempt releases the key, and the reserve after it acquires
/// the key as the next attempt.
pub async fn watch_fires_when_the_record_is_released<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/charges", "watch-release");
    let req = request(&scope, "{}");
    let lease = acquire(&store, &req).await;
    let watch = store.watch(&scope);
    store.release(&lease).await.expect("release");
    heard(watch, "released").await;
    assert!(matches!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Acquired(_)
    ));
}

/// A watch fires when an operator removes the record.
pub async fn watch_fires_when_the_record_is_removed<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/charges", "watch-remove");
    let req = request(&scope, "{}");
    acquire(&store, &req).await;
    let watch = store.watch(&scope);
    assert!(store.remove(&scope).await.expect("remove"));
    heard(watch, "removed").await;
}

/// Completing one scope fires no watch on another.
pub async fn watch_fires_for_its_own_scope_only<S: Store>(store: S, _clock: ManualClock) {
    let (a, b) = (
        test_scope("/v1/charges", "watch-a"),
        test_scope("/v1/charges", "watch-b"),
    );
    let (ra, rb) = (request(&a, "{}"), request(&b, "{}"));
    let (la, lb) = (acquire(&store, &ra).await, acquire(&store, &rb).await);
    let watch_a = store.watch(&a);
    let mut watch_b = store.watch(&b);
    store.complete(&la, &response()).await.expect("complete a");
    heard(watch_a, "completed").await;
    // Notifications of one store arrive in the order it sent them.
    assert!(
        !watch_b.notifies() || !fired_yet(&mut watch_b),
        "b's watch fired for a's completion"
    );
    store.complete(&lb, &response()).await.expect("complete b");
    heard(watch_b, "completed").await;
}
