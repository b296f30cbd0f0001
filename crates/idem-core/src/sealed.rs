//! [`Sealed`]: a store whose recorded answers are sealed at rest (SPEC S17).

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    AMBIGUOUS_HEADER, Lease, ListPage, ListQuery, Record, RecordKeys, RecordState, Reservation,
    ReserveRequest, Result, Scope, Store, StoreMetric, StoredResponse,
};

/// A store that seals every answer it records with [`RecordKeys`] and opens every
/// answer it reads, over any other store.
///
/// Every path by which an answer enters or leaves a store goes through it:
/// [`complete`](Store::complete) seals under the current key;
/// [`reserve`](Store::reserve)'s replay and [`get`](Store::get)'s completed record are
/// opened with the key their answer names. An answer that cannot be opened (a key id
/// the ring lacks, changed bytes, status or scope) is [`StoreError::Sealed`](crate::StoreError::Sealed) and an
/// error in the log, never a record that is absent: the operation ran, and must not run
/// again. An answer recorded before sealing was turned on is read as it is.
///
/// Everything else (status, fingerprint, scope, times) is the inner store's and stays
/// in plain text there, and so does the reason an answer's outcome is ambiguous
/// ([`StoredResponse::ambiguity`], a label such as `answer_too_large`), so that a
/// listing of ambiguous records ([`Store::list`]) finds sealed ones too.
///
/// # Completing in the caller's transaction (SPEC S9)
///
/// The SQL stores' `complete_in` writes an answer without [`Store::complete`]: seal it
/// first with [`seal`](Self::seal), and call `complete_in` on [`inner`](Self::inner):
///
/// ```ignore
/// let sealed = store.seal(&lease.scope, &response);
/// store.inner().complete_in(&mut tx, &lease, &sealed).await?;
/// ```
///
/// (An answer completed in plain text there is still replayed, but not sealed.)
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
}

impl<S: Store> Sealed<S> {
    /// `inner`, its answers sealed with `keys`.
    pub fn new(inner: S, keys: RecordKeys) -> Sealed<S> {
        Sealed { inner, keys }
    }

    /// The store underneath, which holds sealed answers.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The key ring.
    pub fn keys(&self) -> &RecordKeys {
        &self.keys
    }

    /// `response` sealed for `scope`, as [`complete`](Store::complete) records it: for
    /// a write this wrapper does not see (the SQL stores' `complete_in`).
    pub fn seal(&self, scope: &Scope, response: &StoredResponse) -> StoredResponse {
        let sealed = self.keys.seal(scope, response);
        match response.ambiguity() {
            Some(reason) => sealed.with_ambiguity(reason),
            None => sealed,
        }
    }

    /// The answer `stored` holds for `scope`, or the error (logged) that it cannot be
    /// opened. The plain-text ambiguity label beside a sealed answer is dropped first:
    /// the sealed headers hold it too.
    fn open(&self, scope: &Scope, mut stored: StoredResponse) -> Result<StoredResponse> {
        if stored
            .headers
            .first()
            .is_some_and(|(name, _)| name == crate::seal::SEALED_HEADER)
        {
            stored.headers.retain(|(name, _)| name != AMBIGUOUS_HEADER);
        }
        self.keys.open(scope, stored).inspect_err(|e| {
            tracing::error!(
                scope = %scope.digest(),
                error = %e,
                "a recorded answer cannot be opened; it is not replayed, and the request \
                 is not executed again"
            );
        })
    }
}

#[async_trait]
impl<S: Store> Store for Sealed<S> {
    async fn reserve(&self, request: &ReserveRequest) -> Result<Reservation> {
        match self.inner.reserve(request).await? {
            Reservation::Replay(stored) => {
                Ok(Reservation::Replay(self.open(&request.scope, stored)?))
            }
            other => Ok(other),
        }
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        let sealed = self.seal(&lease.scope, response);
        self.inner.complete(lease, &sealed).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        self.inner.renew(lease, lease_for).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        let Some(mut record) = self.inner.get(scope).await? else {
            return Ok(None);
        };
        if let RecordState::Completed { response, .. } = &mut record.state {
            *response = self.open(scope, std::mem::take(response))?;
        }
        Ok(Some(record))
    }

    async fn remove(&self, scope: &Scope) -> Result<bool> {
        self.inner.remove(scope).await
    }

    /// The inner store's page, each answer opened as [`get`](Store::get) opens it. One
    /// that cannot be opened is logged and listed as it is stored, sealed: a listing
    /// shows what it can rather than failing whole.
    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        let mut page = self.inner.list(query).await?;
        for record in &mut page.records {
            if let RecordState::Completed { response, .. } = &mut record.state {
                let stored = std::mem::take(response);
                *response = match self.open(&record.scope, stored.clone()) {
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
            .finish_non_exhaustive()
    }
}
