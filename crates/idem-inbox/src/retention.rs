//! How long processed-message rows are kept, purging them in bounded batches, and the
//! check that the inbox remembers a message at least as long as the broker may deliver
//! it again (SPEC S12).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::Inbox;

/// Processed-message rows are kept 7 days unless configured otherwise.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Purge batching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeConfig {
    /// Rows deleted per statement; keeps each delete's locks short.
    pub batch: usize,
    /// Batches per purge at most; what is left waits for the next purge.
    pub max_batches: usize,
}

impl Default for PurgeConfig {
    fn default() -> Self {
        PurgeConfig {
            batch: 1_000,
            max_batches: 100,
        }
    }
}

/// The inbox forgets messages sooner than the broker may deliver them again: a message
/// redelivered (or republished) after its row was purged would be processed twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionWarning {
    /// The inbox's consumer name.
    pub consumer: String,
    /// The inbox's retention.
    pub retention: Duration,
    /// The broker's redelivery / duplicate window; `Duration::MAX` when unbounded.
    pub broker_window: Duration,
}

impl fmt::Display for RetentionWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "inbox retention for consumer {:?} is {:?}, shorter than the broker's \
             redelivery/duplicate window of ",
            self.consumer, self.retention
        )?;
        if self.broker_window == Duration::MAX {
            f.write_str("unbounded")?;
        } else {
            write!(f, "{:?}", self.broker_window)?;
        }
        f.write_str(
            ": a message delivered again after its row is purged will be processed twice; \
             raise the retention or bound the broker's redelivery (max deliver, max age)",
        )
    }
}

/// Returns a warning, also logged at `warn` level, when `retention` is shorter than
/// `broker_window` (the longest time after which the broker may still deliver a
/// message again: its duplicate window, or ack wait times max deliveries, bounded by
/// the stream's max age). Pass `Duration::MAX` for an unbounded window.
pub fn check_retention(
    consumer: &str,
    retention: Duration,
    broker_window: Duration,
) -> Option<RetentionWarning> {
    if retention >= broker_window {
        return None;
    }
    let warning = RetentionWarning {
        consumer: consumer.to_owned(),
        retention,
        broker_window,
    };
    tracing::warn!(%warning, "inbox retention too short");
    Some(warning)
}

/// A background task that purges an inbox every `every`, in bounded batches. Dropping
/// it (or [`Purger::stop`]) stops it.
#[derive(Debug)]
pub struct Purger {
    task: tokio::task::JoinHandle<()>,
}

impl Purger {
    /// Starts purging `inbox` on the current tokio runtime. Errors are logged and the
    /// next tick tries again.
    pub fn spawn<I: Inbox>(inbox: Arc<I>, every: Duration, config: PurgeConfig) -> Purger {
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match inbox.purge(config).await {
                    Ok(0) => {}
                    Ok(removed) => tracing::debug!(
                        removed,
                        consumer = inbox.consumer(),
                        "purged processed-message rows"
                    ),
                    Err(e) => tracing::warn!(
                        error = %e,
                        consumer = inbox.consumer(),
                        "purging processed-message rows failed"
                    ),
                }
            }
        });
        Purger { task }
    }

    /// Stops the purger.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_shorter_than_broker_window_warns() {
        let w = check_retention("points", Duration::from_secs(60), Duration::from_secs(120))
            .expect("warning");
        assert_eq!(w.retention, Duration::from_secs(60));
        assert_eq!(w.broker_window, Duration::from_secs(120));
        assert!(w.to_string().contains("shorter than"), "{w}");
    }

    #[test]
    fn retention_covering_broker_window_is_quiet() {
        assert_eq!(
            check_retention("points", DEFAULT_RETENTION, Duration::from_secs(120)),
            None
        );
        assert_eq!(
            check_retention("points", Duration::from_secs(120), Duration::from_secs(120)),
            None
        );
    }

    #[test]
    fn unbounded_broker_window_always_warns() {
        let w = check_retention("points", DEFAULT_RETENTION, Duration::MAX).expect("warning");
        assert!(w.to_string().contains("unbounded"), "{w}");
    }
}
