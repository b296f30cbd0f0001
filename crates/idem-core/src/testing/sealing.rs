//! Cases for [`Sealed`] over any store (SPEC S17), for each store crate to run on its
//! own store: rotation, unknown and wrong keys, changed bytes, status or scope. Each
//! takes the inner store behind an `Arc`, so that several wrappers with different key
//! rings read the same records.
//!
//! Whether the store's own bytes hold the answer in plain text is each store's test
//! (its file, its columns, its hash): [`record_known_answer`] records
//! [`KNOWN_BODY`] and [`KNOWN_HEADER`] for it to look for.

use std::sync::Arc;

use bytes::Bytes;

use super::{test_fingerprint, test_scope};
use crate::{
    FencingToken, Lease, RecordKeys, RecordState, Reservation, ReserveRequest, Scope, Sealed,
    Store, StoreError, StoredResponse,
};

/// A body that must never appear in a store's bytes once sealed.
pub const KNOWN_BODY: &[u8] = b"{\"card\":\"4242424242424242\",\"cvc\":\"737\"}";

/// A header value that must never appear in a store's bytes once sealed.
pub const KNOWN_HEADER: &[u8] = b"/v1/charges/ch_plaintext_location";

/// A ring of one key, `id`, of 32 bytes `byte`.
pub fn ring(id: &str, byte: u8) -> RecordKeys {
    RecordKeys::new([(id, [byte; 32])]).expect("a valid ring")
}

/// The answer [`record_known_answer`] records.
pub fn known_answer() -> StoredResponse {
    StoredResponse::new(201, Bytes::from_static(KNOWN_BODY))
        .with_header("location", Bytes::from_static(KNOWN_HEADER))
}

