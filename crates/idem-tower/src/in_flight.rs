//! Tracking of started executions, for graceful shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// A handle on the executions a layer has started and not yet finished recording.
///
/// A client that disconnects does not cancel its request's execution (SPEC S7): the
/// execution goes on in a task of its own until it is recorded. On shutdown, stop
/// accepting connections first, then `in_flight.wait().await` so that every started
/// execution, those whose client went away included, is recorded before the process
/// exits.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    inner: Arc<Counter>,
}

#[derive(Debug, Default)]
struct Counter {
    count: AtomicUsize,
    /// Notified each time the count drops to zero; busy servers rarely get there, so
    /// entering and leaving cost one atomic operation each.
    idle: Notify,
}

impl InFlight {
    /// How many executions are running or recording now.
    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::Acquire)
    }

    /// Resolves once no execution is running or recording. Executions that start while
    /// this waits are waited for too.
    pub async fn wait(&self) {
        loop {
            let idle = self.inner.idle.notified();
            let mut idle = std::pin::pin!(idle);
            // Registered before the count is read, so a drop to zero in between is not
            // missed.
            idle.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Counts one more execution until the guard drops, which holds the request's
    /// place under its tenant's cap (see [`crate::tenant_limit`]) as long, when given.
    pub(crate) fn enter(&self, slot: Option<crate::tenant_limit::TenantSlot>) -> InFlightGuard {
        self.inner.count.fetch_add(1, Ordering::AcqRel);
        InFlightGuard {
            inner: self.inner.clone(),
            _slot: slot,
        }
    }
}

/// Counts one execution until dropped.
#[derive(Debug)]
pub(crate) struct InFlightGuard {
    inner: Arc<Counter>,
    /// The request's place under its tenant's cap, given back with the guard.
    _slot: Option<crate::tenant_limit::TenantSlot>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.inner.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_resolves_when_the_last_guard_drops() {
        let in_flight = InFlight::default();
        in_flight.wait().await;
        let a = in_flight.enter(None);
        let b = in_flight.enter(None);
        assert_eq!(in_flight.count(), 2);
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.wait().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        waiter.await.unwrap();
        assert_eq!(in_flight.count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wait_sees_executions_that_start_while_it_waits() {
        let in_flight = InFlight::default();
        let first = in_flight.enter(None);
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.wait().await }
        });
        let second = in_flight.enter(None);
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert_eq!(in_flight.count(), 1);
        drop(second);
        waiter.await.unwrap();
    }
}
