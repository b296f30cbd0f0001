//! The sources a layer names a keyed request's tenant from, in their order
//! ([`TenantSources`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::principal::Principal;

/// What [`Credential::principal`] comes to: the principal, or why there is none
/// ([`CredentialError`]).
pub type Verified<'a> =
    Pin<Box<dyn Future<Output = Result<Principal, CredentialError>> + Send + 'a>>;

/// Why a [`Credential`] named no principal: the client's fault, or the service's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CredentialError {
    /// The credential is not believed (a bad signature, an expired token, another
    /// issuer): 401 `invalid-credential`, whose `detail` this is. The client must not
    /// send it again as it is.
    Refused(String),
    /// The credential could not be checked now, for a fault of the service's: the keys
    /// that verify it could not be loaded in time, say. 503 `credential-unavailable`
    /// with `Retry-After: retry_after`, whose `detail` `reason` is: the same request
    /// may succeed later, and the client must not take its credential for a bad one.
    Unavailable {
        /// Why, for the answer's `detail`: never a secret, a key or an internal address.
        reason: String,
        /// How long the client should wait before it retries.
        retry_after: Duration,
    },
}

impl From<String> for CredentialError {
    /// A refusal ([`CredentialError::Refused`]) saying `detail`.
    fn from(detail: String) -> CredentialError {
        CredentialError::Refused(detail)
    }
}

impl std::fmt::Display for CredentialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialError::Refused(detail) => f.write_str(detail),
            CredentialError::Unavailable { reason, .. } => f.write_str(reason),
        }
    }
}

impl std::error::Error for CredentialError {}

/// A credential a request carries that names its principal once verified, for
/// [`TenantSources::credential`]: a bearer JWT (the `idem-jwt` crate's `JwtVerifier`),
/// or one of your own. The layer asks only whether a keyed request carries one and
/// whom it names; what it is and how it is checked is the credential's business.
pub trait Credential: Send + Sync + 'static {
    /// The credential `headers` carry, if they carry one of this kind.
    fn find<'a>(&self, headers: &'a http::HeaderMap) -> Option<&'a str>;

    /// The principal `credential` names, or why there is none: it is not believed
    /// ([`CredentialError::Refused`], a 401), or it cannot be checked now
    /// ([`CredentialError::Unavailable`], a 503).
    fn principal<'a>(&'a self, credential: &'a str) -> Verified<'a>;
}

/// Where a layer names a keyed request's tenant from, tried in this order, the first
/// that applies winning: a verified [`Credential`] (a bearer token), then a [`Principal`]
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
    pub(crate) credential: Option<Arc<dyn Credential>>,
    pub(crate) principal: bool,
    pub(crate) headers: bool,
}

impl TenantSources {
    /// No source: every request is `anonymous` until one is added.
    pub fn new() -> TenantSources {
        TenantSources::default()
    }

    /// A verified [`Credential`] (a bearer JWT, with the `idem-jwt` crate). A keyed
    /// request whose credential does not verify is answered 401 `invalid-credential`,
    /// one whose credential cannot be checked now 503 `credential-unavailable`; one
    /// without such a credential goes on to the next source.
    pub fn credential(mut self, credential: Arc<dyn Credential>) -> TenantSources {
        self.credential = Some(credential);
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

    /// The first source that applies to a request with these parts, if any: a
    /// credential, a [`Principal`] in the extensions, or one of the tenant headers.
    pub(crate) fn applying<'a>(
        &'a self,
        parts: &'a http::request::Parts,
        headers: &crate::TenantHeaders,
    ) -> Option<Applying<'a>> {
        if let Some(credential) = &self.credential
            && let Some(found) = credential.find(&parts.headers)
        {
            return Some(Applying::Credential(credential.as_ref(), found));
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
    /// A credential, to verify.
    Credential(&'a dyn Credential, &'a str),
    /// A principal an authentication in front of the layer named.
    Principal(&'a Principal),
    /// The tenant headers.
    Headers,
}

impl std::fmt::Debug for TenantSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantSources")
            .field("credential", &self.credential.is_some())
            .field("principal", &self.principal)
            .field("headers", &self.headers)
            .finish()
    }
}
