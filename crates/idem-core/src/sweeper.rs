//! The background sweeper that purges expired records in bounded batches (SPEC S8).

use std::sync::Arc;
use std::time::Duration;

use crate::Store;

/// Sweeper settings.
#[derive(Debug, Clone, Copy)]
pub struct SweeperConfig {
    /// Time between sweeps; zero counts as 1 ms.
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
            // `interval` panics on zero, which would end the sweeps for good.
            let mut tick = tokio::time::interval(config.every.max(Duration::from_millis(1)));
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

    /// A store with `n` completed records that expire after 1 s, and its clock.
    async fn completed_records(n: usize) -> (ManualClock, MemoryStore) {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        for i in 0..n {
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
        (clock, store)
    }

    #[tokio::test]
    async fn sweep_once_purges_in_batches_until_short() {
        let (clock, store) = completed_records(25).await;
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

    /// `tokio::time::interval` panics on a zero period; in the sweeper's task that
    /// would end the sweeps without a word and let the store grow.
    #[tokio::test]
    async fn a_zero_interval_still_sweeps() {
        let (clock, store) = completed_records(3).await;
        clock.advance(Duration::from_secs(1));
        let store = Arc::new(store);
        let sweeper = Sweeper::spawn(
            store.clone(),
            SweeperConfig {
                every: Duration::ZERO,
                ..SweeperConfig::default()
            },
        );
        tokio::time::timeout(Duration::from_secs(10), async {
            while !store.is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the sweeper purged the expired records");
        assert!(!sweeper.task.is_finished(), "the sweeper keeps running");
    }
}
