//! The heartbeat of stage 2 (SPEC S7): a running handler's lease renewed, so that only
//! a dead worker's lease ever expires.

use std::future::Future;
use std::pin::{Pin, pin};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{Fuse, FusedFuture};
use idem_core::{Lease, Store, StoreError};
use tokio::time::Instant;

use crate::observer::{Observer, timed};

/// Awaits `handler` while renewing `lease` every third of its length (SPEC S7), so that
/// only a dead worker's lease ever expires. A renewal runs alongside the handler and
/// never holds it up; once the lease is lost, renewing stops.
///
/// Beats are counted from when the store was asked, not from when it answered: the
/// lease runs from the store's write, which comes before its reply, so a reply that
/// took long leaves less of the lease than a beat counted from it would assume. The
/// first beat is `reserved` (when the reserve was sent) plus a third of the lease, the
/// next ones a third of the lease after the renewal before them was sent.
pub(crate) async fn with_heartbeat<St: Store, T>(
    store: &St,
    observer: &dyn Observer,
    lease: &Lease,
    lease_for: Duration,
    reserved: Instant,
    mut handler: Pin<&mut impl Future<Output = T>>,
) -> T {
    let beat = (lease_for / 3).max(Duration::from_millis(1));
    // Registered with the timer only if the handler is still running after its first
    // poll.
    let mut sleep = pin!(tokio::time::sleep_until(reserved + beat));
    let mut renewal = pin!(Fuse::terminated());
    let mut renewing = true;
    let mut asked = reserved;
    loop {
        tokio::select! {
            biased;
            output = &mut handler => return output,
            () = &mut sleep, if renewing && renewal.is_terminated() => {
                asked = Instant::now();
                renewal.set(timed(observer, "renew", store.renew(lease, lease_for)).fuse());
            }
            renewed = &mut renewal, if !renewal.is_terminated() => {
                match renewed {
                    Ok(()) => {}
                    Err(StoreError::Fenced) => {
                        tracing::warn!(
                            scope = %lease.scope.digest(),
                            attempt = lease.attempt,
                            "lease lost while the handler runs; its answer will not be recorded"
                        );
                        renewing = false;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease renewal failed; retrying at the next beat")
                    }
                }
                sleep.as_mut().reset(asked + beat);
            }
        }
    }
}
