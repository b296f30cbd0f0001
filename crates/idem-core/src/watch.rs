//! [`Watch`] and [`ChangeHub`]: how a duplicate waiting for an in-progress attempt
//! learns that the attempt's record was completed or released (SPEC S15).
//!
//! A wake is a hint, never an answer: whoever is woken reserves again through
//! [`Store::reserve`](crate::Store::reserve), which says whether there is a replay, a
//! key to execute, or still an attempt in progress. So a lost or spurious wake costs
//! latency, never correctness, and a store without notifications answers
//! [`Watch::poll`], which tells the waiter to ask again at a backoff.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};

use crate::Scope;

/// A hint that a scope's record may have changed, from [`Store::watch`](crate::Store::watch).
///
/// A `Watch` is a future that resolves once the store saw the scope's record
/// completed, released or removed after the watch was made; one from
/// [`Watch::poll`] never resolves, and its owner polls instead ([`notifies`](Self::notifies)
/// says which). Make the watch *before* reserving again, so that a change between the
/// reserve and the wait is not missed. Dropping it unregisters it.
#[must_use = "a watch does nothing unless awaited"]
pub struct Watch {
    registration: Option<Registration>,
}

struct Registration {
    hub: Weak<HubInner>,
    digest: String,
    id: u64,
    entry: Arc<Entry>,
    misses_nothing: bool,
}

#[derive(Default)]
struct Entry {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Entry {
    fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl Watch {
    /// A watch that never fires: the store cannot tell when a record changes (or cannot
    /// now, its notification channel being down), so the waiter polls at a backoff.
    pub fn poll() -> Watch {
        Watch { registration: None }
    }

    /// Whether this watch can fire; `false` for [`Watch::poll`].
    pub fn notifies(&self) -> bool {
        self.registration.is_some()
    }

    /// Whether this watch fires for every way the attempt can stop holding the key (a
    /// lapsed lease included), and whenever its source cannot look: from a
    /// [`ChangeHub::polling`] hub. Its waiter then needs no fallback reserve of its own
    /// while it waits; a watch fed by notifications, which can be lost, does.
    pub fn misses_nothing(&self) -> bool {
        self.registration.as_ref().is_some_and(|r| r.misses_nothing)
    }
}

impl Future for Watch {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(registration) = &self.registration else {
            return Poll::Pending;
        };
        let entry = &registration.entry;
        if entry.fired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        *entry.waker.lock().unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
        // Fired between the first look and the waker's registration.
        if entry.fired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let Some(registration) = self.registration.take() else {
            return;
        };
        let Some(hub) = registration.hub.upgrade() else {
            return;
        };
        let mut watchers = hub.lock();
        if let Some(entries) = watchers.get_mut(&registration.digest) {
            entries.retain(|(id, _)| *id != registration.id);
            if entries.is_empty() {
                watchers.remove(&registration.digest);
            }
        }
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("notifies", &self.notifies())
            .finish_non_exhaustive()
    }
}

type Watchers = HashMap<String, Vec<(u64, Arc<Entry>)>>;

struct HubInner {
    watchers: Mutex<Watchers>,
    next: AtomicU64,
    live: AtomicBool,
    /// Fed by a poller that reads every watched record's state ([`ChangeHub::polling`]).
    polled: bool,
}

impl HubInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The watches of one process on one store, keyed by [`Scope::digest`]: a store
/// [`notify`](Self::notify)s it when it completes, releases or removes a record (the
/// memory and SQLite stores, in process), or feeds it what its server tells it of other
/// instances' writes (PostgreSQL `LISTEN`, Redis pub/sub) through
/// [`notify_digest`](Self::notify_digest).
///
/// While a store's notification channel is down it marks the hub not
/// [`live`](Self::set_live): every watch fires (its waiter reserves again and then
/// polls) and new watches are [`Watch::poll`] until the channel is back.
///
/// Cheap to clone; clones share their watches.
///
/// # Examples
///
/// ```
/// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// # rt.block_on(async {
/// use idem_core::{ChangeHub, Endpoint, Key, Scope, ScopeMode, Tenant};
///
/// let hub = ChangeHub::new();
/// let key = Key::new("k1").unwrap();
/// let endpoint = Endpoint::new("POST", "/v1/charges");
/// let scope = Scope::new(ScopeMode::Public, Tenant::anonymous(), endpoint, key);
/// let watch = hub.watch(&scope);
/// assert!(watch.notifies());
/// hub.notify(&scope);
/// watch.await; // resolves: the record changed
/// # });
/// ```
#[derive(Clone)]
pub struct ChangeHub {
    inner: Arc<HubInner>,
}

impl Default for ChangeHub {
    fn default() -> Self {
        ChangeHub::new()
    }
}

impl ChangeHub {
    /// A hub with no watches, live.
    pub fn new() -> ChangeHub {
        ChangeHub::with(false)
    }

    /// A hub fed by a poller that asks the store's server, for every
    /// [`watched`](Self::watched_digests) scope, whether a live attempt still holds its
    /// record, and [`notify_digest`](Self::notify_digest)s every one that is not; and
    /// that, when it cannot ask, fires them all. Such a poller misses no way an attempt
    /// ends (a lapsed lease included), so its watches say they
    /// [`miss nothing`](Watch::misses_nothing) and their waiters do not reserve again on
    /// a timer of their own. Live, with no watches.
    pub fn polling() -> ChangeHub {
        ChangeHub::with(true)
    }

