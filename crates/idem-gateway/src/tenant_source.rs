//! [`TenantSource`]: where a keyed request's tenant comes from, as `tenant_from` (the
//! gateway's, or a route's) names it; a leaf that the configuration and the routes
//! both read.

/// Where a keyed request's tenant comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TenantSource {
    /// The verified bearer token.
    Jwt,
    /// The verified client certificate's name (`tls_client_ca`, `tenant_cert_name`).
    Cert,
    /// A keyed digest of the tenant headers.
    Headers,
}

impl TenantSource {
    /// As the setting spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TenantSource::Jwt => "jwt",
            TenantSource::Cert => "cert",
            TenantSource::Headers => "headers",
        }
    }
}
