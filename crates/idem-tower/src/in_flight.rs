//! Tracking of spawned executions, for graceful shutdown.

use std::sync::Arc;

use tokio::sync::watch;

/// A handle on the executions a layer has spawned and not yet finished recording.
///
/// Keyed requests run in their own task so that a client disconnecting cannot cancel
/// them (SPEC S7). On shutdown, stop accepting connections first, then
/// `in_flight.wait().await` so that every started execution is recorded before the
/// process exits.
#[derive(Debug, Clone)]
pub struct InFlight {
    count: Arc<watch::Sender<usize>>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            count: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl InFlight {
    /// How many executions are running or recording now.
    pub fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// Resolves once no execution is running or recording. Executions that start while
    /// this waits are waited for too.
    pub async fn wait(&self) {
        let mut rx = self.count.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    pub(crate) fn enter(&self) -> InFlightGuard {
        self.count.send_modify(|n| *n += 1);
        InFlightGuard {
            count: self.count.clone(),
        }
    }
}

/// Counts one execution until dropped.
#[derive(Debug)]
pub(crate) struct InFlightGuard {
    count: Arc<watch::Sender<usize>>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_resolves_when_the_last_guard_drops() {
        let in_flight = InFlight::default();
        in_flight.wait().await;
        let a = in_flight.enter();
        let b = in_flight.enter();
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
}
