//! What a relay counts, for the caller to read and export as it likes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A relay's counters and gauges. Read them with [`snapshot`](RelayMetrics::snapshot).
#[derive(Debug, Default)]
pub struct RelayMetrics {
    published: AtomicU64,
    publish_failures: AtomicU64,
    parked: AtomicU64,
    relay_errors: AtomicU64,
    batches: AtomicU64,
    unpublished: AtomicU64,
    oldest_unpublished_ms: AtomicU64,
}

/// The values of a [`RelayMetrics`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Messages this relay published and marked (counter).
    pub published: u64,
    /// Publishes the broker did not confirm, to be tried again (counter).
    pub publish_failures: u64,
    /// Messages this relay parked (counter).
    pub parked: u64,
    /// Failures of the relay's own round: the database, or a marking that did not
    /// commit (counter).
    pub relay_errors: u64,
    /// Batches claimed with at least one message (counter).
    pub batches: u64,
    /// Messages staged and not yet published, across all relays (gauge, as of the last
    /// look at the table).
    pub unpublished: u64,
    /// The age of the oldest unpublished message (gauge, as of the last look).
    pub oldest_unpublished_age: Duration,
}

impl RelayMetrics {
    /// The current values.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            published: get(&self.published),
            publish_failures: get(&self.publish_failures),
            parked: get(&self.parked),
            relay_errors: get(&self.relay_errors),
            batches: get(&self.batches),
            unpublished: get(&self.unpublished),
            oldest_unpublished_age: Duration::from_millis(get(&self.oldest_unpublished_ms)),
        }
    }

    pub(crate) fn add_published(&self, n: u64) {
        self.published.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_publish_failures(&self, n: u64) {
        self.publish_failures.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn add_parked(&self, n: u64) {
        self.parked.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn relay_error(&self) {
        self.relay_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn batch(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_backlog(&self, unpublished: u64, oldest: Duration) {
        self.unpublished.store(unpublished, Ordering::Relaxed);
        let ms = u64::try_from(oldest.as_millis()).unwrap_or(u64::MAX);
        self.oldest_unpublished_ms.store(ms, Ordering::Relaxed);
    }
}
