//! Helpers shared by the integration tests that watch the writer's queue.

use std::time::{Duration, Instant};

use idem_sqlite::SqliteStore;

/// Waits until exactly `n` writes are queued or being written.
pub async fn until_pending(store: &SqliteStore, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.pending_writes() != n {
        assert!(
            Instant::now() < deadline,
            "expected {n} pending writes, have {}",
            store.pending_writes()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
