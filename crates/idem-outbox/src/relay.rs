//! The relay: claims committed messages, publishes them, and marks them published only
//! after the broker confirmed them.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use crate::metrics::{MetricsSnapshot, RelayMetrics};
use crate::{Message, Outbox, Publish, PublishError, Result, Settlement};

/// How a [`Relay`] works.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// Messages claimed per round (default 256). Messages of distinct ordering keys
    /// are in flight to the broker together.
    pub batch: usize,
    /// The poll fallback: how long an idle relay waits for a notification before it
    /// looks at the table anyway (default 500 ms; SQLite has no notifications, so it is
    /// SQLite's latency floor when idle).
    pub poll_interval: Duration,
    /// The first retry's backoff (default 100 ms); it doubles per failed attempt.
    pub backoff_base: Duration,
    /// The longest backoff (default 30 s), for a message and for the relay when the
    /// broker is down.
    pub backoff_max: Duration,
    /// Failed attempts after which a message is parked (default `None`: a message the
    /// broker does not refuse outright is retried until it is confirmed).
    pub max_attempts: Option<u32>,
    /// How long published rows are kept before the relay purges them (default 7 days).
    pub retention: Duration,
    /// How often the relay purges (default 1 minute), in batches of `purge_batch`
    /// (default 1000) rows.
    pub purge_interval: Duration,
    /// Rows deleted per purge statement.
    pub purge_batch: usize,
    /// How often the relay reads the backlog gauges (default 1 s).
    pub stats_interval: Duration,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            batch: 256,
            poll_interval: Duration::from_millis(500),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            max_attempts: None,
            retention: Duration::from_secs(7 * 24 * 3600),
            purge_interval: Duration::from_secs(60),
            purge_batch: 1000,
            stats_interval: Duration::from_secs(1),
        }
    }
}

/// What one round of a relay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Messages claimed.
    pub claimed: usize,
    /// Messages the broker confirmed, marked published.
    pub published: usize,
    /// Messages to be tried again.
    pub failed: usize,
    /// Messages parked.
    pub parked: usize,
}

