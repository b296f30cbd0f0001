//! An in-memory store for one process: tests, development, and single-instance
//! deployments that accept losing records on restart.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Decision, Lease, Record, RecordState, Reservation, ReserveRequest, Result, Scope, SharedClock,
    Store, StoreError, StoredResponse, SystemClock, Timestamp, decide, record::FencingToken,
};

/// The default bound on [`MemoryStore`] entries.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// A bounded in-memory store; atomicity comes from one mutex around the map.
///
/// When full, it first drops expired records, then the completed record closest to
/// expiry (a retry of that key would execute again, as after expiry). In-progress
/// records are never evicted: with only those left, `reserve` fails with
/// [`StoreError::Full`] rather than risk a second execution.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    clock: SharedClock,
    max_entries: usize,
}

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<Scope, Record>,
    by_expiry: BTreeSet<(Timestamp, Scope)>,
}

impl Inner {
    fn insert(&mut self, record: Record) {
        // Unindex the old record first: a takeover may keep the same expiry, and
        // removing its index entry after adding the new one would drop both, leaving a
        // record that is never purged.
        if let Some(old) = self.records.remove(&record.scope) {
            self.unindex(&old);
        }
        self.by_expiry
            .insert((record.expires_at, record.scope.clone()));
        self.records.insert(record.scope.clone(), record);
    }

    fn unindex(&mut self, old: &Record) {
        self.by_expiry.remove(&(old.expires_at, old.scope.clone()));
    }

    fn remove(&mut self, scope: &Scope) -> Option<Record> {
        let old = self.records.remove(scope)?;
        self.unindex(&old);
        Some(old)
    }

    fn set_expiry(&mut self, scope: &Scope, expires_at: Timestamp) {
        if let Some(r) = self.records.get_mut(scope)
            && r.expires_at != expires_at
        {
            self.by_expiry.remove(&(r.expires_at, scope.clone()));
            r.expires_at = expires_at;
            self.by_expiry.insert((expires_at, scope.clone()));
        }
    }

    fn purge(&mut self, now: Timestamp, limit: usize) -> usize {
        let expired: Vec<Scope> = self
            .by_expiry
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(limit)
            .map(|(_, s)| s.clone())
            .collect();
        for s in &expired {
            self.remove(s);
        }
        expired.len()
    }

    /// Makes room for one more record, or says it cannot.
    fn make_room(&mut self, now: Timestamp, max: usize) -> Result<()> {
        if self.records.len() < max {
            return Ok(());
        }
        if self.purge(now, 1) == 1 {
            return Ok(());
        }
        let victim = self
            .by_expiry
            .iter()
            .find(|(_, s)| self.records.get(s).is_some_and(Record::is_completed))
            .map(|(_, s)| s.clone());
        match victim {
            Some(s) => {
                self.remove(&s);
                Ok(())
            }
            None => Err(StoreError::Full),
        }
    }

    /// The record for `lease`, if `lease` still holds it.
    fn fenced(&mut self, lease: &Lease, now: Timestamp) -> Result<&mut Record> {
        match self.records.get_mut(&lease.scope) {
            Some(r) if r.token == lease.token && !r.is_expired(now) => Ok(r),
            _ => Err(StoreError::Fenced),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store on the system clock bounded to [`DEFAULT_MAX_ENTRIES`].
    pub fn new() -> MemoryStore {
        MemoryStore::with_clock(Arc::new(SystemClock))
    }

    /// A store reading time from `clock`.
    pub fn with_clock(clock: SharedClock) -> MemoryStore {
        MemoryStore {
            inner: Arc::default(),
            clock,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }

    /// Sets the bound on entries (at least 1).
    pub fn max_entries(mut self, max: usize) -> MemoryStore {
        self.max_entries = max.max(1);
        self
    }

    /// How many records are held, expired ones included.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a record half-written: every
        // mutation is a single insert/remove. Keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation> {
        let now = self.clock.now();
        let mut inner = self.lock();
        let existing = inner.records.get(&req.scope).cloned();
        // A live record that is taken over keeps its creation and expiry times.
        let kept = existing
            .as_ref()
            .filter(|r| !r.is_expired(now))
            .map(|r| (r.created_at, r.expires_at));
        match decide(existing, &req.fingerprint, now) {
            Decision::Execute { attempt } => {
                let token = FencingToken::generate();
                let lease_until = now.plus(req.lease);
                let (created_at, expires_at) = match kept {
                    Some((created_at, expires_at)) => (created_at, expires_at.max(lease_until)),
                    None => {
                        inner.remove(&req.scope);
                        inner.make_room(now, self.max_entries)?;
                        (now, req.expires_at(now))
                    }
                };
                inner.insert(Record {
                    scope: req.scope.clone(),
                    fingerprint: req.fingerprint,
                    created_at,
                    expires_at,
                    attempt,
                    token,
                    state: RecordState::InProgress { lease_until },
                });
                Ok(Reservation::Acquired(Lease {
                    scope: req.scope.clone(),
                    token,
                    attempt,
                }))
            }
            Decision::Replay(r) => Ok(Reservation::Replay(r)),
            Decision::InProgress { retry_after } => Ok(Reservation::InProgress { retry_after }),
            Decision::Mismatch => Ok(Reservation::Mismatch),
        }
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        let now = self.clock.now();
        let mut inner = self.lock();
        let record = inner.fenced(lease, now)?;
        if record.is_completed() {
            return Ok(());
        }
        record.state = RecordState::Completed {
            response: response.clone(),
            completed_at: now,
        };
        Ok(())
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        let now = self.clock.now();
        let mut inner = self.lock();
        let record = inner.fenced(lease, now)?;
        let RecordState::InProgress { lease_until } = &mut record.state else {
            return Err(StoreError::Fenced);
        };
        *lease_until = now.plus(lease_for);
        let expires_at = record.expires_at.max(now.plus(lease_for));
        inner.set_expiry(&lease.scope, expires_at);
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let now = self.clock.now();
        let mut inner = self.lock();
        let record = inner.fenced(lease, now)?;
        if record.is_completed() {
            return Err(StoreError::Fenced);
        }
        inner.remove(&lease.scope);
        Ok(())
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        Ok(self.lock().records.get(scope).cloned())
    }

    async fn remove(&self, scope: &Scope) -> Result<bool> {
        Ok(self.lock().remove(scope).is_some())
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        let now = self.clock.now();
        Ok(self.lock().purge(now, limit))
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{test_fingerprint, test_scope};
    use crate::{Clock, ManualClock};

    #[tokio::test]
    async fn takeover_that_keeps_the_expiry_stays_purgeable() {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let req = ReserveRequest::new(test_scope("/x", "k"), test_fingerprint("{}"))
            .ttl(Duration::from_secs(90))
            .lease(Duration::from_secs(30));
        let expires_at = req.expires_at(clock.now());
        assert!(store.reserve(&req).await.unwrap().lease().is_some());
        clock.advance(Duration::from_secs(30));
        let Reservation::Acquired(l) = store.reserve(&req).await.unwrap() else {
            panic!("lapsed lease is taken over")
        };
        assert_eq!(l.attempt, 2);
        let record = store.get(&req.scope).await.unwrap().unwrap();
        assert_eq!(
            record.expires_at, expires_at,
            "the takeover kept the expiry"
        );
        clock.set(expires_at);
        assert_eq!(store.purge_expired(10).await.unwrap(), 1);
        assert!(store.is_empty());
    }
}