    fn with(polled: bool) -> ChangeHub {
        ChangeHub {
            inner: Arc::new(HubInner {
                watchers: Mutex::new(HashMap::new()),
                next: AtomicU64::new(0),
                live: AtomicBool::new(true),
                polled,
            }),
        }
    }

    /// A watch on `scope` that fires at the next [`notify`](Self::notify) of it;
    /// [`Watch::poll`] while the hub is not live.
    pub fn watch(&self, scope: &Scope) -> Watch {
        self.watch_digest(scope.digest())
    }

    /// [`watch`](Self::watch) by the scope's [`digest`](Scope::digest).
    pub fn watch_digest(&self, digest: String) -> Watch {
        if !self.is_live() {
            return Watch::poll();
        }
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry::default());
        self.inner
            .lock()
            .entry(digest.clone())
            .or_default()
            .push((id, entry.clone()));
        Watch {
            registration: Some(Registration {
                hub: Arc::downgrade(&self.inner),
                digest,
                id,
                entry,
                misses_nothing: self.inner.polled,
            }),
        }
    }

    /// Fires every watch on `scope`. Costs one lock and no hashing while nobody
    /// watches anything.
    pub fn notify(&self, scope: &Scope) {
        if self.inner.lock().is_empty() {
            return;
        }
        self.notify_digest(&scope.digest());
    }

    /// Fires every watch on the scope whose [`digest`](Scope::digest) this is.
    pub fn notify_digest(&self, digest: &str) {
        let entries = self.inner.lock().remove(digest);
        for (_, entry) in entries.into_iter().flatten() {
            entry.fire();
        }
    }

    /// Whether any watch is registered: a store that must pay to notify (a round
    /// trip) may skip it when nothing in this process watches and no other process can.
    pub fn is_watched(&self) -> bool {
        !self.inner.lock().is_empty()
    }

    /// The [`digest`](Scope::digest)s of the scopes watched now, each once: what a store
    /// that cannot be told of changes asks its server about, to
    /// [`notify_digest`](Self::notify_digest) those that changed.
    pub fn watched_digests(&self) -> Vec<String> {
        self.inner.lock().keys().cloned().collect()
    }

    /// How many watches are registered.
    pub fn watches(&self) -> usize {
        self.inner.lock().values().map(Vec::len).sum()
    }

    /// Whether the hub hears of every change now.
    pub fn is_live(&self) -> bool {
        self.inner.live.load(Ordering::Acquire)
    }

    /// Says whether the store's notification channel is up. Going down fires every
    /// watch, so that no waiter sleeps on a channel that will not speak.
    pub fn set_live(&self, live: bool) {
        let was = self.inner.live.swap(live, Ordering::AcqRel);
        if was && !live {
            let all = std::mem::take(&mut *self.inner.lock());
            for (_, entry) in all.into_values().flatten() {
                entry.fire();
            }
        }
    }
}

impl std::fmt::Debug for ChangeHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeHub")
            .field("watches", &self.watches())
            .field("live", &self.is_live())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::test_scope;

    async fn fired(watch: &mut Watch) -> bool {
        tokio::time::timeout(Duration::from_millis(50), watch)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_notify_fires_the_scopes_watches_only() {
        let hub = ChangeHub::new();
        let (a, b) = (test_scope("/w", "a"), test_scope("/w", "b"));
        let (mut wa1, mut wa2, mut wb) = (hub.watch(&a), hub.watch(&a), hub.watch(&b));
        assert_eq!(hub.watches(), 3);
        let mut watched = hub.watched_digests();
        watched.sort();
        let mut expected = vec![a.digest(), b.digest()];
        expected.sort();
        assert_eq!(watched, expected, "each watched scope once");
        hub.notify(&a);
        assert!(fired(&mut wa1).await && fired(&mut wa2).await);
        assert!(!fired(&mut wb).await, "another scope's watch stays");
        assert_eq!(hub.watches(), 1);
    }

    #[tokio::test]
    async fn a_dropped_watch_unregisters() {
        let hub = ChangeHub::new();
        let watch = hub.watch(&test_scope("/w", "a"));
        assert!(hub.is_watched());
        drop(watch);
        assert!(!hub.is_watched());
    }

    #[tokio::test]
    async fn going_down_fires_everything_and_later_watches_poll() {
        let hub = ChangeHub::new();
        let mut watch = hub.watch(&test_scope("/w", "a"));
        hub.set_live(false);
        assert!(fired(&mut watch).await);
        let mut later = hub.watch(&test_scope("/w", "a"));
        assert!(!later.notifies());
        assert!(!fired(&mut later).await);
        hub.set_live(true);
        assert!(hub.watch(&test_scope("/w", "a")).notifies());
    }

    #[test]
    fn only_a_polling_hubs_watches_miss_nothing() {
        let scope = test_scope("/w", "a");
        assert!(!ChangeHub::new().watch(&scope).misses_nothing());
        assert!(ChangeHub::polling().watch(&scope).misses_nothing());
        assert!(!Watch::poll().misses_nothing());
        let hub = ChangeHub::polling();
        hub.set_live(false);
        assert!(!hub.watch(&scope).misses_nothing(), "a poll watch");
    }

    #[tokio::test]
    async fn a_poll_watch_never_fires() {
        let mut watch = Watch::poll();
        assert!(!watch.notifies());
        assert!(!fired(&mut watch).await);
    }
}
