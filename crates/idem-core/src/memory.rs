//! An in-memory store for one process: tests, development, and single-instance
//! deployments that accept losing records on restart.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    ChangeHub, Decision, Lease, ListPage, ListQuery, Record, RecordState, Reservation,
    ReserveRequest, Result, Scope, SharedClock, Store, StoreError, StoreMetric, StoredResponse,
    SystemClock, Timestamp, Watch, decide, record::FencingToken,
};

/// The default bound on [`MemoryStore`] entries.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// The most shards a store splits its records into.
const MAX_SHARDS: usize = 64;

/// The fewest entries a shard is bounded to when a store has more than one.
const MIN_SHARD_ENTRIES: usize = 1024;

/// A bounded in-memory store; atomicity comes from a mutex around each shard of the map.
///
/// A record's scope picks its shard through a randomly keyed hash, and every operation
/// on that scope runs under that shard's mutex alone. One map behind one mutex stalled
/// every caller whenever it grew or rehashed: at 100 000 records that took 25–50 ms,
/// with the lock held. Shards grow a little at a time, and two callers rarely wait for
/// each other.
///
/// When full, it first drops expired records, then the completed record closest to
/// expiry (a retry of that key would execute again, as after expiry). In-progress
/// records are never evicted: with only those left, `reserve` fails with
/// [`StoreError::Full`] rather than risk a second execution. Each record dropped
/// before it expired is counted (`idem_memory_evictions_total` in
/// [`Store::metrics`]), and the first is logged as a warning.
///
/// A store bounded to 2048 entries or more keeps the bound per shard (the shards'
/// bounds add up to it) and makes room in the new record's shard. So it may start
/// dropping records a little before it holds its whole bound (at the default bound,
/// from about 93 000 records on), and the record it drops is the one closest to expiry
/// in its shard, among the closest overall. A smaller store has one shard and follows
/// the rule exactly.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    shards: Arc<Shards>,
    clock: SharedClock,
    /// The watches of duplicates waiting for an attempt (SPEC S15).
    changes: ChangeHub,
}

#[derive(Debug)]
struct Shards {
    shards: Box<[Mutex<Inner>]>,
    /// Picks a scope's shard; keyed at random, so that nobody can aim keys at one shard.
    hasher: RandomState,
    max_entries: usize,
    /// Completed records dropped before they expired, to make room.
    evictions: AtomicU64,
    /// Whether the first such drop has been logged.
    warned: AtomicBool,
    /// [`Store::init_secret`]'s secrets: apart from the records, never evicted.
    secrets: Mutex<HashMap<String, Vec<u8>>>,
}

impl Shards {
    fn new(max_entries: usize) -> Shards {
        let count = (max_entries / MIN_SHARD_ENTRIES).clamp(1, MAX_SHARDS);
        Shards {
            shards: (0..count).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            max_entries,
            evictions: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            secrets: Mutex::default(),
        }
    }

    /// Counts a completed record dropped before it expired, and says so in the log the
    /// first time: from then on, some retries execute again.
    fn evicted(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_entries = self.max_entries,
                "the in-memory idempotency store is full: it now drops completed records \
                 before they expire, and a retry of a dropped key executes again; raise its \
                 bound or use a durable store"
            );
        }
    }

    /// The shard of `scope`, locked, and the bound on its entries.
    fn lock(&self, scope: &Scope) -> (MutexGuard<'_, Inner>, usize) {
        let count = self.shards.len();
        // Not a power of two in general: the remainder of a 64-bit hash is as even.
        let i = (self.hasher.hash_one(scope) % count as u64) as usize;
        // The first `max_entries % count` shards hold one entry more, so that the
        // bounds add up to `max_entries`.
        let bound = self.max_entries / count + usize::from(i < self.max_entries % count);
        (lock(&self.shards[i]), bound)
    }
}

/// Locks `shard`. A panic while holding the lock cannot leave a record half-written:
/// every mutation is a single insert/remove. Keep serving.
fn lock(shard: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<Scope, Record>,
    by_expiry: BTreeSet<(Timestamp, Scope)>,
}

