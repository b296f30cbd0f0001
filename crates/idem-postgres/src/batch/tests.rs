//! The drainers' count as operations come and go, lingering included, on tokio's
//! paused clock.

use std::time::Duration;

use idem_core::testing::test_fingerprint;
use idem_core::{Endpoint, FencingToken, Key, ReserveRequest, Scope, ScopeMode, Tenant};
use tokio::sync::oneshot;

use super::*;

const LINGER: Duration = Duration::from_millis(2);

fn batcher(in_flight: usize) -> Batcher {
    Batcher::new(
        BatchConfig {
            max_batch: 64,
            in_flight,
        },
        "idem_records",
    )
}

/// A release, and the receiver that keeps it wanted.
fn op(i: usize) -> (Op, oneshot::Receiver<Answer<()>>) {
    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::new("t"),
        Endpoint::new("POST", "/x"),
        Key::new(format!("k{i}")).unwrap(),
    );
    let lease =
        ReserveRequest::new(scope, test_fingerprint("{}")).lease_for(FencingToken::generate(), 1);
    let (reply, answer) = oneshot::channel();
    (Op::Release(ReleaseOp { lease, reply }), answer)
}

fn counts(b: &Batcher) -> (usize, usize, usize) {
    let q = b.queue();
    (q.running, q.lingering, q.idle)
}

#[tokio::test(start_paused = true)]
async fn a_lingering_drainer_takes_the_next_operation_and_stops_when_none_comes() {
    let b = batcher(2);
    let (first, _a) = op(1);
    assert!(b.push(first).1, "the first operation starts a drainer");
    assert_eq!(b.take().len(), 1);
    assert!(b.take().is_empty());
    assert!(matches!(b.empty(true), Empty::Linger));
    assert_eq!(counts(&b), (1, 1, 1));

    // The next operation wakes it, and starts no drainer.
    let (second, _b) = op(2);
    assert!(!b.push(second).1);
    assert_eq!(counts(&b), (1, 1, 0));
    let start = tokio::time::Instant::now();
    assert!(b.woken(LINGER).await);
    assert_eq!(start.elapsed(), Duration::ZERO, "woken at once");
    assert_eq!(counts(&b), (1, 0, 0));
    assert_eq!(b.take().len(), 1);

    // Nothing comes: it stops once the moment has passed, and the next operation
    // starts a drainer again.
    assert!(matches!(b.empty(true), Empty::Linger));
    assert!(!b.woken(LINGER).await);
    assert_eq!(start.elapsed(), LINGER);
    assert_eq!(counts(&b), (0, 0, 0));
    let (third, _c) = op(3);
    assert!(b.push(third).1);
}

#[tokio::test(start_paused = true)]
async fn a_drainer_that_may_not_linger_stops_and_one_that_missed_an_operation_takes_it() {
    let b = batcher(1);
    let (first, _a) = op(1);
    assert!(b.push(first).1);
    assert_eq!(b.take().len(), 1);
    // Queued while it wrote, with no room for another drainer.
    let (second, _b) = op(2);
    assert!(!b.push(second).1);
    assert!(matches!(b.empty(true), Empty::TakeAgain));
    assert_eq!(b.take().len(), 1);
    assert!(matches!(b.empty(false), Empty::Stop));
    assert_eq!(counts(&b), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn one_claim_among_two_lingering_drainers_is_answered_once() {
    let b = batcher(2);
    let (first, _a) = op(1);
    let (second, _b) = op(2);
    assert!(b.push(first).1);
    assert!(b.push(second).1);
    assert_eq!(b.take().len(), 2);
    assert!(b.take().is_empty());
    assert!(matches!(b.empty(true), Empty::Linger));
    assert!(matches!(b.empty(true), Empty::Linger));
    assert_eq!(counts(&b), (2, 2, 2));

    let (third, _c) = op(3);
    assert!(!b.push(third).1);
    // Both wait at once: one is woken for the operation, the other stops when the
    // moment passes.
    let (x, y) = tokio::join!(b.woken(LINGER), b.woken(LINGER));
    assert!(x ^ y, "exactly one takes the operation: {x} {y}");
    assert_eq!(counts(&b), (1, 0, 0));
    assert_eq!(b.take().len(), 1);
}
