//! [`Sealed`]: a store whose recorded answers are sealed at rest (SPEC S17).

use std::time::Duration;

use async_trait::async_trait;

use crate::seal::SealBinding;
use crate::{
    Ambiguity, FencingToken, Lease, ListPage, ListQuery, Record, RecordKeys, RecordState,
    Reservation, ReserveRequest, Result, Scope, Store, StoreMetric, StoredResponse,
};

/// A store that seals every answer it records with [`RecordKeys`] and opens every
/// answer it reads, over any other store.
///
/// Every path by which an answer enters or leaves a store goes through it:
/// [`complete`](Store::complete) seals under the current key, bound to the record's
/// scope, the request's fingerprint and the attempt's fencing token
/// ([`SealBinding`](crate::seal::SealBinding));
/// [`reserve`](Store::reserve)'s replay and [`get`](Store::get)'s completed record are
/// opened with the key their answer names, and the binding of the record that holds it. An answer that cannot be opened (a key id
/// the ring lacks, changed bytes, status or scope) is [`StoreError::Sealed`](crate::StoreError::Sealed) and an
/// error in the log, never a record that is absent: the operation ran, and must not run
/// again. So is an answer the store holds unsealed (written around this wrapper, or
/// recorded before sealing was turned on), unless [`read_unsealed`](Sealed::read_unsealed)
/// allows it while such answers age out.
///
/// Everything else (status, fingerprint, scope, times) is the inner store's and stays
/// in plain text there, and so do the id of the sealing key and the reason an answer's
/// outcome is ambiguous ([`StoredResponse::ambiguity`], a label such as
/// `answer_too_large`, kept sealed too), so that a listing of ambiguous records
/// ([`Store::list`]) finds sealed ones by the store's index. The reference, the trace
/// context and the trailers are sealed with the headers and the body.
///
/// # Completing in the caller's transaction (SPEC S9)
///
/// The SQL stores' `complete_in` writes an answer without [`Store::complete`]: seal it
/// first with [`seal`](Self::seal), and call `complete_in` on [`inner`](Self::inner):
///
/// ```ignore
/// let sealed = store.seal(&lease, &response);
/// store.inner().complete_in(&mut tx, &lease, &sealed).await?;
/// ```
///
/// (An answer completed in plain text there is refused on replay, as any unsealed one.)
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use idem_core::*;
///
/// let keys = RecordKeys::new([("k1", [7u8; 32])]).unwrap();
/// let store = Sealed::new(MemoryStore::new(), keys);
/// let scope = Scope::from_parts(
///     Tenant::new("t"),
///     None,
///     Key::parse(b"\"a-key\"").unwrap(),
/// );
/// let fp = Fingerprint::compute("POST", "/", None, b"{}", &FingerprintOptions::default());
/// let request = ReserveRequest::new(scope.clone(), fp);
/// let Reservation::Acquired(lease) = store.reserve(&request).await.unwrap() else {
///     unreachable!()
/// };
/// store.complete(&lease, &StoredResponse::new(201, "card 4242")).await.unwrap();
///
/// // The inner store holds ciphertext; the sealed one replays the answer.
/// let raw = store.inner().get(&scope).await.unwrap().unwrap();
/// let RecordState::Completed { response, .. } = raw.state else { unreachable!() };
/// assert!(!response.body.windows(4).any(|w| w == b"4242"));
/// match store.reserve(&request).await.unwrap() {
///     Reservation::Replay(r) => assert_eq!(r.body, "card 4242"),
///     other => panic!("{other:?}"),
/// }
/// # });
/// ```
pub struct Sealed<S> {
    inner: S,
    keys: RecordKeys,
    read_unsealed: bool,
}

impl<S: Store> Sealed<S> {
    /// `inner`, its answers sealed with `keys`. An answer the store holds unsealed is
    /// refused ([`StoreError::Sealed`](crate::StoreError::Sealed)) unless
    /// [`read_unsealed`](Self::read_unsealed) says otherwise.
    pub fn new(inner: S, keys: RecordKeys) -> Sealed<S> {
        Sealed {
            inner,
            keys,
            read_unsealed: false,
        }
    }

    /// Whether an answer the store holds unsealed (recorded before sealing was turned
    /// on) is replayed as it is, while such answers age out, rather than refused.
    /// Off by default: whoever can write the store could otherwise put a plain answer
    /// (another tenant's, copied) into a sealed record and have it replayed.
    pub fn read_unsealed(mut self, read: bool) -> Sealed<S> {
        self.read_unsealed = read;
        self
    }

    /// The store underneath, which holds sealed answers.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The key ring.
    pub fn keys(&self) -> &RecordKeys {
        &self.keys
    }

    /// `response` sealed for `lease`'s record, as [`complete`](Store::complete)
    /// records it: for a write this wrapper does not see (the SQL stores'
    /// `complete_in`).
    pub fn seal(&self, lease: &Lease, response: &StoredResponse) -> StoredResponse {
        self.keys.seal(SealBinding::of_lease(lease), response)
    }

