//! A store whose calls a test can intercept, and the figures a store reports.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest, Result, Scope, Store,
    StoreMetric, StoredResponse,
};

/// What a [`HookedStore`] does on each call. Every method passes the call on to the
/// inner store unless the hooks override it: a test writes only the calls it changes
/// (a `complete` that fails twice, a `reserve` that panics, a secret that cannot be
/// reached yet) and keeps the inner store's behaviour for the rest.
///
/// Hooks with no override at all keep something alive as long as the store: a
/// temporary directory, a table dropped at the end.
#[async_trait]
#[allow(missing_docs)] // Each method is the `Store` method of the same name.
pub trait StoreHooks<S: Store>: Send + Sync + 'static {
    async fn reserve(&self, inner: &S, request: &ReserveRequest) -> Result<Reservation> {
        inner.reserve(request).await
    }
    async fn complete(&self, inner: &S, lease: &Lease, response: &StoredResponse) -> Result<()> {
        inner.complete(lease, response).await
    }
    async fn renew(&self, inner: &S, lease: &Lease, lease_for: Duration) -> Result<()> {
        inner.renew(lease, lease_for).await
    }
    async fn release(&self, inner: &S, lease: &Lease) -> Result<()> {
        inner.release(lease).await
    }
    async fn get(&self, inner: &S, scope: &Scope) -> Result<Option<Record>> {
        inner.get(scope).await
    }
    async fn remove(&self, inner: &S, scope: &Scope) -> Result<bool> {
        inner.remove(scope).await
    }
    async fn purge_expired(&self, inner: &S, limit: usize) -> Result<usize> {
        inner.purge_expired(limit).await
    }
    async fn ping(&self, inner: &S) -> Result<()> {
        inner.ping().await
    }
    async fn init_secret(&self, inner: &S, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        inner.init_secret(name, candidate).await
    }
    async fn close(&self, inner: &S) {
        inner.close().await
    }
    async fn list(&self, inner: &S, query: &ListQuery) -> Result<ListPage> {
        inner.list(query).await
    }
    fn metrics(&self, inner: &S) -> Vec<StoreMetric> {
        inner.metrics()
    }
}

/// The store `inner` with every call going through `hooks` (see [`StoreHooks`]). It
/// dereferences to `inner`, so a test still reaches the inner store's own methods.
#[derive(Debug)]
pub struct HookedStore<S, H> {
    /// The store calls are passed on to.
    pub inner: S,
    /// What happens on each call.
    pub hooks: H,
}

impl<S, H> HookedStore<S, H> {
    /// `inner` seen through `hooks`.
    pub fn new(inner: S, hooks: H) -> Self {
        HookedStore { inner, hooks }
    }
}

impl<S, H> std::ops::Deref for HookedStore<S, H> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: Store, H: StoreHooks<S>> Store for HookedStore<S, H> {
    async fn reserve(&self, request: &ReserveRequest) -> Result<Reservation> {
        self.hooks.reserve(&self.inner, request).await
    }
    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        self.hooks.complete(&self.inner, lease, response).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        self.hooks.renew(&self.inner, lease, lease_for).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.hooks.release(&self.inner, lease).await
    }
    async fn mark_ambiguous(&self, lease: &Lease, reason: idem_core::Ambiguity) -> Result<()> {
        self.inner.mark_ambiguous(lease, reason).await
    }
    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        self.hooks.get(&self.inner, scope).await
    }
    async fn remove(&self, scope: &Scope) -> Result<bool> {
        self.hooks.remove(&self.inner, scope).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        self.hooks.purge_expired(&self.inner, limit).await
    }
    async fn ping(&self) -> Result<()> {
        self.hooks.ping(&self.inner).await
    }
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        self.hooks.init_secret(&self.inner, name, candidate).await
    }
    async fn close(&self) {
        self.hooks.close(&self.inner).await
    }
    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        self.hooks.list(&self.inner, query).await
    }
    async fn take_rate_token(
        &self,
        bucket: &str,
        rate: &idem_core::KeyRate,
    ) -> Result<Option<bool>> {
        self.inner.take_rate_token(bucket, rate).await
    }
    fn metrics(&self) -> Vec<StoreMetric> {
        self.hooks.metrics(&self.inner)
    }
    // What the sweeper is decided by is the inner store's nature; no test hooks it.
    fn expires_natively(&self) -> bool {
        self.inner.expires_natively()
    }
    // Nor the notifications a waiter hears: they are the inner store's.
    fn watch(&self, scope: &Scope) -> idem_core::Watch {
        self.inner.watch(scope)
    }
}

/// The value now of the figure `name` among `store`'s [`Store::metrics`]; panics,
/// listing the names there are, when the store reports no such figure.
pub fn figure(store: &dyn Store, name: &str) -> u64 {
    let figures = store.metrics();
    match figures.iter().find(|m| m.name == name) {
        Some(m) => m.value,
        None => {
            let names: Vec<&str> = figures.iter().map(|m| m.name).collect();
            panic!("the store reports no {name}; it reports {names:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use idem_core::testing::{test_fingerprint, test_scope};
    use idem_core::{MemoryStore, StoreError};

    use super::*;

    /// Fails `reserve` once, passes everything else on.
    #[derive(Default)]
    struct FirstReserveFails(AtomicUsize);

    #[async_trait]
    impl StoreHooks<MemoryStore> for FirstReserveFails {
        async fn reserve(&self, inner: &MemoryStore, r: &ReserveRequest) -> Result<Reservation> {
            if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(StoreError::unavailable("once"));
            }
            inner.reserve(r).await
        }
    }

    #[tokio::test]
    async fn an_override_changes_one_call_and_the_rest_pass_on() {
        let store = HookedStore::new(MemoryStore::new(), FirstReserveFails::default());
        let scope = test_scope("/hooked", "k");
        let request = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
        assert!(matches!(
            store.reserve(&request).await,
            Err(StoreError::Unavailable(_))
        ));
        let Reservation::Acquired(lease) = store.reserve(&request).await.unwrap() else {
            panic!("the second reserve acquires");
        };
        store
            .complete(&lease, &StoredResponse::new(201, "made"))
            .await
            .unwrap();
        assert!(store.get(&scope).await.unwrap().unwrap().is_completed());
        assert_eq!(store.hooks.0.load(Ordering::SeqCst), 2);
        assert!(!store.is_empty(), "the inner store holds the record");
    }
}
