//! The sources a layer names a keyed request's tenant from, in their order
//! ([`TenantSources`]).

use std::sync::Arc;

use crate::principal::Principal;

/// Where a layer names a keyed request's tenant from, tried in this order, the first
/// that applies winning: a verified bearer token (feature `jwt`), then a [`Principal`]
/// in the request's extensions, then the tenant headers. None that applies names the
/// `anonymous` tenant (or a 401 `missing-tenant` with
/// [`require_tenant`](crate::IdempotencyLayer::require_tenant)).
///
/// ```
/// use idem_tower::{IdempotencyLayer, TenantSources};
/// # let store = idem_core::MemoryStore::new();
/// // Your authentication middleware puts a `Principal` in the extensions; requests it
/// // did not authenticate are named by their headers.
/// let layer = IdempotencyLayer::new(store)
///     .tenant_sources(TenantSources::new().principal().headers());
/// ```
#[derive(Clone, Default)]
pub struct TenantSources {
    #[cfg(feature = "jwt")]
    pub(crate) jwt: Option<Arc<crate::jwt::JwtVerifier>>,
    pub(crate) principal: bool,
    pub(crate) headers: bool,
}

impl TenantSources {
    /// No source: every request is `anonymous` until one is added.
    pub fn new() -> TenantSources {
        TenantSources::default()
    }

    /// A verified `Authorization: Bearer` JWT (see [`crate::JwtVerifier`]). A keyed
    /// request whose token does not verify is answered 401 `invalid-credential`; one
    /// without a bearer JWT goes on to the next source.
    #[cfg(feature = "jwt")]
    pub fn jwt(mut self, verifier: Arc<crate::jwt::JwtVerifier>) -> TenantSources {
        self.jwt = Some(verifier);
        self
    }

    /// A [`Principal`] in the request's extensions.
    pub fn principal(mut self) -> TenantSources {
        self.principal = true;
        self
    }

    /// The tenant headers (see [`IdempotencyLayer::tenant_headers`]).
    ///
    /// [`IdempotencyLayer::tenant_headers`]: crate::IdempotencyLayer::tenant_headers
    pub fn headers(mut self) -> TenantSources {
        self.headers = true;
        self
    }

    fn has_jwt(&self) -> bool {
        #[cfg(feature = "jwt")]
        return self.jwt.is_some();
        #[cfg(not(feature = "jwt"))]
        return false;
    }

    /// Whether a source applies to a request with these parts (for `require_tenant`).
    pub(crate) fn names_one(
        &self,
        parts: &http::request::Parts,
        headers: &crate::TenantHeaders,
    ) -> bool {
        #[cfg(feature = "jwt")]
        if self.jwt.is_some() && crate::jwt::bearer_jwt(&parts.headers).is_some() {
            return true;
        }
        (self.principal && parts.extensions.get::<Principal>().is_some())
            || (self.headers && headers.carried_by(&parts.headers))
    }
}

impl std::fmt::Debug for TenantSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantSources")
            .field("jwt", &self.has_jwt())
            .field("principal", &self.principal)
            .field("headers", &self.headers)
            .finish()
    }
}