/// Publishes an [`Outbox`]'s committed messages through a [`Publish`]er: at least
/// once, never lost, in order per ordering key.
///
/// A message is marked published only after the broker confirmed it. A relay that dies
/// between the confirmation and the mark leaves the message unmarked, and it is
/// published again: consumers de-duplicate on the message id (`idem-inbox`; JetStream's
/// duplicate window drops it first when it is still open).
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool, js: async_nats::jetstream::Context) {
/// use idem_outbox::{NatsPublisher, PgOutbox, Relay};
///
/// let relay = Relay::new(PgOutbox::new(pool), NatsPublisher::new(js));
/// let metrics = relay.metrics();
/// # let shutdown = std::future::ready(());
/// relay.run(shutdown).await;
/// println!("{:?}", metrics.snapshot());
/// # }
/// ```
#[derive(Debug)]
pub struct Relay<O, P> {
    outbox: O,
    publisher: P,
    options: RelayOptions,
    metrics: Arc<RelayMetrics>,
    name: String,
}

impl<O: Outbox, P: Publish> Relay<O, P> {
    /// A relay with the default [`RelayOptions`] and a random name.
    pub fn new(outbox: O, publisher: P) -> Relay<O, P> {
        Relay {
            outbox,
            publisher,
            options: RelayOptions::default(),
            metrics: Arc::default(),
            name: format!("relay-{}", uuid::Uuid::new_v4()),
        }
    }

    /// Uses `options`.
    pub fn with_options(mut self, options: RelayOptions) -> Relay<O, P> {
        self.options = options;
        self
    }

    /// The relay's counters and gauges, shared: keep the `Arc` and read it while the
    /// relay runs.
    pub fn metrics(&self) -> Arc<RelayMetrics> {
        self.metrics.clone()
    }

    /// The outbox.
    pub fn outbox(&self) -> &O {
        &self.outbox
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// The relay's name (the holder of a SQLite file's relay lease).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One round: claims a batch, publishes it in waves (one message per ordering key
    /// per wave, each wave's confirmations awaited), and records the outcomes. A message
    /// whose earlier message of the same key failed stays for a later round, so order
    /// per key holds even across failures.
    pub async fn round(&self) -> Result<RoundReport> {
        let (batch, staged) = self.outbox.claim(&self.name, self.options.batch).await?;
        let mut report = RoundReport {
            claimed: staged.len(),
            ..RoundReport::default()
        };
        if staged.is_empty() {
            self.outbox.settle(batch, Vec::new()).await?;
            return Ok(report);
        }
        self.metrics.batch();
        let mut outcomes: Vec<Settlement> = vec![Settlement::Untouched; staged.len()];
        let mut failed_keys: HashSet<&str> = HashSet::new();
        let mut remaining: Vec<usize> = (0..staged.len()).collect();
        while !remaining.is_empty() {
            let mut wave = Vec::new();
            let mut wave_keys = HashSet::new();
            let mut later = Vec::new();
            for i in remaining {
                match staged[i].message.ordering_key.as_deref() {
                    Some(key) if failed_keys.contains(key) => {}
                    Some(key) if !wave_keys.insert(key) => later.push(i),
                    _ => wave.push(i),
                }
            }
            remaining = later;
            if wave.is_empty() {
                break;
            }
            let messages: Vec<&Message> = wave.iter().map(|&i| &staged[i].message).collect();
            let mut results = self.publisher.publish_all(&messages).await.into_iter();
            for &i in &wave {
                let result = results.next().unwrap_or_else(|| {
                    Err(PublishError::Transient(
                        "the publisher gave no result".into(),
                    ))
                });
                let attempts = staged[i].attempts.saturating_add(1);
                outcomes[i] = match result {
                    Ok(()) => Settlement::Published,
                    Err(PublishError::Refused(error)) => {
                        tracing::error!(id = %staged[i].message.id, %error, "the broker refuses a message for good; parked");
                        Settlement::Park { error }
                    }
                    Err(PublishError::Transient(error)) => {
                        if let Some(key) = staged[i].message.ordering_key.as_deref() {
                            failed_keys.insert(key);
                        }
                        match self.options.max_attempts {
                            Some(max) if attempts >= max => {
                                let error = format!("gave up after {attempts} attempts: {error}");
                                tracing::error!(id = %staged[i].message.id, %error, "parked");
                                Settlement::Park { error }
                            }
                            _ => Settlement::Retry {
                                after: backoff(&self.options, attempts),
                                error,
                            },
                        }
                    }
                };
            }
        }
        for outcome in &outcomes {
            match outcome {
                Settlement::Published => report.published += 1,
                Settlement::Retry { .. } => report.failed += 1,
                Settlement::Park { .. } => report.parked += 1,
                Settlement::Untouched => {}
            }
        }
        let seqs = staged.iter().map(|s| s.seq);
        self.outbox
            .settle(batch, seqs.zip(outcomes).collect())
            .await?;
        self.metrics.add_published(report.published as u64);
        self.metrics.add_publish_failures(report.failed as u64);
        self.metrics.add_parked(report.parked as u64);
        Ok(report)
    }

    /// Relays until `shutdown` completes (a round in progress is finished first), then
    /// returns the metrics. Never gives up: database and broker failures are logged,
    /// counted, and retried after a backoff.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> MetricsSnapshot {
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut listener = None;
        let mut failures: u32 = 0;
        let mut next_stats = tokio::time::Instant::now();
        let mut next_purge = tokio::time::Instant::now();
        loop {
            if (&mut shutdown).now_or_never().is_some() {
                break;
            }
            if listener.is_none() {
                match self.outbox.listen().await {
                    Ok(l) => listener = Some(l),
                    Err(e) => {
                        tracing::warn!(error = %e, "outbox relay cannot listen for new messages; polling");
                        self.metrics.relay_error();
                    }
                }
            }
            let now = tokio::time::Instant::now();
            if now >= next_stats {
                next_stats = now + self.options.stats_interval;
                match self.outbox.stats().await {
                    Ok(s) => self
                        .metrics
                        .set_backlog(s.unpublished, s.oldest_unpublished_age),
                    Err(e) => {
                        tracing::warn!(error = %e, "outbox stats failed");
                        self.metrics.relay_error();
                    }
                }
            }
            if now >= next_purge {
                next_purge = now + self.options.purge_interval;
                self.purge().await;
            }
            let wait = match self.round().await {
                Ok(r) if r.claimed == 0 => {
                    failures = 0;
                    None
                }
                Ok(r) if r.published == 0 && r.parked == 0 => {
                    // Nothing got through: the broker is likely down; back off as a
                    // whole rather than hammer it.
                    failures = failures.saturating_add(1);
                    Some(backoff(&self.options, failures))
                }
                Ok(_) => {
                    failures = 0;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay round failed");
                    self.metrics.relay_error();
                    failures = failures.saturating_add(1);
                    Some(backoff(&self.options, failures))
                }
            };
            match (wait, listener.as_mut()) {
                (None, Some(l)) => {
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = self.outbox.wait_for_work(l, self.options.poll_interval) => {}
                    }
                }
                (wait, _) => {
                    let wait = wait.unwrap_or(self.options.poll_interval);
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        self.metrics.snapshot()
    }

    /// Purges published rows past the retention, batch after batch until one comes back
    /// short (at most 100 batches per call).
    async fn purge(&self) {
        for _ in 0..100 {
            match self
                .outbox
                .purge_published(self.options.retention, self.options.purge_batch)
                .await
            {
                Ok(n) if n < self.options.purge_batch => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "outbox purge failed");
                    self.metrics.relay_error();
                    break;
                }
            }
        }
    }
}

/// The backoff before attempt `attempts + 1`: `base * 2^(attempts - 1)`, capped at
/// `max`, the upper half jittered so that relays and messages do not retry in step.
pub(crate) fn backoff(options: &RelayOptions, attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(30);
    let full = options
        .backoff_base
        .saturating_mul(1u32 << exp)
        .min(options.backoff_max);
    let half = full / 2;
    let jitter = (uuid::Uuid::new_v4().as_u128() % 1_000) as u32;
    half + half.mul_f64(f64::from(jitter) / 1_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let o = RelayOptions::default();
        for (attempts, full) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (20, 30_000),
            (u32::MAX, 30_000),
        ] {
            let b = backoff(&o, attempts);
            let full = Duration::from_millis(full);
            assert!(b >= full / 2 && b <= full, "{attempts}: {b:?}");
        }
    }
}
