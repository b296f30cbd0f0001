//! [`ChangeFeed`]: the one supervisor of a network store's change notifications
//! (SPEC S15), the PostgreSQL `LISTEN` connection and the Redis subscription alike.
//!
//! A store whose server announces completions keeps one connection of its own that
//! hears them and fires its [`ChangeHub`]'s watches. The supervisor runs that
//! connection's session (connect, subscribe, serve until it fails), and when it ends
//! marks the hub not live, which wakes every waiter to look again for what it may have
//! missed; then it pauses ([`Backoff`], with jitter) and connects again. While the hub
//! is not live new watches poll.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::watch::ChangeHub;

/// The first pause before reconnecting a [`ChangeFeed`].
pub const FEED_FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// The longest pause between a [`ChangeFeed`]'s reconnections.
pub const FEED_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A reconnection schedule: pauses that double from `first` up to `max`, each drawn
/// between half and the whole of its step ("equal jitter"), so that the instances
/// that lost one server do not all come back in the same millisecond.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// A schedule whose first step is `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max: max.max(first),
            step: first,
        }
    }

    /// The next pause, `jitter` (in `[0, 1]`, clamped) choosing where it falls between
    /// half the current step and the whole of it; the step then doubles, up to `max`.
    pub fn pause(&mut self, jitter: f64) -> Duration {
        let half = self.step / 2;
        let pause = half + (self.step - half).mul_f64(jitter.clamp(0.0, 1.0));
        self.step = (self.step * 2).min(self.max);
        pause
    }

    /// Back to the first step: the connection came up.
    pub fn reset(&mut self) {
        self.step = self.first;
    }
}

/// A uniform draw in `[0, 1)` for [`Backoff::pause`].
fn jitter() -> f64 {
    // The top 53 bits of a random `u64`: every value a `f64` in [0, 1) holds exactly.
    getrandom::u64().map_or(0.5, |r| (r >> 11) as f64 / (1u64 << 53) as f64)
}

/// What one session of a [`ChangeFeed`]'s connection reports: that it listens, and
/// what changed.
#[derive(Debug, Clone)]
pub struct FeedSession {
    hub: ChangeHub,
    listening: Arc<Notify>,
    live: Arc<AtomicBool>,
}

impl FeedSession {
    /// The connection is up and subscribed: the hub is live from now on, and the
    /// store's [`ChangeFeed::ready`] returns.
    pub fn listening(&self) {
        self.live.store(true, Ordering::Release);
        self.hub.set_live(true);
        self.listening.notify_waiters();
    }

    /// The record whose scope has this [`digest`](crate::Scope::digest) changed.
    pub fn changed(&self, digest: &str) {
        self.hub.notify_digest(digest);
    }

    /// Changes may have gone unheard (the connection was made again underneath):
    /// every waiter looks again.
    pub fn missed(&self) {
        self.hub.set_live(false);
        self.hub.set_live(true);
    }
}

/// A store's change notifications (SPEC S15), heard on a connection of its own that a
/// background task keeps up. The task runs the connection's session (connect,
/// subscribe, serve until it fails); when a session ends it marks the hub not live,
/// which wakes every waiter to look again for what it may have missed, pauses
/// ([`Backoff`], with jitter) and connects again. While the hub is not live new watches
/// poll. Stops when dropped or [stopped](Self::stop).
#[derive(Debug)]
pub struct ChangeFeed {
    hub: ChangeHub,
    task: JoinHandle<()>,
    listening: Arc<Notify>,
}

impl ChangeFeed {
    /// Starts the supervisor: it runs `session` (connect, call
    /// [`FeedSession::listening`] once subscribed, report changes, return when the
    /// connection fails) again and again, pausing as [`Backoff`] says between sessions,
    /// from [`FEED_FIRST_BACKOFF`] up to [`FEED_MAX_BACKOFF`]. `what` names the
    /// connection in logs. Call inside a tokio runtime.
    pub fn spawn<S, F, E>(what: &'static str, session: S) -> ChangeFeed
    where
        S: FnMut(FeedSession) -> F + Send + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let backoff = Backoff::new(FEED_FIRST_BACKOFF, FEED_MAX_BACKOFF);
        ChangeFeed::spawn_with(what, backoff, jitter, session)
    }

    /// [`spawn`](Self::spawn) with the schedule and the jitter's source given.
    pub fn spawn_with<S, F, E>(
        what: &'static str,
        backoff: Backoff,
        jitter: fn() -> f64,
        session: S,
    ) -> ChangeFeed
    where
        S: FnMut(FeedSession) -> F + Send + 'static,
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let hub = ChangeHub::new();
        hub.set_live(false);
        let listening = Arc::new(Notify::new());
        let task = tokio::spawn(supervise(
            what,
            backoff,
            jitter,
            session,
            hub.clone(),
            listening.clone(),
        ));
        ChangeFeed {
            hub,
            task,
            listening,
        }
    }

    /// The hub the feed fires; live while the connection listens.
    pub fn hub(&self) -> &ChangeHub {
        &self.hub
    }

    /// Waits up to `within` for the connection to listen; whether it does.
    pub async fn ready(&self, within: Duration) -> bool {
        let notified = self.listening.notified();
        if self.hub.is_live() {
            return true;
        }
        tokio::time::timeout(within, notified).await.is_ok() || self.hub.is_live()
    }

    /// Stops the connection; waiters poll from now on.
    pub fn stop(&self) {
        self.task.abort();
        self.hub.set_live(false);
    }
}

