//! How a waiting duplicate hears of another instance's completion (SPEC S15) on a
//! server that has no `LISTEN/NOTIFY`: one poller per store, which asks about every
//! scope its waiters watch in one statement per tick.
//!
//! # The mechanism
//!
//! [`MySqlStore::watch`](idem_core::Store::watch) registers the waiter in the store's
//! [`ChangeHub`] and wakes the poller if it was idle. While anything is watched, the
//! poller sleeps one interval ([`DEFAULT_WAIT_POLL`], or the URL's `wait-poll-ms`), then
//! sends, for up to [`MOST_PER_STATEMENT`] watched scopes at once,
//!
//! ```sql
//! SELECT id FROM TABLE
//!  WHERE id IN (?, …) AND state = 'in_progress' AND lease_until > ? AND expires_at > ?
//! ```
//!
//! a primary-key lookup per scope that names the records still held by a live attempt.
//! Every other watched scope fires: its record was completed, released, removed, or its
//! lease lapsed, and its waiters reserve again (a wake is a hint; the reserve decides).
//! The number of placeholders is rounded up to a power of two (the last id repeated), so
//! that the server and the driver keep at most ten prepared statements.
//!
//! The cost is per instance and per tick, not per waiter: one statement per tick for up
//! to [`MOST_PER_STATEMENT`] watched scopes, however many waiters watch each, and none
//! while nobody waits. A waiter hears of a completion at most one interval and one
//! statement after it commits.
//!
//! A statement that fails (the server is down, the pool exhausted) fires every watch, as
//! a `LISTEN` connection that drops does: the waiters look for themselves, and the
//! poller tries again at its next tick.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{ChangeHub, Scope, SharedClock, Watch};
use sqlx::{AssertSqlSafe, MySqlPool};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How long the poller waits between two looks by default.
pub const DEFAULT_WAIT_POLL: Duration = Duration::from_millis(100);

/// The most scopes one statement asks about; more watched scopes take more statements
/// per tick.
pub const MOST_PER_STATEMENT: usize = 512;

/// A store's poller: its hub, and the task that looks.
pub(crate) struct Poller {
    hub: ChangeHub,
    /// Wakes the task when a watch is made while it idles.
    watched: Arc<Notify>,
    /// Statements the task sent.
    statements: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Poller {
    /// Starts the poller of `table`, looking every `every` through `pool`, each look
    /// bounded by `timeout`. Call inside a tokio runtime.
    pub(crate) fn spawn(
        pool: MySqlPool,
        table: &str,
        clock: SharedClock,
        every: Duration,
        timeout: Duration,
    ) -> Poller {
        let hub = ChangeHub::polling();
        let watched = Arc::new(Notify::new());
        let statements = Arc::new(AtomicU64::new(0));
        let looker = Looker {
            pool,
            clock,
            timeout,
            hub: hub.clone(),
            statements: statements.clone(),
            sql: (0..=MOST_PER_STATEMENT.trailing_zeros())
                .map(|shift| still_held(table, 1 << shift))
                .collect(),
        };
        let task = tokio::spawn(run(looker, every, watched.clone()));
        Poller {
            hub,
            watched,
            statements,
            task,
        }
    }

    /// A watch on `scope`, fired by the first look that finds its record no longer
    /// held by a live attempt.
    pub(crate) fn watch(&self, scope: &Scope) -> Watch {
        let watch = self.hub.watch(scope);
        self.watched.notify_one();
        watch
    }

    /// Statements the poller sent so far.
    pub(crate) fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// How many watches wait now.
    pub(crate) fn watches(&self) -> usize {
        self.hub.watches()
    }

    /// Stops looking; every watch fires, and later ones are [`Watch::poll`].
    pub(crate) fn stop(&self) {
        self.task.abort();
        self.hub.set_live(false);
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The statement naming which of `n` ids are still held by a live attempt:
/// `id × n, now, now`.
fn still_held(table: &str, n: usize) -> String {
    let slots = vec!["?"; n].join(", ");
    format!(
        "SELECT id FROM {table}
          WHERE id IN ({slots}) AND state = 'in_progress'
            AND lease_until > ? AND expires_at > ?"
    )
}

/// What the task looks with.
struct Looker {
    pool: MySqlPool,
    clock: SharedClock,
    timeout: Duration,
    hub: ChangeHub,
    statements: Arc<AtomicU64>,
    /// [`still_held`] for 1, 2, 4, … [`MOST_PER_STATEMENT`] ids.
    sql: Vec<String>,
}

async fn run(looker: Looker, every: Duration, watched: Arc<Notify>) {
    let mut failing = false;
    loop {
        if !looker.hub.is_watched() {
            // A watch made since the check left a permit: this returns at once.
            watched.notified().await;
            continue;
        }
        tokio::time::sleep(every).await;
        match looker.look().await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("the MySQL store's waiting duplicates are polled again");
            }
            Ok(()) => {}
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        error = %e,
                        "the MySQL store could not look for completions; waiting \
                         duplicates look for themselves until it can"
                    );
                    failing = true;
                }
                // What changed meanwhile went unseen: every waiter looks again.
                looker.hub.set_live(false);
                looker.hub.set_live(true);
            }
        }
    }
}

impl Looker {
    /// One look at every watched scope; fires those no longer held.
    async fn look(&self) -> Result<(), String> {
        let digests = self.hub.watched_digests();
        for chunk in digests.chunks(MOST_PER_STATEMENT) {
            let ids: Vec<Vec<u8>> = chunk
                .iter()
                .map(|d| hex::decode(d).unwrap_or_default())
                .collect();
            let held = self.held(&ids).await?;
            for (digest, id) in chunk.iter().zip(&ids) {
                if !held.contains(id) {
                    self.hub.notify_digest(digest);
                }
            }
        }
        Ok(())
    }

    /// Which of `ids` (at most [`MOST_PER_STATEMENT`], at least one) are held by a
    /// live attempt now.
    async fn held(&self, ids: &[Vec<u8>]) -> Result<HashSet<Vec<u8>>, String> {
        let slots = ids.len().next_power_of_two();
        let sql = &self.sql[slots.trailing_zeros() as usize];
        let now = self.clock.now().as_millis();
        let last = ids.last().expect("one id at least");
        let mut query = sqlx::query_scalar::<_, Vec<u8>>(AssertSqlSafe(sql.as_str()));
        for i in 0..slots {
            query = query.bind(ids.get(i).unwrap_or(last));
        }
        let query = query.bind(now).bind(now);
        self.statements.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.timeout, query.fetch_all(&self.pool)).await {
            Ok(Ok(held)) => Ok(held.into_iter().collect()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_statement_per_power_of_two_up_to_the_most() {
        let sql: Vec<String> = (0..=MOST_PER_STATEMENT.trailing_zeros())
            .map(|shift| still_held("t", 1 << shift))
            .collect();
        assert_eq!(sql.len(), 10);
        assert!(sql[0].contains("id IN (?)"), "{}", sql[0]);
        assert_eq!(sql[9].matches('?').count(), MOST_PER_STATEMENT + 2);
    }
}
