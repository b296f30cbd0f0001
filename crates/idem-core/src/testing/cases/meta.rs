//! A record's typed metadata ([`ResponseMeta`](crate::ResponseMeta)): every field
//! survives reserve, complete, replay, `get` and listing, and the reason an attempt
//! leaves its record in progress is kept with the record.

use bytes::Bytes;

use super::*;
use crate::{Ambiguity, Clock, ListQuery, Record, RecordState};

/// The records a listing of ambiguous records returns for `scope`, followed to its end.
pub(crate) async fn listed<S: Store>(store: &S, scope: &Scope) -> Vec<Record> {
    let mut query = ListQuery::new().ambiguous();
    let mut found = Vec::new();
    loop {
        let page = store.list(&query).await.expect("list");
        found.extend(page.records.into_iter().filter(|r| r.scope == *scope));
        match page.next {
            Some(next) => query.after = Some(next),
            None => return found,
        }
    }
}

/// An answer carrying every metadata field: reference, ambiguity, trailers, trace parent.
pub(crate) fn annotated(reason: Ambiguity) -> StoredResponse {
    StoredResponse::new(200, Bytes::from_static(b"\x00\x01grpc frame"))
        .with_header("content-type", "application/grpc")
        .with_reference("/v1/reports/7?format=csv")
        .with_trace_parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .with_trailer("grpc-status", "13")
        .with_trailer("grpc-message", Bytes::from_static(b"as%20told"))
        .with_ambiguity(reason)
}

/// Each metadata field of an answer survives reserve → complete → replay, `get` and
/// the listing of ambiguous records, for every reason an answer can be recorded with.
/// (The sealing key's id is held to the same by [`sealing`](crate::testing::sealing).)
pub async fn response_metadata_round_trips<S: Store>(store: S, _clock: ManualClock) {
    for reason in [
        Ambiguity::AnswerTooLarge,
        Ambiguity::HandlerFailed,
        Ambiguity::UpstreamTimeout,
        Ambiguity::UpstreamConnectionLost,
    ] {
        let scope = test_scope("/v1/exports", reason.as_str());
        let req = request(&scope, "{}");
        let lease = acquire(&store, &req).await;
        let answer = annotated(reason);
        store.complete(&lease, &answer).await.expect("complete");
        match store.reserve(&req).await.expect("reserve") {
            Reservation::Replay(replay) => {
                assert_eq!(replay, answer, "{reason}");
                assert_eq!(replay.http_headers().count(), 1, "{reason}");
            }
            other => panic!("{reason}: {other:?}"),
        }
        let record = store.get(&scope).await.expect("get").expect("record");
        let RecordState::Completed { response, .. } = &record.state else {
            panic!("{reason}: {record:?}");
        };
        assert_eq!(*response, answer, "{reason}");
        let listed = listed(&store, &scope).await;
        assert_eq!(listed, [record], "{reason}: listed as `get` shows it");
    }
}

/// The reason an attempt leaves its record in progress (an upstream timeout) is kept
/// with the record, fenced by the attempt's token: `get` and the listing name it while
/// the lease is still alive; a takeover clears it, and so does completing.
pub async fn in_progress_ambiguity_is_kept_with_the_record<S: Store>(store: S, clock: ManualClock) {
    let scope = test_scope("/v1/payouts", "timed-out");
    let req = request(&scope, "{}");
    let first = acquire(&store, &req).await;
    let unmarked = store.get(&scope).await.expect("get").expect("record");
    assert_eq!(unmarked.in_progress_ambiguity, None);
    assert!(listed(&store, &scope).await.is_empty(), "a live attempt");

    store
        .mark_ambiguous(&first, Ambiguity::UpstreamTimeout)
        .await
        .expect("mark");
    let marked = store.get(&scope).await.expect("get").expect("record");
    assert_eq!(
        marked.in_progress_ambiguity,
        Some(Ambiguity::UpstreamTimeout)
    );
    assert!(matches!(marked.state, RecordState::InProgress { .. }));
    assert_eq!(
        marked.ambiguity(clock.now()),
        Some(Ambiguity::UpstreamTimeout)
    );
    assert_eq!(listed(&store, &scope).await, std::slice::from_ref(&marked));
    // The lease is untouched: a duplicate still waits.
    assert!(matches!(
        store.reserve(&req).await.expect("reserve"),
        Reservation::InProgress { .. }
    ));

    clock.advance(LEASE + Duration::from_secs(1));
    let listed_late = listed(&store, &scope).await;
    assert_eq!(
        listed_late[0].ambiguity(clock.now()),
        Some(Ambiguity::UpstreamTimeout),
        "the stored reason, not `orphaned`"
    );
    let second = acquire(&store, &req).await;
    assert_fenced(
        store
            .mark_ambiguous(&first, Ambiguity::UpstreamConnectionLost)
            .await,
        "marking",
    );
    let taken = store.get(&scope).await.expect("get").expect("record");
    assert_eq!(taken.in_progress_ambiguity, None, "a takeover clears it");
    assert_eq!(taken.ambiguity(clock.now()), Some(Ambiguity::Takeover));

    store
        .mark_ambiguous(&second, Ambiguity::UpstreamConnectionLost)
        .await
        .expect("mark");
    store
        .complete(&second, &response())
        .await
        .expect("complete");
    let done = store.get(&scope).await.expect("get").expect("record");
    assert_eq!(done.in_progress_ambiguity, None, "completing clears it");
    assert_fenced(
        store
            .mark_ambiguous(&second, Ambiguity::UpstreamTimeout)
            .await,
        "marking a completed record",
    );
}