impl Drop for ChangeFeed {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn supervise<S, F, E>(
    what: &'static str,
    mut backoff: Backoff,
    jitter: fn() -> f64,
    mut session: S,
    hub: ChangeHub,
    listening: Arc<Notify>,
) where
    S: FnMut(FeedSession) -> F,
    F: Future<Output = Result<(), E>>,
    E: std::fmt::Display + Send,
{
    loop {
        let live = Arc::new(AtomicBool::new(false));
        let ended = session(FeedSession {
            hub: hub.clone(),
            listening: listening.clone(),
            live: live.clone(),
        })
        .await;
        let was_live = live.load(Ordering::Acquire);
        if was_live {
            backoff.reset();
        }
        match ended {
            Err(e) if was_live => tracing::warn!(
                error = %e,
                "{what} failed; waiting duplicates poll until it is back"
            ),
            Err(e) => tracing::debug!(error = %e, "{what} is not up yet"),
            Ok(()) => tracing::warn!("{what} closed; waiting duplicates poll until it is back"),
        }
        // Going down fires every watch: what was sent meanwhile is lost, so every
        // waiter looks again.
        hub.set_live(false);
        tokio::time::sleep(backoff.pause(jitter())).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::testing::test_scope;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_doubles_within_its_jitter_up_to_the_max_and_resets() {
        let mut b = Backoff::new(100 * MS, 1_000 * MS);
        assert_eq!(b.pause(0.0), 50 * MS);
        assert_eq!(b.pause(1.0), 200 * MS);
        assert_eq!(b.pause(0.5), 300 * MS);
        assert_eq!(b.pause(1.0), 800 * MS);
        assert_eq!(b.pause(1.0), 1_000 * MS, "capped");
        assert_eq!(b.pause(0.0), 500 * MS, "capped");
        assert_eq!(b.pause(7.0), 1_000 * MS, "jitter clamped");
        b.reset();
        assert_eq!(b.pause(1.0), 100 * MS);
    }

    #[test]
    fn jitter_stays_in_the_unit_interval() {
        for _ in 0..1_000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }

    /// What the fake connection does in each session, in order; then it stays up.
    #[derive(Clone, Copy, Debug)]
    enum Session {
        Refused,
        ListensThenFails,
    }

    /// Sessions against a scripted connection, on tokio's paused clock: the pauses
    /// between them follow the schedule exactly, waiters hear of the changes a
    /// session reports, and a failure wakes every waiter.
    #[tokio::test(start_paused = true)]
    async fn supervisor_reconnects_on_the_schedule_and_wakes_waiters() {
        let script = [
            Session::Refused,
            Session::Refused,
            Session::ListensThenFails,
            Session::Refused,
        ];
        let started: Arc<Mutex<Vec<tokio::time::Instant>>> = Arc::default();
        let scope = test_scope("/v1/charges", "k1");
        let digest = scope.digest();
        // 1: report a change of `scope`; 2: fail.
        let (step_tx, step_rx) = tokio::sync::watch::channel(0);
        let seen = started.clone();
        let feed = ChangeFeed::spawn_with(
            "the test feed",
            Backoff::new(100 * MS, 1_000 * MS),
            || 1.0,
            move |session| {
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(tokio::time::Instant::now());
                    seen.len() - 1
                };
                let step = script.get(n).copied();
                let mut steps = step_rx.clone();
                let digest = digest.clone();
                async move {
                    match step {
                        Some(Session::Refused) => Err("refused"),
                        Some(Session::ListensThenFails) => {
                            session.listening();
                            steps.wait_for(|s| *s == 1).await.unwrap();
                            session.changed(&digest);
                            steps.wait_for(|s| *s == 2).await.unwrap();
                            Err("connection reset")
                        }
                        None => {
                            session.listening();
                            std::future::pending().await
                        }
                    }
                }
            },
        );
        let t0 = tokio::time::Instant::now();
        assert!(
            feed.ready(Duration::from_secs(1)).await,
            "third session listens"
        );
        // Two refusals: pauses of 100 ms then 200 ms (jitter 1.0: whole steps).
        assert_eq!(t0.elapsed(), 300 * MS);

        let heard = feed.hub().watch(&scope);
        assert!(heard.notifies());
        step_tx.send(1).unwrap();
        heard.await; // the change reached the waiter
        let woken = feed.hub().watch(&scope);
        assert!(woken.notifies());
        step_tx.send(2).unwrap();
        woken.await; // the failure fires every watch
        assert!(!feed.hub().is_live());

        assert!(
            feed.ready(Duration::from_secs(5)).await,
            "fifth session listens"
        );
        let starts = started.lock().unwrap().clone();
        let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        // After the listening session the schedule starts over: 100 ms, then 200 ms.
        assert_eq!(gaps, [100 * MS, 200 * MS, 100 * MS, 200 * MS]);
        feed.stop();
        assert!(!feed.hub().is_live());
    }
}
