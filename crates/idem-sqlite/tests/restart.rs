//! Records live in the file: closing every connection and opening the file again
//! loses nothing, in-progress leases included.

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{
    Clock, DEFAULT_LEASE, ManualClock, RecordState, Reservation, ReserveRequest, Store,
    StoredResponse,
};
use idem_sqlite::SqliteStore;

#[tokio::test]
async fn records_survive_closing_and_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("restart.db").display());
    let clock = ManualClock::starting_now();
    let open = || {
        SqliteStore::builder()
            .clock(Arc::new(clock.clone()))
            .connect(&url)
    };
    let req =
        |key: &str| ReserveRequest::new(test_scope("/v1/charges", key), test_fingerprint("{}"));
    let (done, busy, resumed) = (req("done"), req("busy"), req("resumed"));
    let resp = StoredResponse::new(201, "charged").with_header("location", "/v1/charges/ch_1");

    let store = open().await.unwrap();
    let Reservation::Acquired(done_lease) = store.reserve(&done).await.unwrap() else {
        panic!("first reserve acquires")
    };
    store.complete(&done_lease, &resp).await.unwrap();
    let Reservation::Acquired(busy_lease) = store.reserve(&busy).await.unwrap() else {
        panic!("first reserve acquires")
    };
    let Reservation::Acquired(resumed_lease) = store.reserve(&resumed).await.unwrap() else {
        panic!("first reserve acquires")
    };
    let before = store.get(&done.scope).await.unwrap().unwrap();
    store.pool().close().await;
    drop(store);

    let store = open().await.unwrap();
    assert_eq!(store.get(&done.scope).await.unwrap().unwrap(), before);
    assert_eq!(
        store.reserve(&done).await.unwrap(),
        Reservation::Replay(resp.clone())
    );
    // The in-progress record still holds its lease...
    match store.get(&busy.scope).await.unwrap().unwrap().state {
        RecordState::InProgress { lease_until } => {
            assert_eq!(lease_until, clock.now().plus(DEFAULT_LEASE));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.reserve(&busy).await.unwrap(),
        Reservation::InProgress {
            retry_after: Duration::from_secs(1)
        }
    );
    // ...and its token: the attempt that reserved before the restart may complete.
    store.complete(&resumed_lease, &resp).await.unwrap();
    assert_eq!(
        store.reserve(&resumed).await.unwrap(),
        Reservation::Replay(resp)
    );
    // A lease that lapses across the restart is taken over as the next attempt.
    clock.advance(DEFAULT_LEASE + Duration::from_secs(1));
    let Reservation::Acquired(takeover) = store.reserve(&busy).await.unwrap() else {
        panic!("lapsed lease is taken over")
    };
    assert_eq!(takeover.attempt, 2);
    assert_ne!(takeover.token, busy_lease.token);
    let record = store.get(&busy.scope).await.unwrap().unwrap();
    assert!(matches!(record.state, RecordState::InProgress { .. }));
}
