//! Who a request is, as something that authenticated it says: a [`Principal`] (a
//! verified token's issuer and claims, a client certificate's name, your own
//! middleware's account id).

use idem_core::{Tenant, TenantKey};

/// An authenticated principal: where it comes from (`iss` of a token, `cert`, your
/// own name) and the values that name it, in order. Its tenant is their HMAC under the
/// layer's [`TenantKey`], so neither a claim nor a certificate name is stored in clear.
///
/// Put one in a request's extensions, in a middleware in front of the layer that has
/// authenticated the request, and a layer with
/// [`TenantSources::principal`](crate::TenantSources::principal) names the
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