    /// The answer `stored` holds for the record `binding` names, or the error (logged)
    /// that it cannot be opened. Every field of an opened answer comes from its
    /// ciphertext: the plain ambiguity reason beside it is the store's index only.
    fn open(&self, binding: SealBinding<'_>, stored: StoredResponse) -> Result<StoredResponse> {
        let scope = binding.scope;
        let unsealed = !crate::seal::is_sealed(&stored);
        let opened = if unsealed && !self.read_unsealed {
            Err(crate::StoreError::Sealed(
                "the answer is not sealed, and this store seals every answer it records: \
                 it was written around the seal (or before sealing was turned on, which \
                 the migration setting to read unsealed records allows)"
                    .into(),
            ))
        } else {
            self.keys.open_with(binding, stored, self.read_unsealed)
        };
        opened.inspect_err(|e| {
            tracing::error!(
                scope = %scope.digest(),
                error = %e,
                "a recorded answer cannot be opened; it is not replayed, and the request \
                 is not executed again"
            );
        })
    }
}

impl<S: Store> Sealed<S> {
    /// The token of the attempt whose record holds `scope`'s completed answer, read
    /// from the record: for a store whose replays do not name it.
    async fn recorded_by(&self, scope: &Scope) -> Result<FencingToken> {
        match self.inner.get(scope).await? {
            Some(record) if record.is_completed() => Ok(record.token),
            _ => Err(crate::StoreError::Sealed(
                "the store replayed a sealed answer, then held no completed record for it".into(),
            )),
        }
    }
}

/// The attempt a replay of a sealed answer names, as [`decide`](crate::decide) put it
/// there.
fn sealing_attempt(stored: &StoredResponse) -> Option<FencingToken> {
    stored.meta.sealing_attempt
}

#[async_trait]
impl<S: Store> Store for Sealed<S> {
    async fn reserve(&self, request: &ReserveRequest) -> Result<Reservation> {
        let stored = match self.inner.reserve(request).await? {
            Reservation::Replay(stored) => stored,
            other => return Ok(other),
        };
        let token = match sealing_attempt(&stored) {
            Some(token) => token,
            // A store that builds replays without `decide` does not name the attempt:
            // the record says which it is.
            None if crate::seal::is_sealed(&stored) => self.recorded_by(&request.scope).await?,
            None => FencingToken::from_u64(0),
        };
        let binding = SealBinding {
            scope: &request.scope,
            // A replay answers a request with the record's fingerprint (SPEC S5).
            fingerprint: &request.fingerprint,
            token,
        };
        Ok(Reservation::Replay(self.open(binding, stored)?))
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        let sealed = self.seal(lease, response);
        self.inner.complete(lease, &sealed).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        self.inner.renew(lease, lease_for).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: Ambiguity) -> Result<()> {
        self.inner.mark_ambiguous(lease, reason).await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        let Some(mut record) = self.inner.get(scope).await? else {
            return Ok(None);
        };
        let Record {
            scope,
            fingerprint,
            token,
            state,
            ..
        } = &mut record;
        if let RecordState::Completed { response, .. } = state {
            let binding = SealBinding {
                scope,
                fingerprint,
                token: *token,
            };
            *response = self.open(binding, std::mem::take(response))?;
        }
        Ok(Some(record))
    }

    async fn remove(&self, scope: &Scope) -> Result<bool> {
        self.inner.remove(scope).await
    }

    /// The inner store's page, each answer opened as [`get`](Store::get) opens it. One
    /// that cannot be opened is logged and listed as it is stored, sealed: a listing
    /// shows what it can rather than failing whole.
    async fn take_rate_token(&self, bucket: &str, rate: &crate::KeyRate) -> Result<Option<bool>> {
        self.inner.take_rate_token(bucket, rate).await
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        let mut page = self.inner.list(query).await?;
        for record in &mut page.records {
            let Record {
                scope,
                fingerprint,
                token,
                state,
                ..
            } = record;
            if let RecordState::Completed { response, .. } = state {
                let binding = SealBinding {
                    scope,
                    fingerprint,
                    token: *token,
                };
                let stored = std::mem::take(response);
                *response = match self.open(binding, stored.clone()) {
                    Ok(opened) => opened,
                    Err(_) => stored,
                };
            }
        }
        Ok(page)
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        self.inner.purge_expired(limit).await
    }

    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }

    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        self.inner.init_secret(name, candidate).await
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    fn metrics(&self) -> Vec<StoreMetric> {
        self.inner.metrics()
    }

    fn expires_natively(&self) -> bool {
        self.inner.expires_natively()
    }

    fn watch(&self, scope: &Scope) -> crate::Watch {
        self.inner.watch(scope)
    }
}

impl<S> std::fmt::Debug for Sealed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed")
            .field("keys", &self.keys)
            .field("read_unsealed", &self.read_unsealed)
            .finish_non_exhaustive()
    }
}
