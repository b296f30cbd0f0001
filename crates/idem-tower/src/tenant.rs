//! Whose key is it (SPEC S3): the tenant a request's headers name, keyed by a secret.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, header};
use idem_core::{Tenant, TenantKey};

/// The headers that name a request's tenant together, in order (default:
/// `Authorization` alone).
///
/// The tenant is the HMAC-SHA256, under a [`TenantKey`], of every listed header's name
/// and values in the listed order ([`TenantKey::hasher`] spells out the layout, in
/// which no two different sets of headers meet): so `Authorization, Stripe-Account`
/// keeps the accounts a platform key acts for apart. A header the request does not
/// carry counts as absent, which differs from one carried empty; a header carried in
/// several fields counts with every value, in the order sent. A request that carries
/// none of them is [`Tenant::anonymous`].
///
/// In `Authorization` and `Proxy-Authorization`, the auth-scheme is case-insensitive
/// and followed by one or more spaces (RFC 9110 §11.1): it is folded to lower case and
/// one space before hashing, so `bearer X`, `Bearer X` and `BEARER  X` name one
/// tenant. The credential after it stays exact. A value without a space (a bare token)
/// is kept as it is.
///
/// ```
/// use http::{HeaderMap, HeaderName};
/// use idem_core::TenantKey;
/// use idem_tower::TenantHeaders;
///
/// let headers = TenantHeaders::new([
///     http::header::AUTHORIZATION,
///     HeaderName::from_static("stripe-account"),
/// ]);
/// let key = TenantKey::new(&[7; 32]).unwrap();
/// let mut a = HeaderMap::new();
/// a.insert("authorization", "bearer sk_1".parse().unwrap());
/// a.insert("stripe-account", "acct_1".parse().unwrap());
/// let mut b = a.clone();
/// b.insert("authorization", "Bearer sk_1".parse().unwrap());
/// assert_eq!(headers.tenant(&key, &a), headers.tenant(&key, &b));
/// b.insert("stripe-account", "acct_2".parse().unwrap());
/// assert_ne!(headers.tenant(&key, &a), headers.tenant(&key, &b));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TenantHeaders {
    names: Arc<[HeaderName]>,
}

impl TenantHeaders {
    /// The tenant named by `names`, in this order. An empty list names no tenant: every
    /// request is [`Tenant::anonymous`].
    pub fn new<I: IntoIterator<Item = HeaderName>>(names: I) -> TenantHeaders {
        TenantHeaders {
            names: names.into_iter().collect(),
        }
    }

    /// The header names, in order.
    pub fn names(&self) -> &[HeaderName] {
        &self.names
    }

    /// Whether `headers` carry any of the listed headers (an empty value counts).
    pub fn carried_by(&self, headers: &HeaderMap) -> bool {
        self.names.iter().any(|name| headers.contains_key(name))
    }

    /// The tenant `headers` name under `key`: `hmac-sha256:<hex>`, or
    /// [`Tenant::anonymous`] when none of the listed headers is there.
    pub fn tenant(&self, key: &TenantKey, headers: &HeaderMap) -> Tenant {
        let mut h = key.hasher();
        for name in self.names.iter() {
            let folds = is_authorization(name);
            h.source(
                name.as_str(),
                headers.get_all(name).iter().map(|value| {
                    if folds {
                        fold_auth_scheme(value)
                    } else {
                        Cow::Borrowed(value.as_bytes())
                    }
                }),
            );
        }
        h.finish()
    }

    /// The listed names, comma-separated, for messages.
    pub(crate) fn listed(&self) -> String {
        let names: Vec<&str> = self.names.iter().map(HeaderName::as_str).collect();
        names.join(", ")
    }
}

impl Default for TenantHeaders {
    fn default() -> Self {
        TenantHeaders::new([header::AUTHORIZATION])
    }
}

impl fmt::Debug for TenantHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names.iter()).finish()
    }
}

/// Whether a header carries `auth-scheme [ 1*SP credentials ]` (RFC 9110 §11.6.2,
/// §11.7.2).
fn is_authorization(name: &HeaderName) -> bool {
    name == header::AUTHORIZATION || name == header::PROXY_AUTHORIZATION
}