/// Reserves a fresh scope and completes it with [`known_answer`] through `store`;
/// returns the request that replays it.
pub async fn record_known_answer<S: Store>(store: &S) -> ReserveRequest {
    let scope = test_scope("/v1/charges", "sealed-known");
    let request = ReserveRequest::new(scope, test_fingerprint(r#"{"amount":100}"#));
    let lease = acquire(store, &request).await;
    store
        .complete(&lease, &known_answer())
        .await
        .expect("complete");
    request
}

async fn acquire<S: Store + ?Sized>(store: &S, request: &ReserveRequest) -> Lease {
    match store.reserve(request).await.expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// The completed answer as the inner store holds it.
pub async fn raw_answer<S: Store + ?Sized>(inner: &S, scope: &Scope) -> StoredResponse {
    let record = inner.get(scope).await.expect("get").expect("a record");
    match record.state {
        RecordState::Completed { response, .. } => response,
        other => panic!("expected a completed record, got {other:?}"),
    }
}

fn replayed(reservation: crate::Result<Reservation>) -> StoredResponse {
    match reservation.expect("reserve") {
        Reservation::Replay(stored) => stored,
        other => panic!("expected a replay, got {other:?}"),
    }
}

fn refused(reservation: crate::Result<Reservation>, what: &str) {
    match reservation {
        Err(StoreError::Sealed(_)) => {}
        other => panic!("{what}: expected StoreError::Sealed, got {other:?}"),
    }
}

/// Every case below, in turn.
pub async fn all<S: Store>(inner: Arc<S>) {
    answers_are_sealed_and_replayed(inner.clone()).await;
    metadata_is_sealed_and_the_ambiguity_listed(inner.clone()).await;
    keys_rotate_without_downtime(inner.clone()).await;
    unknown_or_wrong_keys_never_open(inner.clone()).await;
    changed_bytes_status_or_scope_never_open(inner.clone()).await;
    older_or_other_payload_answers_never_open(inner).await;
}

/// The inner store holds the key id and ciphertext; the wrapper replays and shows the
/// answer byte for byte.
pub async fn answers_are_sealed_and_replayed<S: Store>(inner: Arc<S>) {
    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let request = record_known_answer(&store).await;
    let raw = raw_answer(&*inner, &request.scope).await;
    assert_eq!(raw.status, 201, "the status stays plain");
    assert!(raw.headers.is_empty(), "no header is left in plain text");
    assert_eq!(raw.sealed_by(), Some("k1"));
    assert!(!contains(&raw.body, KNOWN_BODY) && !contains(&raw.body, b"4242"));
    assert!(!contains(&raw.body, KNOWN_HEADER));
    assert_eq!(replayed(store.reserve(&request).await), known_answer());
    let shown = store
        .get(&request.scope)
        .await
        .expect("get")
        .expect("record");
    match shown.state {
        RecordState::Completed { response, .. } => assert_eq!(response, known_answer()),
        other => panic!("{other:?}"),
    }
}

/// An answer's metadata is sealed with it, but for the sealing key's id and the
/// ambiguity reason, which the inner store keeps in plain text (its listing of ambiguous
/// records finds the record by them); the wrapper replays, shows and lists every field.
pub async fn metadata_is_sealed_and_the_ambiguity_listed<S: Store>(inner: Arc<S>) {
    use crate::Ambiguity;
    use crate::testing::cases::meta::{annotated, listed};

    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let scope = test_scope("/v1/exports", "sealed-meta");
    let request = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    let lease = acquire(&store, &request).await;
    let answer = annotated(Ambiguity::UpstreamConnectionLost);
    store.complete(&lease, &answer).await.expect("complete");

    let raw = raw_answer(&*inner, &scope).await;
    assert_eq!(raw.sealed_by(), Some("k1"));
    assert_eq!(raw.ambiguity(), Some(Ambiguity::UpstreamConnectionLost));
    assert!(raw.headers.is_empty());
    assert_eq!(
        (raw.reference(), raw.trace_parent(), raw.trailers().count()),
        (None, None, 0),
        "sealed with the answer"
    );
    assert!(!contains(&raw.body, b"/v1/reports/7") && !contains(&raw.body, b"as%20told"));
    let inner_listed = listed(&*inner, &scope).await;
    assert_eq!(
        inner_listed.len(),
        1,
        "the inner store lists it as ambiguous"
    );

    assert_eq!(replayed(store.reserve(&request).await), answer);
    let shown = listed(&store, &scope).await;
    match &shown[..] {
        [record] => match &record.state {
            RecordState::Completed { response, .. } => assert_eq!(*response, answer),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// A ring with a new first key seals new answers under it and still opens the old
/// key's; once the old key is dropped, its answers no longer open.
pub async fn keys_rotate_without_downtime<S: Store>(inner: Arc<S>) {
    let before = Sealed::new(inner.clone(), ring("k1", 1));
    let old = record_known_answer(&before).await;
    let rotated = Sealed::new(
        inner.clone(),
        RecordKeys::new([("k2", [2; 32]), ("k1", [1; 32])]).expect("ring"),
    );
    assert_eq!(replayed(rotated.reserve(&old).await), known_answer());
    let new = record_known_answer(&rotated).await;
    let raw = raw_answer(&*inner, &new.scope).await;
    assert_eq!(raw.sealed_by(), Some("k2"), "new answers use the first key");
    assert_eq!(replayed(rotated.reserve(&new).await), known_answer());
    // An instance not yet given the new ring reads the old answers, and refuses the new.
    assert_eq!(replayed(before.reserve(&old).await), known_answer());
    refused(before.reserve(&new).await, "a key id the ring lacks");
    let after = Sealed::new(inner, ring("k2", 2));
    assert_eq!(replayed(after.reserve(&new).await), known_answer());
    refused(after.reserve(&old).await, "the retired key's answer");
}

/// A ring without the answer's key id, or with other bytes under that id, refuses it
/// (never an absent record that would execute again), on reserve and on get.
pub async fn unknown_or_wrong_keys_never_open<S: Store>(inner: Arc<S>) {
    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let request = record_known_answer(&store).await;
    for other in [ring("k9", 1), ring("k1", 9)] {
        let other = Sealed::new(inner.clone(), other);
        refused(other.reserve(&request).await, "a wrong ring");
        assert!(matches!(
            other.get(&request.scope).await,
            Err(StoreError::Sealed(_))
        ));
    }
    assert_eq!(replayed(store.reserve(&request).await), known_answer());
}

/// A sealed answer with one byte changed, another status, or copied from another
/// record, does not open: each is written straight to the inner store, as someone with
/// the store's access might.
pub async fn changed_bytes_status_or_scope_never_open<S: Store>(inner: Arc<S>) {
    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let request = record_known_answer(&store).await;
    let copied = raw_answer(&*inner, &request.scope).await;
    for what in ["a flipped bit", "another status", "another record's answer"] {
        let target = ReserveRequest::new(
            test_scope("/v1/charges", "sealed-forged"),
            request.fingerprint,
        );
        let lease = acquire(&*inner, &target).await;
        let mut forged = store.seal(&lease, &known_answer());
        match what {
            "a flipped bit" => {
                let mut body = forged.body.to_vec();
                let middle = body.len() / 2;
                body[middle] ^= 0x01;
                forged.body = Bytes::from(body);
            }
            "another status" => forged.status = 200,
            _ => forged = copied.clone(),
        }
        inner.complete(&lease, &forged).await.expect("complete");
        refused(store.reserve(&target).await, what);
    }
}

/// A sealed answer of the same key, copied into a later record of that key: one
/// reserved for another payload, or one for the same payload after the first record
/// went (the key reused once its answer expired, here removed). Neither opens, by
/// reserve or by get: the answer is bound to its request's fingerprint and its
/// attempt's token, not only to the scope.
pub async fn older_or_other_payload_answers_never_open<S: Store>(inner: Arc<S>) {
    let store = Sealed::new(inner.clone(), ring("k1", 1));
    let first = record_known_answer(&store).await;
    let older = raw_answer(&*inner, &first.scope).await;
    let other_payload =
        ReserveRequest::new(first.scope.clone(), test_fingerprint(r#"{"amount":999}"#));
    for (what, later) in [
        ("the same payload, a later record", first.clone()),
        ("another payload", other_payload),
    ] {
        assert!(inner.remove(&first.scope).await.expect("remove"), "{what}");
        let lease = acquire(&*inner, &later).await;
        assert_ne!(lease.token, FencingToken::from_u64(0));
        inner.complete(&lease, &older).await.expect("complete");
        refused(store.reserve(&later).await, what);
        assert!(
            matches!(store.get(&later.scope).await, Err(StoreError::Sealed(_))),
            "{what}: get"
        );
    }
    // Its own record, put back whole, is that record as it stood: it opens.
    assert!(inner.remove(&first.scope).await.expect("remove"));
    let lease = acquire(&*inner, &first).await;
    let fresh = store.seal(&lease, &StoredResponse::new(201, "ch_2"));
    inner.complete(&lease, &fresh).await.expect("complete");
    assert_eq!(
        replayed(store.reserve(&first).await),
        StoredResponse::new(201, "ch_2")
    );
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