impl Inner {
    fn insert(&mut self, record: Record) {
        let entry = (record.expires_at, record.scope.clone());
        // One lookup for the common case, a new key. A record replaced (a takeover)
        // keeps its index entry when the expiry is unchanged: that entry is the new
        // record's too, and removing it would leave a record that is never purged.
        if let Some(old) = self.records.insert(record.scope.clone(), record)
            && old.expires_at != entry.0
        {
            self.unindex(&old);
        }
        self.by_expiry.insert(entry);
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

    /// The first `limit` records to expire by `until`, in the order they expired.
    fn expired(&self, until: Timestamp, limit: usize) -> impl Iterator<Item = &(Timestamp, Scope)> {
        self.by_expiry
            .iter()
            .take_while(move |(at, _)| *at <= until)
            .take(limit)
    }

    /// Purges the first `limit` records to expire by `until`, at `now`: deletes each,
    /// or compacts it into its tombstone ([`Inner::purge_one`]). Returns how many.
    fn purge(&mut self, until: Timestamp, now: Timestamp, limit: usize) -> usize {
        let expired: Vec<Scope> = self.expired(until, limit).map(|(_, s)| s.clone()).collect();
        for s in &expired {
            self.purge_one(s, now);
        }
        expired.len()
    }

    /// Deletes an expired record, or compacts it into its tombstone (SPEC S16), which
    /// lives on under its own expiry.
    fn purge_one(&mut self, scope: &Scope, now: Timestamp) {
        match self.remove(scope) {
            Some(r) if !r.is_purgeable(now) => self.insert(r.into_tombstone(now)),
            _ => {}
        }
    }

    /// Makes room for one more record, or says it cannot. `true` when that took
    /// dropping a record that had not expired.
    fn make_room(&mut self, now: Timestamp, max: usize) -> Result<bool> {
        if self.records.len() < max {
            return Ok(false);
        }
        // An expired record makes room, unless it is compacted into a tombstone.
        self.purge(now, now, 1);
        if self.records.len() < max {
            return Ok(false);
        }
        let victim = self
            .by_expiry
            .iter()
            .find(|(_, s)| {
                self.records
                    .get(s)
                    .is_some_and(|r| !matches!(r.state, RecordState::InProgress { .. }))
            })
            .map(|(_, s)| s.clone());
        match victim {
            Some(s) => {
                self.remove(&s);
                Ok(true)
            }
            None => Err(StoreError::Full),
        }
    }

    /// The record for `lease`, if `lease` still holds it.
    fn fenced(&mut self, lease: &Lease, now: Timestamp) -> Result<&mut Record> {
        match self.records.get_mut(&lease.scope) {
            // A tombstone is what is left once the record the lease wrote expired.
            Some(r)
                if r.token == lease.token
                    && !r.is_expired(now)
                    && !matches!(r.state, RecordState::Tombstone { .. }) =>
            {
                Ok(r)
            }
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
            shards: Arc::new(Shards::new(DEFAULT_MAX_ENTRIES)),
            clock,
            changes: ChangeHub::new(),
        }
    }

    /// Sets the bound on entries (at least 1). The returned store starts with copies of
    /// the records held so far, and a bound below their count is kept as records
    /// arrive. Clones made before this call go on with the old bound and records of
    /// their own, so set the bound before sharing the store.
    pub fn max_entries(self, max: usize) -> MemoryStore {
        let shards = Shards::new(max.max(1));
        for shard in self.shards.shards.iter() {
            for record in lock(shard).records.values() {
                shards.lock(&record.scope).0.insert(record.clone());
            }
        }
        MemoryStore {
            shards: Arc::new(shards),
            clock: self.clock,
            changes: self.changes,
        }
    }

    /// How many records are held, expired ones included.
    pub fn len(&self) -> usize {
        self.shards
            .shards
            .iter()
            .map(|shard| lock(shard).records.len())
            .sum()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard of `scope`, locked, and the bound on its entries.
    fn lock(&self, scope: &Scope) -> (MutexGuard<'_, Inner>, usize) {
        self.shards.lock(scope)
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn watch(&self, scope: &Scope) -> Watch {
        self.changes.watch(scope)
    }

    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation> {
        let now = self.clock.now();
        let (mut inner, bound) = self.lock(&req.scope);
        let existing = inner.records.get(&req.scope).cloned();
        // A live record that is taken over keeps its creation and expiry times.
        let kept = existing
            .as_ref()
            .filter(|r| !r.is_expired(now))
            .map(|r| (r.created_at, r.expires_at));
        let existing_expired = existing.is_some() && kept.is_none();
        match decide(existing, &req.fingerprint, now) {
            Decision::Execute { attempt } => {
                let token = FencingToken::generate();
                let lease_until = now.plus(req.lease);
                let (created_at, expires_at) = match kept {
                    Some((created_at, expires_at)) => (created_at, expires_at.max(lease_until)),
                    None => {
                        // An expired record goes before room is made.
                        if existing_expired {
                            inner.remove(&req.scope);
                        }
                        if inner.make_room(now, bound)? {
                            self.shards.evicted();
                        }
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
                    tombstone_until: None,
                    in_progress_ambiguity: None,
                });
                Ok(Reservation::Acquired(req.lease_for(token, attempt)))
            }
            Decision::Replay(r) => Ok(Reservation::Replay(r)),
            Decision::InProgress { retry_after } => Ok(Reservation::InProgress { retry_after }),
            Decision::Mismatch => Ok(Reservation::Mismatch),
            Decision::Gone {
                completed_at,
                status,
            } => Ok(Reservation::Gone {
                completed_at,
                status,
            }),
        }
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        let now = self.clock.now();
        {
            let (mut inner, _) = self.lock(&lease.scope);
            let record = inner.fenced(lease, now)?;
            if record.is_completed() {
                return Ok(());
            }
            record.state = RecordState::Completed {
                response: response.clone(),
                completed_at: now,
            };
            record.in_progress_ambiguity = None;
            let expires_at = lease.completed_expires_at(record.created_at, record.expires_at);
            record.tombstone_until = lease.tombstone_until(expires_at);
            inner.set_expiry(&lease.scope, expires_at);
        }
        self.changes.notify(&lease.scope);
        Ok(())
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        let now = self.clock.now();
        let (mut inner, _) = self.lock(&lease.scope);
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
        {
            let (mut inner, _) = self.lock(&lease.scope);
            let record = inner.fenced(lease, now)?;
            if record.is_completed() {
                return Err(StoreError::Fenced);
            }
            inner.remove(&lease.scope);
        }
        self.changes.notify(&lease.scope);
        Ok(())
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: crate::Ambiguity) -> Result<()> {
        let now = self.clock.now();
        let (mut inner, _) = self.lock(&lease.scope);
        let record = inner.fenced(lease, now)?;
        if record.is_completed() {
            return Err(StoreError::Fenced);
        }
        record.in_progress_ambiguity = Some(reason);
        Ok(())
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        Ok(self.lock(scope).0.records.get(scope).cloned())
    }

    async fn remove(&self, scope: &Scope) -> Result<bool> {
        let removed = self.lock(scope).0.remove(scope).is_some();
        if removed {
            self.changes.notify(scope);
        }
        Ok(removed)
    }

    /// Purges what one map would: the `limit` records that expired first, ties in scope
    /// order, as the SQL stores' expiry index does. With more than `limit` expired, the
    /// `limit`-th expiry across the shards is the cutoff: every record that expired
    /// before it goes, then as many of those that expired at it as the limit leaves.
    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        let now = self.clock.now();
        let shards = &self.shards.shards;
        let mut times: Vec<Timestamp> = Vec::new();
        for shard in shards.iter() {
            times.extend(lock(shard).expired(now, limit).map(|(at, _)| *at));
        }
        // Counted against `limit` as they go: records may expire meanwhile.
        let mut purged = 0;
        if times.len() <= limit {
            for shard in shards.iter() {
                purged += lock(shard).purge(now, now, limit - purged);
            }
            return Ok(purged);
        }
        let (_, &mut cutoff, _) = times.select_nth_unstable(limit - 1);
        let before = Timestamp::from_millis(cutoff.as_millis() - 1);
        for shard in shards.iter() {
            purged += lock(shard).purge(before, now, limit - purged);
        }
        let mut ties: Vec<(Timestamp, Scope)> = Vec::new();
        for shard in shards.iter() {
            ties.extend(lock(shard).expired(cutoff, limit - purged).cloned());
        }
        ties.sort_unstable();
        ties.truncate(limit - purged);
        for entry in ties {
            let (mut inner, _) = self.lock(&entry.1);
            // Unless renewed, replaced or purged since.
            if inner.by_expiry.contains(&entry) {
                inner.purge_one(&entry.1, now);
                purged += 1;
            }
        }
        Ok(purged)
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    /// Kept in the process, with the records: a restart generates another.
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        let mut secrets = self
            .shards
            .secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Ok(secrets
            .entry(name.to_owned())
            .or_insert_with(|| candidate.to_vec())
            .clone())
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        self.list_page(query)
    }

    fn metrics(&self) -> Vec<StoreMetric> {
        vec![
            StoreMetric::gauge(
                "idem_memory_records",
                "Records the in-memory store holds, expired ones not yet purged included.",
                self.len() as u64,
            ),
            StoreMetric::gauge(
                "idem_memory_max_records",
                "The most records the in-memory store holds.",
                self.shards.max_entries as u64,
            ),
            StoreMetric::counter(
                "idem_memory_evictions_total",
                "Completed records the in-memory store dropped before they expired, to make \
                 room; a retry of one executes again.",
                self.shards.evictions.load(Ordering::Relaxed),
            ),
        ]
    }
}

mod list;
#[cfg(test)]
mod tests;
