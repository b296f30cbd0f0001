//! What the inner service learns about a keyed request (SPEC S7).

use http::StatusCode;
use idem_core::{Fingerprint, Key, Lease, Scope};
use sha2::{Digest, Sha256};

use crate::ReleaseStatuses;

/// A request extension the inner service sees on every keyed request that won its
/// reservation.
///
/// ```
/// use axum::Extension;
/// use idem_tower::IdempotencyContext;
///
/// async fn charge(Extension(ctx): Extension<IdempotencyContext>) -> String {
///     if ctx.recovered {
///         // An earlier attempt died mid-way: look for its effects before acting again.
///     }
///     // The payment provider sees the same key on every attempt of this operation.
///     let provider_key = ctx.derive("charge");
///     format!("attempt {} uses {provider_key}", ctx.attempt)
/// }
/// # let _ = charge;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IdempotencyContext {
    /// The client's key.
    pub key: Key,
    /// The record's scope: tenant, endpoint (public mode) and key.
    pub scope: Scope,
    /// 1 for a first execution, n+1 after a takeover of a dead attempt's lease.
    pub attempt: u32,
    /// Whether this attempt took over from one that died (`attempt > 1`): the handler
    /// should consult its business records before acting again.
    pub recovered: bool,
    /// This attempt's lease. With a SQL store a handler may complete the record inside
    /// its own business transaction (SPEC S9) with
    /// [`Store::complete`](idem_core::Store::complete); the layer's own completion
    /// afterwards keeps that first response.
    pub lease: Lease,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The statuses that release the key on this request's route.
    release_statuses: ReleaseStatuses,
}

impl IdempotencyContext {
    /// The context of `lease`, whose scope the layer passes in too (moved, where the
    /// lease is cloned) to spare a copy per request.
    pub(crate) fn new(
        scope: Scope,
        lease: Lease,
        fingerprint: Fingerprint,
        release_statuses: ReleaseStatuses,
    ) -> IdempotencyContext {
        debug_assert_eq!(scope, lease.scope);
        IdempotencyContext {
            key: scope.key().clone(),
            scope,
            attempt: lease.attempt,
            recovered: lease.recovered(),
            lease,
            fingerprint,
            release_statuses,
        }
    }

    /// Whether the layer will release the key, rather than record the answer, when the
    /// inner service answers `status` without an
    /// [`Disposition`](crate::Disposition) of its own: the status is in the set of this
    /// request's route (or the layer's). A service that streams what will not be
    /// recorded, rather than produce it whole, asks this.
    pub fn releases(&self, status: StatusCode) -> bool {
        self.release_statuses.contains(status)
    }

    /// A deterministic child key for a downstream call (SPEC S7): the hex SHA-256 of
    /// this record's scope and `label`.
    ///
    /// Every attempt of one operation derives the same child keys, so a recovered attempt
    /// reuses the downstream keys of the attempt that died. The scope (tenant, endpoint
    /// in public mode, key) goes in rather than the key alone, so two tenants, or two
    /// endpoints, that happen to use the same key never share a downstream key.
    pub fn derive(&self, label: &str) -> Key {
        let mut h = Sha256::new();
        let digest = self.scope.digest();
        for part in [digest.as_bytes(), label.as_bytes()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        Key::new(hex::encode(h.finalize())).expect("64 hex digits are a valid key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Endpoint, FencingToken, ScopeMode, Tenant};

    fn context(tenant: &str, endpoint: &str, attempt: u32) -> IdempotencyContext {
        let scope = Scope::new(
            ScopeMode::Public,
            Tenant::new(tenant),
            Endpoint::new("POST", endpoint),
            Key::new("k-1").unwrap(),
        );
        let lease = Lease {
            scope: scope.clone(),
            token: FencingToken::generate(),
            fingerprint: Fingerprint::compute("POST", endpoint, None, b"", &Default::default()),
            attempt,
            ttl: idem_core::DEFAULT_TTL,
            tombstone: std::time::Duration::ZERO,
        };
        IdempotencyContext::new(
            scope,
            lease,
            Fingerprint::compute("POST", endpoint, None, b"", &Default::default()),
            ReleaseStatuses::default(),
        )
    }

    #[test]
    fn releases_answers_with_the_routes_statuses() {
        let ctx = context("t", "/charges", 1);
        assert!(ctx.releases(StatusCode::CONFLICT));
        assert!(!ctx.releases(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!ctx.releases(StatusCode::CREATED));
    }

    #[test]
    fn derived_keys_are_stable_across_attempts() {
        let first = context("t", "/charges", 1);
        let recovered = context("t", "/charges", 2);
        assert!(!first.recovered);
        assert!(recovered.recovered);
        assert_eq!(first.derive("charge"), recovered.derive("charge"));
        assert_ne!(first.derive("charge"), first.derive("email"));
        assert_eq!(first.derive("charge").as_str().len(), 64);
    }

    #[test]
    fn derived_keys_differ_between_scopes() {
        let a = context("a", "/charges", 1);
        let b = context("b", "/charges", 1);
        let c = context("a", "/refunds", 1);
        assert_ne!(a.derive("x"), b.derive("x"));
        assert_ne!(a.derive("x"), c.derive("x"));
    }
}
