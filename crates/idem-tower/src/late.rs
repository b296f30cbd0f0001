//! A reservation confirmed too late to execute under (SPEC S7).
//!
//! The store's lease starts when it commits the reservation, which is after the reserve
//! was sent; the layer learns of it only when the reply arrives. A reply held up on the
//! way back (a one-way partition, a stalled connection, a store slow to answer) can
//! arrive after the lease has lapsed, when a retry may already have taken the key over
//! and executed: executing then would be a silent second execution. So the layer
//! measures from before the reserve was sent to just before the handler starts (the
//! tenant's rate of new keys, which may ask the store too, included), on the runtime's
//! monotonic clock, which a step of the wall clock cannot fool, and which tests pause
//! and move by hand. A reservation older than [`trusted_for`] by then is not executed
//! under: it is given back if it is still this attempt's (fenced, [`give_back`]), and
//! the client gets 503 `reservation-late` with `Retry-After`.
//!
//! The margin leaves the heartbeat (which renews from the reserve's send, see
//! `heartbeat.rs`) half a lease to land its first renewal, and the instances sharing
//! the store room for their clocks to disagree.

use std::time::Duration;

use http::Response;
use idem_core::{Lease, Store};
use tokio::time::Instant;

use crate::IdempotencyBody;
use crate::handled::Handled;
use crate::hints::hint;
use crate::keyed::Keyed;
use crate::observer::{Observer, Outcome, timed};
use crate::problem::{Problem, ProblemKind};

/// How long after its reserve was sent a reservation may still be executed under: half
/// its lease.
pub(crate) fn trusted_for(lease: Duration) -> Duration {
    lease / 2
}

/// How long ago `sent` was, if that is longer than a reservation with a lease of
/// `lease` is trusted for ([`trusted_for`]); `None` while it may still be executed under.
pub(crate) fn overdue(sent: Instant, lease: Duration) -> Option<Duration> {
    let elapsed = sent.elapsed();
    (elapsed >= trusted_for(lease)).then_some(elapsed)
}

/// Gives back the key `lease` holds, under which nothing ran, fenced: a first attempt's
/// is released, so that the retry executes as a first attempt; a recovered attempt's is
/// left lapsed (renewed for no time), so that the retry takes it over as a recovered
/// attempt, as it would have without this one: an earlier attempt may have had effects,
/// and the upstream must hear so. A lease already taken over is left to its new holder.
pub(crate) async fn give_back<St: Store + ?Sized>(
    store: &St,
    observer: &dyn Observer,
    lease: &Lease,
) -> idem_core::Result<()> {
    if lease.recovered() {
        timed(observer, "renew", store.renew(lease, Duration::ZERO)).await
    } else {
        timed(observer, "release", store.release(lease)).await
    }
}

impl<St: Store> Keyed<St> {
    /// The answer to a request whose reservation `lease` was confirmed `elapsed` after
    /// its reserve was sent, too late to execute under: the key given back if still
    /// its own, and 503 `reservation-late`.
    pub(crate) async fn refuse_late<B>(
        &self,
        lease: Lease,
        elapsed: Duration,
    ) -> Response<IdempotencyBody<B>> {
        let (store, observer) = (self.store(), self.observer());
        let digest = lease.scope.digest();
        tracing::warn!(
            scope = %digest,
            attempt = lease.attempt,
            elapsed_ms = elapsed.as_millis() as u64,
            lease_ms = self.lease_for.as_millis() as u64,
            "the store confirmed the reservation too late to trust its lease; not executing, answering 503"
        );
        match give_back(store, observer, &lease).await {
            Ok(()) | Err(idem_core::StoreError::Fenced) => {}
            Err(e) => {
                // The key stays in progress until this lease lapses; the retry then
                // takes over.
                tracing::warn!(error = %e, scope = %digest, "could not give back a reservation confirmed too late");
            }
        }
        observer.outcome(Outcome::ReservationLate);
        let detail = format!(
            "the idempotency store confirmed this key's reservation {} ms after it was \
             asked, too late to be sure no other attempt had taken the key over, so the \
             request was not executed; retry with the same key",
            elapsed.as_millis()
        );
        let problem = Problem::new(ProblemKind::ReservationLate, detail);
        let mut response = problem
            .answer(self.dialect())
            .map(IdempotencyBody::buffered);
        Handled::keyed(&mut response, Outcome::ReservationLate, &lease.scope, None);
        if self.answers.retry_hints {
            hint(&mut response, true);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reservation_is_trusted_for_half_its_lease() {
        let lease = Duration::from_secs(10);
        let sent = Instant::now();
        assert_eq!(overdue(sent, lease), None);
        tokio::time::advance(Duration::from_millis(4_999)).await;
        assert_eq!(overdue(sent, lease), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(overdue(sent, lease), Some(Duration::from_secs(5)));
    }
}
