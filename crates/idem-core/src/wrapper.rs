//! [`Forward`]: the one way to make a store out of another, so that a wrapper states
//! what it changes and nothing else.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Lease, ListPage, ListQuery, Record, Reservation, ReserveRequest, Result, Scope, Store,
    StoreMetric, StoredResponse, Watch,
};

/// A value that passes every [`Store`] operation on to another store, and so is a
/// [`Store`] itself (a blanket implementation does the passing).
///
/// `Arc<S>` and `Box<S>` forward to `S`. A wrapper of one's own names its target and
/// overrides the hooks it changes: a store opened late answers
/// [`StoreError::Unavailable`](crate::StoreError::Unavailable) from
/// [`target`](Self::target) until it is open; a test store that never finishes closing
/// overrides [`forward_close`](Self::forward_close).
///
/// # Examples
///
/// ```
/// use idem_core::{Forward, MemoryStore, Result, Store};
///
/// /// A memory store that says it expires records by itself.
/// struct Expiring(MemoryStore);
///
/// impl Forward for Expiring {
///     type Target = MemoryStore;
///     fn target(&self) -> Result<&MemoryStore> {
///         Ok(&self.0)
///     }
///     fn forward_expires_natively(&self) -> bool {
///         true
///     }
/// }
///
/// let store: Box<dyn Store> = Box::new(Expiring(MemoryStore::new()));
/// assert!(store.expires_natively());
/// ```
#[async_trait]
pub trait Forward: Send + Sync + 'static {
    /// The store operations go to.
    type Target: Store + ?Sized;

    /// The store to pass this operation to, or the error it fails with when there is
    /// none now.
    fn target(&self) -> Result<&Self::Target>;

    /// What [`Store::close`] does: closes the target, if there is one. (Named apart
    /// from `close` so that the two traits in scope never make a call ambiguous.)
    async fn forward_close(&self) {
        if let Ok(store) = self.target() {
            store.close().await;
        }
    }

    /// What [`Store::expires_natively`] answers: the target's answer, `false` without
    /// one.
    fn forward_expires_natively(&self) -> bool {
        self.target().is_ok_and(|store| store.expires_natively())
    }
}

#[async_trait]
impl<F: Forward> Store for F {
    async fn reserve(&self, request: &ReserveRequest) -> Result<Reservation> {
        self.target()?.reserve(request).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        self.target()?.complete(lease, response).await
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        self.target()?.renew(lease, lease_for).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.target()?.release(lease).await
    }

    async fn mark_ambiguous(&self, lease: &Lease, reason: crate::Ambiguity) -> Result<()> {
        self.target()?.mark_ambiguous(lease, reason).await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        self.target()?.get(scope).await
    }

    async fn remove(&self, scope: &Scope) -> Result<bool> {
        self.target()?.remove(scope).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        self.target()?.purge_expired(limit).await
    }

    async fn ping(&self) -> Result<()> {
        self.target()?.ping().await
    }

    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        self.target()?.init_secret(name, candidate).await
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        self.target()?.list(query).await
    }

    async fn take_rate_token(&self, bucket: &str, rate: &crate::KeyRate) -> Result<Option<bool>> {
        self.target()?.take_rate_token(bucket, rate).await
    }

    async fn close(&self) {
        self.forward_close().await;
    }

    /// The target's figures; none without one.
    fn metrics(&self) -> Vec<StoreMetric> {
        self.target()
            .map(|store| store.metrics())
            .unwrap_or_default()
    }

    fn expires_natively(&self) -> bool {
        self.forward_expires_natively()
    }

    /// The target's watch; [`Watch::poll`] without one.
    fn watch(&self, scope: &Scope) -> Watch {
        self.target()
            .map(|store| store.watch(scope))
            .unwrap_or_else(|_| Watch::poll())
    }
}

impl<S: Store + ?Sized> Forward for Arc<S> {
    type Target = S;

    fn target(&self) -> Result<&S> {
        Ok(&**self)
    }
}

impl<S: Store + ?Sized> Forward for Box<S> {
    type Target = S;

    fn target(&self) -> Result<&S> {
        Ok(&**self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreError;

    /// A store with no target yet.
    struct Closed;

    impl Forward for Closed {
        type Target = dyn Store;
        fn target(&self) -> Result<&(dyn Store + 'static)> {
            Err(StoreError::unavailable("not open yet"))
        }
    }

    #[tokio::test]
    async fn without_a_target_every_operation_fails_and_nothing_is_figured() {
        let store = Closed;
        assert!(matches!(
            Store::ping(&store).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            store.purge_expired(10).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(Store::metrics(&store).is_empty());
        assert!(!Store::expires_natively(&store));
        Store::close(&store).await;
    }

    #[tokio::test]
    async fn pointers_forward_to_what_they_point_at() {
        let memory = Arc::new(crate::MemoryStore::new().max_entries(7));
        let boxed: Box<dyn Store> = Box::new(memory.clone());
        let figure = |metrics: Vec<StoreMetric>| {
            metrics
                .into_iter()
                .find(|m| m.name == "idem_memory_max_records")
                .map(|m| m.value)
        };
        assert_eq!(figure(boxed.metrics()), Some(7));
        assert_eq!(figure(Store::metrics(&memory)), Some(7));
        let secret = boxed.init_secret("s", &[1; 32]).await.unwrap();
        assert_eq!(memory.init_secret("s", &[2; 32]).await.unwrap(), secret);
    }
}
