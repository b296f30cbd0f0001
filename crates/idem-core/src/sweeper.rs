//! The background sweeper that purges expired records in bounded batches (SPEC S8).

use std::sync::Arc;
use std::time::Duration;

use crate::Store;

/// Sweeper settings.
#[derive(Debug, Clone, Copy)]
pub struct SweeperConfig {
    /// Time between sweeps.
    pub every: Duration,
    /// Records deleted per store call; keeps each delete's locks short.
    pub batch: usize,
    /// Batches per sweep at most, so one sweep cannot monopolise the store; what is
    /// left waits for the next sweep.
    pub max_batches: usize,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            every: Duration::from_secs(30),
            batch: 1_000,
            max_batches: 100,
        }
    }
}

/// A running sweeper; dropping it (or [`Sweeper::stop`]) stops it.
#[derive(Debug)]
pub struct Sweeper {
    task: tokio::task::JoinHandle<()>,
}

impl Sweeper {
    /// Starts sweeping `store` on the current tokio runtime.
    pub fn spawn<S: Store + ?Sized>(store: Arc<S>, config: SweeperConfig) -> Sweeper {
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(config.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let removed = sweep_once(&*store, config).await;
                if removed > 0 {
                    tracing::debug!(removed, "purged expired idempotency records");
                }
            }
        });
        Sweeper { task }
    }

    /// Stops the sweeper.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One sweep: purges batches until one comes back short or `max_batches` ran. Returns
/// how many records were deleted. Store errors end the sweep (the next one retries).
pub async fn sweep_once<S: Store + ?Sized>(store: &S, config: SweeperConfig) -> usize {
    let mut total = 0;
    for _ in 0..config.max_batches.max(1) {
        match store.purge_expired(config.batch).await {
            Ok(n) => {
                total += n;
                if n < config.batch {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "purging expired idempotency records failed");
                break;
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{test_fingerprint, test_scope};
    use crate::{ManualClock, MemoryStore, Reservation, ReserveRequest, StoredResponse};

    #[tokio::test]
    async fn sweep_once_purges_in_batches_until_short() {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        for i in 0..25 {
            let req =
                ReserveRequest::new(test_scope("/s", &format!("k{i}")), test_fingerprint("{}"))
                    .ttl(Duration::from_secs(1))
                    .lease(Duration::from_secs(1));
            let Reservation::Acquired(l) = store.reserve(&req).await.unwrap() else {
                panic!()
            };
            store
                .complete(&l, &StoredResponse::new(200, ""))
                .await
                .unwrap();
        }
        clock.advance(Duration::from_secs(1));
        let cfg = SweeperConfig {
            every: Duration::from_secs(1),
            batch: 10,
            max_batches: 2,
        };
        assert_eq!(sweep_once(&store, cfg).await, 20, "bounded by max_batches");
        assert_eq!(store.len(), 5);
        assert_eq!(sweep_once(&store, cfg).await, 5);
        assert!(store.is_empty());
    }
}
