//! A small idem store: every record in one ordered map behind one mutex, for one
//! process. It is the example of the guide's page "Write a store", and passes the store
//! contract kit (`tests/contract.rs`). A real store keeps the same rules in its
//! database's own atomic operations.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Ambiguity, ChangeHub, Decision, FencingToken, Lease, ListPage, ListQuery, Record, RecordState,
    Reservation, ReserveRequest, Result, Scope, SharedClock, Store, StoreError, StoredResponse,
    Timestamp, Watch, decide,
};

/// Where a record sits in the map, and in a listing: its tenant, endpoint and key, the
/// order a SQL store's primary key sorts them in.
type Place = (String, String, String);

fn place(scope: &Scope) -> Place {
    (
        scope.tenant().as_str().to_owned(),
        scope.endpoint_str().to_owned(),
        scope.key().as_str().to_owned(),
    )
}

/// A store whose records live in one `BTreeMap` behind one mutex. Each operation holds
/// the mutex from its read to its write, which is what makes `reserve` an
/// insert-if-absent: of any number of callers at once, one finds the key free.
pub struct ToyStore {
    state: Mutex<State>,
    /// The only source of time: the contract kit's clock in its tests.
    clock: SharedClock,
    /// The watches of duplicates waiting for an attempt (SPEC S15).
    changes: ChangeHub,
}

#[derive(Default)]
struct State {
    records: BTreeMap<Place, Record>,
    secrets: HashMap<String, Vec<u8>>,
}

impl State {
    /// The record `lease` may still write: its own attempt's, neither expired nor a
    /// tombstone. Anything else is [`StoreError::Fenced`] (SPEC S7).
    fn fenced(&mut self, lease: &Lease, now: Timestamp) -> Result<&mut Record> {
        match self.records.get_mut(&place(&lease.scope)) {
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

impl ToyStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: SharedClock) -> ToyStore {
        ToyStore {
            state: Mutex::default(),
            clock,
            changes: ChangeHub::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change below is one insert or remove: a panic cannot leave half of one.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Store for ToyStore {
    async fn reserve(&self, req: &ReserveRequest) -> Result<Reservation> {
        let now = self.clock.now();
        let mut state = self.lock();
        let existing = state.records.get(&place(&req.scope)).cloned();
        // A takeover keeps the record's creation and expiry: its TTL counts from the
        // first attempt (SPEC S8).
        let kept = existing
            .as_ref()
            .filter(|r| !r.is_expired(now))
            .map(|r| (r.created_at, r.expires_at));
        let attempt = match decide(existing, &req.fingerprint, now) {
            Decision::Execute { attempt } => attempt,
            Decision::Replay(answer) => return Ok(Reservation::Replay(answer)),
            Decision::InProgress { retry_after } => {
                return Ok(Reservation::InProgress { retry_after });
            }
            Decision::Mismatch => return Ok(Reservation::Mismatch),
            Decision::Gone {
                completed_at,
                status,
            } => {
                return Ok(Reservation::Gone {
                    completed_at,
                    status,
                });
            }
        };
        let token = FencingToken::generate();
        let lease_until = now.plus(req.lease);
        let (created_at, expires_at) = match kept {
            Some((created, expires)) => (created, expires.max(lease_until)),
            None => (now, req.expires_at(now)),
        };
        state.records.insert(
            place(&req.scope),
            Record {
                scope: req.scope.clone(),
                fingerprint: req.fingerprint,
                created_at,
                expires_at,
                attempt,
                token,
                state: RecordState::InProgress { lease_until },
                tombstone_until: None,
                in_progress_ambiguity: None,
            },
        );
        Ok(Reservation::Acquired(req.lease_for(token, attempt)))
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        let now = self.clock.now();
        {
            let mut state = self.lock();
            let record = state.fenced(lease, now)?;
            // The same lease completing again keeps the first answer (SPEC S9).
            if record.is_completed() {
                return Ok(());
            }
            record.state = RecordState::Completed {
                response: response.clone(),
                completed_at: now,
            };
            record.in_progress_ambiguity = None;
            record.expires_at = lease.completed_expires_at(record.created_at, record.expires_at);
            record.tombstone_until = lease.tombstone_until(record.expires_at);
        }
        self.changes.notify(&lease.scope);
        Ok(())
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        let now = self.clock.now();
        let mut state = self.lock();
        let record = state.fenced(lease, now)?;
        let RecordState::InProgress { lease_until } = &mut record.state else {
            return Err(StoreError::Fenced);
        };
        *lease_until = now.plus(lease_for);
        record.expires_at = record.expires_at.max(now.plus(lease_for));
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let now = self.clock.now();
        {
            let mut state = self.lock();
            if state.fenced(lease, now)?.is_completed() {
                return Err(StoreError::Fenced);
            }
            state.records.remove(&place(&lease.scope));
        }
        self.changes.notify(&lease.scope);
        Ok(())
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: Ambiguity) -> Result<()> {
        let now = self.clock.now();
        let mut state = self.lock();
        let record = state.fenced(lease, now)?;
        if record.is_completed() {
            return Err(StoreError::Fenced);
        }
        record.in_progress_ambiguity = Some(reason);
        Ok(())
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        Ok(self.lock().records.get(&place(scope)).cloned())
    }

    async fn remove(&self, scope: &Scope) -> Result<bool> {
        let removed = self.lock().records.remove(&place(scope)).is_some();
        if removed {
            self.changes.notify(scope);
        }
        Ok(removed)
    }

    /// Deletes the first `limit` expired records, or compacts each that keeps a
    /// tombstone into it (SPEC S16). A scan of the whole map: a real store reads an
    /// index on the expiry instead.
    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut expired: Vec<(Timestamp, Place)> = state
            .records
            .iter()
            .filter(|(_, r)| r.is_expired(now))
            .map(|(p, r)| (r.expires_at, p.clone()))
            .collect();
        expired.sort_unstable();
        expired.truncate(limit);
        for (_, p) in &expired {
            if let Some(record) = state.records.remove(p)
                && !record.is_purgeable(now)
            {
                state.records.insert(p.clone(), record.into_tombstone(now));
            }
        }
        Ok(expired.len())
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        let mut state = self.lock();
        let secret = state
            .secrets
            .entry(name.to_owned())
            .or_insert_with(|| candidate.to_vec());
        Ok(secret.clone())
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        let now = self.clock.now();
        let from = match &query.after {
            Some(cursor) => {
                let [tenant, endpoint, key] = cursor.scope_parts()?;
                Bound::Excluded((tenant, endpoint, key))
            }
            None => Bound::Unbounded,
        };
        let state = self.lock();
        let mut read: Vec<Record> = state
            .records
            .range((from, Bound::Unbounded))
            .map(|(_, r)| r)
            .filter(|r| query.matches(r, now))
            .take(query.limit() + 1)
            .cloned()
            .collect();
        let more = read.len() > query.limit();
        read.truncate(query.limit());
        Ok(ListPage::in_scope_order(read, more, query, now))
    }

    fn watch(&self, scope: &Scope) -> Watch {
        self.changes.watch(scope)
    }
}
