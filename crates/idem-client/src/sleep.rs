//! Waiting between attempts, injected: the real client sleeps on tokio's timer; tests
//! use a [`ManualSleeper`] that records each requested delay and moves a
//! [`ManualClock`] instead of sleeping, so `Retry-After` handling is asserted exactly.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::ManualClock;

/// Something that waits.
#[async_trait]
pub trait Sleep: Send + Sync + fmt::Debug + 'static {
    /// Waits for `delay`.
    async fn sleep(&self, delay: Duration);
}

/// Sleeps on tokio's timer: the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioSleeper;

#[async_trait]
impl Sleep for TokioSleeper {
    async fn sleep(&self, delay: Duration) {
        tokio::time::sleep(delay).await;
    }
}

/// Records every requested delay and returns at once, moving a [`ManualClock`] forward
/// by the delay so that deadlines and `Retry-After` dates see time pass.
///
/// Clones share the record.
#[derive(Debug, Clone)]
pub struct ManualSleeper {
    clock: ManualClock,
    delays: Arc<Mutex<Vec<Duration>>>,
}

impl ManualSleeper {
    /// A sleeper that advances `clock`.
    pub fn new(clock: ManualClock) -> ManualSleeper {
        ManualSleeper {
            clock,
            delays: Arc::default(),
        }
    }

    /// Every delay requested so far, in order.
    pub fn delays(&self) -> Vec<Duration> {
        self.lock().clone()
    }

    /// The sum of the delays requested so far.
    pub fn total(&self) -> Duration {
        self.lock().iter().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Duration>> {
        self.delays.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Sleep for ManualSleeper {
    async fn sleep(&self, delay: Duration) {
        self.lock().push(delay);
        self.clock.advance(delay);
        // Let other tasks run, as a real wait would.
        tokio::task::yield_now().await;
    }
}
