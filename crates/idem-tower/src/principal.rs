//! Who a request is, as something that authenticated it says: a [`Principal`] (a
//! verified token's issuer and claims, a client certificate's name, your own
//! middleware's account id), and the order of the sources a layer names tenants by
//! ([`TenantSources`]).

use std::sync::Arc;

use idem_core::{Tenant, TenantKey};

/// An authenticated principal: where it comes from (`iss` of a token, `cert`, your
/// own name) and the values that name it, in order. Its tenant is their HMAC under the
/// layer's [`TenantKey`], so neither a claim nor a certificate name is stored in clear.
///
/// Put one in a request's extensions, in a middleware in front of the layer that has
/// authenticated the request, and a layer with [`TenantSources::principal`] names the
/// request's tenant by it. A client cannot put one there: extensions are the server's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    issuer: Option<String>,
    names: Vec<(String, String)>,
}

impl Principal {
    /// A principal named by `names` (`("sub", "cus_1")`, say) as `issuer` vouches for
    /// them. The same issuer and names give the same tenant, whatever credential
    /// carried them.
    pub fn new<I, K, V>(issuer: Option<String>, names: I) -> Principal
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Principal {
            issuer,
            names: names
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The tenant this principal is, under `key`.
    pub fn tenant(&self, key: &TenantKey) -> Tenant {
        let mut h = key.hasher();
        h.source("principal:issuer", self.issuer.iter());
        for (name, value) in &self.names {
            h.source(&format!("principal:{name}"), [value]);
        }
        h.finish()
    }

    /// Its issuer.
    pub fn issuer(&self) -> Option<&str> {
        self.issuer.as_deref()
    }

    /// The values that name it, in order, as `(name, value)`.
    pub fn names(&self) -> &[(String, String)] {
        &self.names
    }
}

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
