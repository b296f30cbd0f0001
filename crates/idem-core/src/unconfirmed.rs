//! [`release_unconfirmed`]: freeing a reservation whose reply was lost.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::record::Lease;
use crate::store::{Store, StoreError};

/// The pauses before each try of [`release_unconfirmed`]: five tries over about 8.5 s,
/// after which only the lease (60 s by default) frees the key.
pub const UNCONFIRMED_RELEASE_PAUSES: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_millis(1_600),
    Duration::from_millis(6_400),
];

/// The most releases [`release_unconfirmed`] keeps going at once in a process. During an
/// outage where every reserve times out, more would only add load to a struggling
/// store; a reservation beyond this waits out its lease, as it did without them.
pub const MAX_UNCONFIRMED_RELEASES: usize = 256;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Frees the first-attempt reservation `lease` names if a reserve that never answered
/// did write it.
///
/// For network stores: a reserve command may reach the server and write its record while
/// its reply is lost (the connection dropped, or the reply came too late). The caller
/// then reports the store unavailable and executes nothing, but the record it cannot see
/// holds the key in progress, so every retry would get 409 until the lease lapses. The
/// store knows the token it sent; a release fenced by that token deletes exactly that
/// record if it exists, and does nothing if the reserve never landed or another attempt
/// holds the key since (SPEC S6: a request that did not start executing is released).
///
/// Only for a reservation of attempt 1 (a fresh key, or one whose record had expired).
/// A takeover's record (attempt n+1) says that an earlier attempt may have acted; it
/// must lapse and be taken over again, so that the next handler still learns it runs a
/// recovered attempt, rather than be deleted. A store whose reserve may take over
/// without knowing which it did uses [`release_unconfirmed_with`] and a release that
/// matches attempt 1 only.
///
/// Runs in the background on the current tokio runtime and returns at once. It stops at
/// the first answer (released, or nothing to release) and tries again while the store is
/// unavailable, after each of [`UNCONFIRMED_RELEASE_PAUSES`]. Outside a runtime, or with
/// [`MAX_UNCONFIRMED_RELEASES`] already going, it does nothing, and the lease lapses as
/// it would have.
pub fn release_unconfirmed<S>(store: &S, lease: Lease)
where
    S: Store + Clone,
{
    let store = store.clone();
    release_unconfirmed_with(move || {
        let (store, lease) = (store.clone(), lease.clone());
        async move { store.release(&lease).await }
    });
}

/// [`release_unconfirmed`] with the store's own fenced release: `release` is called for
/// each try and answers `Ok` when it deleted the reservation, [`StoreError::Fenced`]
/// when there was nothing of it to delete, and another error to try again later.
pub fn release_unconfirmed_with<F, Fut>(mut release: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if PENDING.fetch_add(1, Ordering::AcqRel) >= MAX_UNCONFIRMED_RELEASES {
        PENDING.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(
            "too many unconfirmed releases going; this reservation waits out its lease"
        );
        return;
    }
    runtime.spawn(async move {
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                PENDING.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _done = Done;
        for pause in UNCONFIRMED_RELEASE_PAUSES {
            tokio::time::sleep(pause).await;
            match release().await {
                Ok(()) => {
                    tracing::info!(
                        "released a reservation whose reply was lost; the key is free again"
                    );
                    return;
                }
                // The reserve never landed, or the key has moved on: nothing is ours.
                Err(StoreError::Fenced) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "could not release a reservation whose reply was lost yet");
                }
            }
        }
        tracing::warn!(
            "could not release a reservation whose reply was lost; its key stays in progress \
             until the lease lapses"
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{test_fingerprint, test_scope};
    use crate::{MemoryStore, Reservation, ReserveRequest};

    async fn gone(store: &MemoryStore, lease: &Lease) -> bool {
        for _ in 0..200 {
            if store.get(&lease.scope).await.unwrap().is_none() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_landed_reservation_is_released_and_the_key_executes_again() {
        let store = MemoryStore::new();
        let req = ReserveRequest::new(test_scope("/x", "k-1"), test_fingerprint("{}"));
        let Reservation::Acquired(lease) = store.reserve(&req).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        release_unconfirmed(&store, lease.clone());
        assert!(gone(&store, &lease).await);
        assert!(matches!(
            store.reserve(&req).await.unwrap(),
            Reservation::Acquired(_)
        ));
    }

    #[tokio::test]
    async fn another_attempts_reservation_is_left_alone() {
        let store = MemoryStore::new();
        let req = ReserveRequest::new(test_scope("/x", "k-2"), test_fingerprint("{}"));
        let Reservation::Acquired(held) = store.reserve(&req).await.unwrap() else {
            panic!("a fresh key is acquired");
        };
        // A reserve that never landed: its token is not the record's.
        let lost = Lease {
            token: crate::FencingToken::generate(),
            ..held.clone()
        };
        // The store's own fenced release, reporting what it answered, so the test waits
        // for the try instead of for a while.
        let (answered, answer) = tokio::sync::oneshot::channel();
        let mut answered = Some(answered);
        let releasing = store.clone();
        release_unconfirmed_with(move || {
            let (store, lost, answered) = (releasing.clone(), lost.clone(), answered.take());
            async move {
                let result = store.release(&lost).await;
                if let Some(tx) = answered {
                    tx.send(matches!(result, Err(StoreError::Fenced))).ok();
                }
                result
            }
        });
        let fenced = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("the release is tried at once")
            .expect("the try reports");
        assert!(fenced, "the lost lease's release is fenced");
        assert!(store.get(&held.scope).await.unwrap().is_some());
        store.release(&held).await.unwrap();
    }
}
