//! What a completed record answers: the stored response, byte for byte, to the same payload only.

use bytes::Bytes;

use super::*;

/// A completed record replays status, headers and body byte for byte.
pub async fn replays_completed_response<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/charges", "replay-key");
    let req = request(&scope, r#"{"amount":100}"#);
    let lease = acquire(&store, &req).await;
    store.complete(&lease, &response()).await.expect("complete");
    for _ in 0..2 {
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::Replay(response())
        );
    }
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert!(record.is_completed());
    assert_eq!(record.attempt, 1);
    assert_eq!(record.token, lease.token);
}

/// A 1 MiB body of every byte value survives storage unchanged.
pub async fn large_binary_body_round_trips<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/blob", "blob-key");
    let req = request(&scope, "{}");
    let lease = acquire(&store, &req).await;
    let body: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let resp = StoredResponse {
        status: 200,
        headers: vec![("x-bin".into(), Bytes::from_static(&[0, 0xff, b'\r', b'\n']))],
        body: Bytes::from(body),
        meta: Default::default(),
    };
    store.complete(&lease, &resp).await.expect("complete");
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(resp)
    );
}

/// An answer recorded as a reference to a resource (SPEC S6) replays with its
/// reference, apart from its HTTP headers.
pub async fn referenced_answer_round_trips<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/reports", "reference-key");
    let req = request(&scope, "{}");
    let lease = acquire(&store, &req).await;
    let resp = StoredResponse::new(201, Bytes::new())
        .with_header("location", "/v1/reports/42")
        .with_reference("/v1/reports/42?format=csv");
    store.complete(&lease, &resp).await.expect("complete");
    let Reservation::Replay(replay) = store.reserve(&req).await.expect("reserve") else {
        panic!("not a replay");
    };
    assert_eq!(replay, resp);
    assert_eq!(replay.reference(), Some("/v1/reports/42?format=csv"));
    let http: Vec<_> = replay.http_headers().map(|(n, _)| n.as_str()).collect();
    assert_eq!(http, ["location"]);
}

/// A different payload under the same key is a mismatch, in progress or completed.
pub async fn mismatched_payload_is_rejected<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/charges", "mismatch-key");
    let lease = acquire(&store, &request(&scope, r#"{"amount":100}"#)).await;
    let other = request(&scope, r#"{"amount":1000}"#);
    assert_eq!(
        store.reserve(&other).await.expect("reserve"),
        Reservation::Mismatch
    );
    store.complete(&lease, &response()).await.expect("complete");
    assert_eq!(
        store.reserve(&other).await.expect("reserve"),
        Reservation::Mismatch
    );
    // The mismatch changed nothing.
    let record = store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.fingerprint, test_fingerprint(r#"{"amount":100}"#));
    assert!(record.is_completed());
}

/// Completing twice with one lease keeps the first response (SPEC S9).
pub async fn complete_is_idempotent_for_the_same_lease<S: Store>(store: S, _clock: ManualClock) {
    let scope = test_scope("/v1/charges", "twice-key");
    let req = request(&scope, "{}");
    let lease = acquire(&store, &req).await;
    store.complete(&lease, &response()).await.expect("complete");
    store
        .complete(&lease, &StoredResponse::new(500, "second"))
        .await
        .expect("second complete with the same lease");
    assert_eq!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(response())
    );
    // A completed record is not released.
    assert_fenced(store.release(&lease).await, "release after complete");
    assert!(store.get(&scope).await.expect("get").is_some());
}
