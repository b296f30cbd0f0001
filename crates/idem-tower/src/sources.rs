//! The sources a layer names a keyed request's tenant from, in their order
//! ([`TenantSources`]).

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
    pub(crate) jwt: Option<std::sync::Arc<crate::jwt::JwtVerifier>>,
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
    pub fn jwt(mut self, verifier: std::sync::Arc<crate::jwt::JwtVerifier>) -> TenantSources {
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

    /// The first source that applies to a request with these parts, if any: a bearer
    /// JWT, a [`Principal`] in the extensions, or one of the tenant headers.
    pub(crate) fn applying<'a>(
        &'a self,
        parts: &'a http::request::Parts,
        headers: &crate::TenantHeaders,
    ) -> Option<Applying<'a>> {
        #[cfg(feature = "jwt")]
        if let Some(verifier) = &self.jwt
            && let Some(token) = crate::jwt::bearer_jwt(&parts.headers)
        {
            return Some(Applying::Jwt(verifier, token));
        }
        if self.principal
            && let Some(principal) = parts.extensions.get::<Principal>()
        {
            return Some(Applying::Principal(principal));
        }
        (self.headers && headers.carried_by(&parts.headers)).then_some(Applying::Headers)
    }
}

/// The source that names a request's tenant (see [`TenantSources::applying`]).
pub(crate) enum Applying<'a> {
    /// A bearer JWT, to verify with this verifier.
    #[cfg(feature = "jwt")]
    Jwt(&'a crate::jwt::JwtVerifier, &'a str),
    /// A principal an authentication in front of the layer named.
    Principal(&'a Principal),
    /// The tenant headers.
    Headers,
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
