//! Making room at the cap by closing an idle connection, as nginx reuses idle
//! keep-alive connections when `worker_connections` runs short: a listener that
//! reclaims (the admin listener) keeps a register of its connections, and when a new
//! one arrives while every place is taken, it closes the one that has been idle the
//! longest. A connection with a request in progress is never chosen, so a probe or a
//! scrape under way is answered; idle sockets (a leaky scraper, a noisy neighbour)
//! can no longer hold the orchestrator's probes off until their timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::activity::Activity;

/// The connections of one listener that reclaims idle ones.
#[derive(Debug, Default)]
pub(super) struct Reclaim {
    connections: Mutex<Connections>,
}

#[derive(Debug, Default)]
struct Connections {
    next: u64,
    open: HashMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    activity: Activity,
    close: Arc<Notify>,
    /// Asked to close and not closed yet.
    closing: bool,
}

impl Reclaim {
    /// Registers a connection whose requests `activity` counts, until the returned
    /// registration is dropped.
    pub(super) fn register(self: &Arc<Self>, activity: &Activity) -> Registration {
        let close = Arc::new(Notify::new());
        let mut connections = self.lock();
        let id = connections.next;
        connections.next += 1;
        connections.open.insert(
            id,
            Entry {
                activity: activity.clone(),
                close: close.clone(),
                closing: false,
            },
        );
        Registration {
            reclaim: self.clone(),
            id,
            close,
        }
    }

    /// Asks the connection idle the longest (no request open) to close, unless one
    /// asked before has not closed yet: one closing makes the room one arrival needs.
    /// Whether a connection is closing.
    pub(super) fn close_longest_idle(&self) -> bool {
        let mut connections = self.lock();
        if connections.open.values().any(|e| e.closing) {
            return true;
        }
        // Idle as long: the older connection goes first, so the choice never rests on
        // the map's order.
        let longest = connections
            .open
            .iter_mut()
            .filter_map(|(id, e)| e.activity.idle_since().map(|since| ((since, *id), e)))
            .min_by_key(|(order, _)| *order);
        match longest {
            Some((_, entry)) => {
                entry.closing = true;
                // A permit: the connection's task may not be waiting yet.
                entry.close.notify_one();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connections> {
        // Nothing panics while holding it; a poisoned map is still a consistent one.
        self.connections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One connection's place in the register; dropped when the connection ends.
#[derive(Debug)]
pub(super) struct Registration {
    reclaim: Arc<Reclaim>,
    id: u64,
    close: Arc<Notify>,
}

impl Registration {
    /// Resolves once the listener asks this connection to close for room.
    pub(super) async fn asked_to_close(&self) {
        self.close.notified().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.reclaim.lock().open.remove(&self.id);
    }
}

/// Resolves when `registration`, if any, is asked to close; never without one.
pub(super) async fn asked_to_close(registration: Option<&Registration>) {
    match registration {
        Some(r) => r.asked_to_close().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_longest_idle_connection_is_asked_and_a_busy_one_never() {
        let reclaim = Arc::new(Reclaim::default());
        let (old, busy) = (Activity::new(), Activity::new());
        let _busy_request = busy.start();
        let old_r = reclaim.register(&old);
        tokio::time::advance(Duration::from_secs(1)).await;
        let young = Activity::new();
        let busy_r = reclaim.register(&busy);
        let young_r = reclaim.register(&young);

        assert!(reclaim.close_longest_idle());
        let asked = |r: &Registration| {
            let r = r.close.clone();
            async move {
                tokio::time::timeout(Duration::from_millis(10), r.notified())
                    .await
                    .is_ok()
            }
        };
        assert!(asked(&old_r).await, "the longest idle is asked");
        // While it closes, nobody else is asked.
        assert!(reclaim.close_longest_idle());
        assert!(!asked(&young_r).await);
        drop(old_r);
        assert!(reclaim.close_longest_idle());
        assert!(asked(&young_r).await, "then the next idle one");
        drop(young_r);
        // Only a busy connection left: nothing to close.
        assert!(!reclaim.close_longest_idle());
        assert!(!asked(&busy_r).await);
    }
}
