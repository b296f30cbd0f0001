//! Stages 3 and 4 of a keyed request (SPEC S5, S6): the answer recorded, or the key
//! released, with a few tries before the client gets its answer and more after.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use idem_core::{Lease, Store, StoreError, StoredResponse};

use crate::config::Config;
use crate::grpc::{GRPC_STATUS_FIELDS, is_grpc};
use crate::in_flight::InFlightGuard;
use crate::keyed::Keyed;
use crate::observer::timed;
use crate::shared::Shared;

/// How often, and with what pauses, recording or releasing a key is tried before the
/// client gets its answer; [`settle_later`] goes on from there.
const WRITE_BACKOFF: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(400),
];

/// The write that settles a key once its handler answered (SPEC S5 stages 3–4, S6).
pub(crate) enum KeyWrite {
    /// Record the answer and complete the record.
    Complete(StoredResponse),
    /// Delete the record, so that the key executes again.
    Release,
}

impl KeyWrite {
    fn op(&self) -> &'static str {
        match self {
            KeyWrite::Complete(_) => "complete",
            KeyWrite::Release => "release",
        }
    }

    async fn run<St: Store>(&self, store: &St, lease: &Lease) -> idem_core::Result<()> {
        match self {
            KeyWrite::Complete(stored) => store.complete(lease, stored).await,
            KeyWrite::Release => store.release(lease).await,
        }
    }
}

/// How a key was settled before the caller gets its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Written.
    Written,
    /// Refused: another attempt took the record over (SPEC S7); this attempt's answer
    /// is not the key's.
    Fenced,
    /// Not written yet: the store failed every time, and [`settle_later`] goes on.
    Deferred,
}

impl<St: Store> Keyed<St> {
    /// Settles the key `lease` holds: `write` is tried as [`WRITE_BACKOFF`] says before
    /// the caller gets its answer. If the store failed every time (it is down, say), the
    /// caller gets the answer anyway and [`settle_later`] goes on in the background, the
    /// request counted in flight (`guard`) until it is done.
    pub(crate) async fn settle(
        &self,
        lease: Lease,
        write: KeyWrite,
        guard: InFlightGuard,
    ) -> Settled {
        let (shared, lease_for) = (&self.shared, self.lease_for);
        let observer = &*shared.config.observer;
        for pause in WRITE_BACKOFF {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            match timed(observer, write.op(), write.run(&*shared.store, &lease)).await {
                Ok(()) => return Settled::Written,
                Err(StoreError::Fenced) => {
                    fenced(&lease, &write);
                    return Settled::Fenced;
                }
                Err(e) => tracing::warn!(error = %e, op = write.op(), "settling the key failed"),
            }
        }
        observer.write_deferred(write.op());
        let shared = shared.clone();
        tokio::spawn(async move {
            let settled = settle_later(&shared, &lease, lease_for, &write).await;
            shared
                .config
                .observer
                .deferred_write_ended(write.op(), settled);
            drop(guard);
        });
        Settled::Deferred
    }
}

fn fenced(lease: &Lease, write: &KeyWrite) {
    match write {
        KeyWrite::Complete(_) => tracing::warn!(
            scope = %lease.scope.digest(),
            attempt = lease.attempt,
            "the record was taken over before this attempt finished; its answer is not recorded"
        ),
        // Taken over or expired since: nothing of this attempt is left to release.
        KeyWrite::Release => {}
    }
}

/// The pauses between the tries of [`settle_later`]: growing to a few seconds.
const LATER_BACKOFF: [Duration; 5] = [
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
    Duration::from_secs(3),
];

/// A key write the first tries could not make (the store is down, say), tried again
/// after growing pauses for as long again as the lease. Until it is made, retries of
/// the key get 409; once the lease lapses one takes over, and after an unrecorded
/// answer the handler runs again (SPEC S7). So a store outage shorter than the lease
/// costs no second execution, and no retry waits out the lease after a release. A
/// takeover fences this attempt's token: a late write never touches a newer attempt's
/// record. `false` when it gave up.
async fn settle_later<St: Store>(
    shared: &Shared<St>,
    lease: &Lease,
    lease_for: Duration,
    write: &KeyWrite,
) -> bool {
    let observer = &*shared.config.observer;
    let deadline = tokio::time::Instant::now() + lease_for;
    let mut pauses = LATER_BACKOFF
        .iter()
        .chain(std::iter::repeat(&LATER_BACKOFF[4]));
    tracing::warn!(
        scope = %lease.scope.digest(),
        op = write.op(),
        "the key could not be settled yet; trying again while the client has its answer"
    );
    loop {
        let pause = *pauses.next().expect("an endless iterator");
        if tokio::time::Instant::now() + pause > deadline {
            tracing::error!(
                scope = %lease.scope.digest(),
                op = write.op(),
                "the key could not be settled; it stays in progress until its lease \
                 lapses, and then a retry executes again"
            );
            return false;
        }
        tokio::time::sleep(pause).await;
        match timed(observer, write.op(), write.run(&*shared.store, lease)).await {
            Ok(()) => {
                tracing::info!(
                    scope = %lease.scope.digest(),
                    op = write.op(),
                    "the key is settled after all"
                );
                return true;
            }
            Err(StoreError::Fenced) => {
                fenced(lease, write);
                return true;
            }
            Err(e) => tracing::debug!(error = %e, op = write.op(), "settling the key failed again"),
        }
    }
}

/// What is recorded of a response (SPEC S6, S18): its status, the allow-listed headers,
/// the body, and its allow-listed trailers. A gRPC answer's status fields
/// ([`GRPC_STATUS_FIELDS`], in its headers when it is trailers-only, else in its
/// trailers) and `grpc-encoding` are always kept.
pub(crate) fn stored_response(
    config: &Config,
    extra_headers: &[HeaderName],
    head: &http::response::Parts,
    body: &Bytes,
    trailers: Option<&HeaderMap>,
) -> StoredResponse {
    let grpc = is_grpc(&head.headers);
    let kept = |name: &HeaderName| {
        config.stored_headers.contains(name)
            || extra_headers.contains(name)
            || (grpc && (GRPC_STATUS_FIELDS.contains(&name.as_str()) || name == "grpc-encoding"))
    };
    let mut stored = StoredResponse {
        status: head.status.as_u16(),
        headers: head
            .headers
            .iter()
            .filter(|(name, _)| kept(name))
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    Bytes::copy_from_slice(value.as_bytes()),
                )
            })
            .collect(),
        // A compact copy: `body` is often a slice of the connection's read buffer, which
        // a store that keeps the value (the memory store) would pin whole for the
        // record's lifetime, making the connection allocate a new buffer for every
        // response.
        body: Bytes::copy_from_slice(body),
        meta: Default::default(),
    };
    for (name, value) in trailers.into_iter().flatten() {
        if kept(name) || GRPC_STATUS_FIELDS.contains(&name.as_str()) {
            stored = stored.with_trailer(name.as_str(), Bytes::copy_from_slice(value.as_bytes()));
        }
    }
    stored
}