/// `value` with its auth-scheme in lower case and the spaces after it made one; the
/// credentials after them as sent. A value without a space is kept whole: it is
/// either a scheme alone or a bare token, and a token's case may matter.
fn fold_auth_scheme(value: &HeaderValue) -> Cow<'_, [u8]> {
    let bytes = value.as_bytes();
    let Some(space) = bytes.iter().position(|&b| b == b' ') else {
        return Cow::Borrowed(bytes);
    };
    let (scheme, rest) = bytes.split_at(space);
    let credentials = &rest[rest.iter().take_while(|&&b| b == b' ').count()..];
    let single_space = rest.len() - credentials.len() == 1;
    if single_space && !scheme.iter().any(u8::is_ascii_uppercase) {
        return Cow::Borrowed(bytes);
    }
    let mut folded = Vec::with_capacity(scheme.len() + 1 + credentials.len());
    folded.extend(scheme.iter().map(u8::to_ascii_lowercase));
    folded.push(b' ');
    folded.extend_from_slice(credentials);
    Cow::Owned(folded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TenantKey {
        TenantKey::new(&[9; 32]).unwrap()
    }

    fn map(fields: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (name, value) in fields {
            m.append(
                HeaderName::try_from(*name).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        m
    }

    fn tenant_of(headers: &TenantHeaders, fields: &[(&str, &str)]) -> Tenant {
        headers.tenant(&key(), &map(fields))
    }

    #[test]
    fn auth_scheme_is_folded_and_credentials_kept() {
        let folded = |v: &str| {
            String::from_utf8(fold_auth_scheme(&HeaderValue::from_str(v).unwrap()).into_owned())
                .unwrap()
        };
        assert_eq!(folded("Bearer sk_ABC"), "bearer sk_ABC");
        assert_eq!(folded("BEARER   sk_ABC"), "bearer sk_ABC");
        assert_eq!(folded("bearer sk_ABC"), "bearer sk_ABC");
        assert_eq!(
            folded("Basic YWxpY2U6aHVudGVyMg=="),
            "basic YWxpY2U6aHVudGVyMg=="
        );
        assert_eq!(folded("Digest a=\"B C\""), "digest a=\"B C\"");
        assert_eq!(
            folded("SK_LIVE_TOKEN"),
            "SK_LIVE_TOKEN",
            "a bare token is exact"
        );
    }

    #[test]
    fn one_tenant_whatever_the_schemes_case_and_spacing() {
        let h = TenantHeaders::default();
        let t = tenant_of(&h, &[("authorization", "bearer X")]);
        for same in ["Bearer X", "BEARER X", "Bearer    X"] {
            assert_eq!(t, tenant_of(&h, &[("authorization", same)]), "{same}");
        }
        assert_ne!(t, tenant_of(&h, &[("authorization", "Bearer x")]));
        assert_ne!(t, tenant_of(&h, &[("authorization", "Basic X")]));
        // Proxy-Authorization folds too; another header keeps its value exact.
        let p = TenantHeaders::new([header::PROXY_AUTHORIZATION]);
        assert_eq!(
            tenant_of(&p, &[("proxy-authorization", "Basic Y")]),
            tenant_of(&p, &[("proxy-authorization", "basic Y")])
        );
        let k = TenantHeaders::new([HeaderName::from_static("x-api-key")]);
        assert_ne!(
            tenant_of(&k, &[("x-api-key", "Bearer Y")]),
            tenant_of(&k, &[("x-api-key", "bearer Y")])
        );
    }

    #[test]
    fn headers_name_the_tenant_together_absent_is_not_empty() {
        let h = TenantHeaders::new([
            header::AUTHORIZATION,
            HeaderName::from_static("stripe-account"),
        ]);
        let auth = ("authorization", "Bearer sk_platform");
        let one = tenant_of(&h, &[auth, ("stripe-account", "acct_1")]);
        let two = tenant_of(&h, &[auth, ("stripe-account", "acct_2")]);
        let absent = tenant_of(&h, &[auth]);
        let empty = tenant_of(&h, &[auth, ("stripe-account", "")]);
        let all = [&one, &two, &absent, &empty];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(one, tenant_of(&h, &[("stripe-account", "acct_1"), auth]));
        // The order of the list matters, not the order of the request's fields.
        let swapped = TenantHeaders::new([
            HeaderName::from_static("stripe-account"),
            header::AUTHORIZATION,
        ]);
        assert_ne!(
            one,
            tenant_of(&swapped, &[auth, ("stripe-account", "acct_1")])
        );
        assert_eq!(tenant_of(&h, &[]), Tenant::anonymous());
        assert_eq!(tenant_of(&h, &[("x-other", "v")]), Tenant::anonymous());
        assert_ne!(
            tenant_of(&h, &[("stripe-account", "acct_1")]),
            Tenant::anonymous()
        );
        assert!(h.carried_by(&map(&[("stripe-account", "")])));
        assert!(!h.carried_by(&map(&[("x-other", "v")])));
    }

    /// A header in two fields counts with both values, in the order sent: the same
    /// fields again are the same tenant; swapped, or one alone, another.
    #[test]
    fn repeated_fields_count_with_every_value_in_order() {
        let h = TenantHeaders::default();
        let ab = tenant_of(
            &h,
            &[("authorization", "Bearer a"), ("authorization", "Bearer b")],
        );
        assert_eq!(
            ab,
            tenant_of(
                &h,
                &[("authorization", "bearer a"), ("authorization", "Bearer b")]
            )
        );
        assert_ne!(
            ab,
            tenant_of(
                &h,
                &[("authorization", "Bearer b"), ("authorization", "Bearer a")]
            )
        );
        assert_ne!(ab, tenant_of(&h, &[("authorization", "Bearer a")]));
        assert_ne!(
            ab,
            tenant_of(&h, &[("authorization", "Bearer a, Bearer b")])
        );
    }
}
