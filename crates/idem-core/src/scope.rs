//! Whose key is it (SPEC S3): the unique constraint is on the scope, never on the key
//! alone.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::Key;

/// The party a key belongs to. Two tenants never see each other's records.
///
/// Built from credentials with a [`TenantKey`](crate::TenantKey), which keeps only an
/// HMAC-SHA256 under a deployment secret (`hmac-sha256:<hex>`), or from an
/// already-trusted identifier with [`Tenant::new`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

impl Tenant {
    /// The tenant of requests that carry no credential.
    pub const ANONYMOUS: &'static str = "anonymous";

    /// A tenant named by an identifier the caller already trusts (an account id from
    /// an authenticated session, say). The name is stored as given.
    pub fn new(name: impl Into<String>) -> Tenant {
        Tenant(name.into())
    }

    /// The tenant of requests without a credential.
    pub fn anonymous() -> Tenant {
        Tenant(Self::ANONYMOUS.to_owned())
    }

    /// The tenant's stored name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tenant").field(&self.0).finish()
    }
}

/// `METHOD + route template` (`POST /v1/orders/{id}/capture`) where a router knows the
/// template, else `METHOD + path`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint(String);

impl Endpoint {
    /// An endpoint from a method and a route template or path.
    pub fn new(method: &str, route: &str) -> Endpoint {
        Endpoint(format!("{} {}", method.to_ascii_uppercase(), route))
    }

    /// An endpoint from its already-joined form (`POST /v1/orders`), as stored.
    pub fn from_raw(raw: impl Into<String>) -> Endpoint {
        Endpoint(raw.into())
    }

    /// The joined form, `METHOD route`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The method part, upper-cased as it was joined (`POST`); all of it when the
    /// endpoint was made from a raw form without a space.
    pub fn method(&self) -> &str {
        self.0.split_once(' ').map_or(&self.0, |(method, _)| method)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Endpoint").field(&self.0).finish()
    }
}

/// Whether the endpoint is part of the scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScopeMode {
    /// `(tenant, endpoint, key)`: the default for public APIs, where clients may reuse a
    /// key across endpoints.
    #[default]
    Public,
    /// `(tenant, key)`: one key names one operation whatever endpoint it reaches.
    Internal,
}

impl ScopeMode {
    /// Every mode, the default first.
    pub const ALL: [ScopeMode; 2] = [ScopeMode::Public, ScopeMode::Internal];

    /// The names of [`ALL`](ScopeMode::ALL), in its order.
    pub const NAMES: [&'static str; ScopeMode::ALL.len()] =
        [ScopeMode::ALL[0].as_str(), ScopeMode::ALL[1].as_str()];

    /// The name in settings: `public` or `internal`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ScopeMode::Public => "public",
            ScopeMode::Internal => "internal",
        }
    }

    /// The parts a scope of this mode is made of: `(tenant, endpoint, key)` or
    /// `(tenant, key)`.
    pub const fn parts(self) -> &'static str {
        match self {
            ScopeMode::Public => "(tenant, endpoint, key)",
            ScopeMode::Internal => "(tenant, key)",
        }
    }
}

/// Read as serde reads a unit variant of an enum (settings files): `public` or
/// `internal` exactly.
impl<'de> serde::Deserialize<'de> for ScopeMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ScopeMode, D::Error> {
        crate::profile::named(d, &ScopeMode::ALL, &ScopeMode::NAMES)
    }
}

/// The unique identity of a record: tenant, endpoint (public mode) and key.
///
/// Cheap to clone: the parts are shared, since a request's scope travels with its
/// lease, its context and every store operation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    parts: Arc<ScopeParts>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct ScopeParts {
    tenant: Tenant,
    endpoint: Option<Endpoint>,
    key: Key,
    /// What is made from the parts on first use.
    derived: Derived,
}

/// Hashes the cached keyed hash ([`Derived::hash`]): equal parts have equal hashes.
impl std::hash::Hash for ScopeParts {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(*self.derived.hash.get_or_init(|| {
            static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
            KEY.get_or_init(std::hash::RandomState::new).hash_one((
                &self.tenant,
                &self.endpoint,
                &self.key,
            ))
        }));
    }
}

/// What a scope's parts give, each made on its first use. Made from the other parts,
/// they take no part in comparing or ordering scopes.
#[derive(Default)]
struct Derived {
    /// [`Scope::digest`]: a store names the record by it several times per operation,
    /// and the logs and waiters by it too.
    digest: std::sync::OnceLock<String>,
    /// The parts' hash under this process's random key: a scope is looked up in several
    /// maps per operation (a store's shard and records, waiters, a batch's scopes), and
    /// each then hashes eight bytes, not three strings. The key, random per process,
    /// keeps a client from choosing keys that collide.
    hash: std::sync::OnceLock<u64>,
}

impl PartialEq for Derived {
    fn eq(&self, _: &Derived) -> bool {
        true
    }
}

impl Eq for Derived {}

impl PartialOrd for Derived {
    fn partial_cmp(&self, other: &Derived) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Derived {
    fn cmp(&self, _: &Derived) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("tenant", &self.parts.tenant)
            .field("endpoint", &self.parts.endpoint)
            .field("key", &self.parts.key)
            .finish()
    }
}

impl Scope {
    /// A scope in the given mode; in [`ScopeMode::Internal`] the endpoint is dropped.
    pub fn new(mode: ScopeMode, tenant: Tenant, endpoint: Endpoint, key: Key) -> Scope {
        let endpoint = match mode {
            ScopeMode::Public => Some(endpoint),
            ScopeMode::Internal => None,
        };
        Scope::from_parts(tenant, endpoint, key)
    }

    /// A scope from its stored parts; `endpoint` is `None` for internal mode.
    pub fn from_parts(tenant: Tenant, endpoint: Option<Endpoint>, key: Key) -> Scope {
        Scope {
            parts: Arc::new(ScopeParts {
                tenant,
                endpoint,
                key,
                derived: Derived::default(),
            }),
        }
    }

    /// The tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.parts.tenant
    }

    /// The endpoint, `None` in internal mode.
    pub fn endpoint(&self) -> Option<&Endpoint> {
        self.parts.endpoint.as_ref()
    }

    /// The endpoint as stored in SQL columns: the empty string in internal mode.
    pub fn endpoint_str(&self) -> &str {
        self.parts.endpoint.as_ref().map_or("", Endpoint::as_str)
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.parts.key
    }

    /// A fixed-length, collision-resistant name for the scope: the hex SHA-256 of its
    /// length-prefixed parts. Stores that need one string per record (Redis) use it; it
    /// reveals neither the tenant nor the key.
    pub fn digest(&self) -> String {
        self.parts
            .derived
            .digest
            .get_or_init(|| self.make_digest())
            .clone()
    }

    fn make_digest(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            self.tenant().as_str(),
            self.endpoint_str(),
            self.key().as_str(),
        ] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        hex_digest("", &h.finalize())
    }
}

/// `prefix` followed by the lowercase hex digits of a SHA-256 `digest`, in one
/// allocation (`hex::encode` pushes its digits one `char` at a time, which cost more
/// than the hashing on the Redis store's path).
pub(crate) fn hex_digest(prefix: &str, digest: &[u8]) -> String {
    let mut hex = [0u8; 64];
    hex::encode_to_slice(digest, &mut hex).expect("64 hex digits for 32 bytes");
    let mut out = String::with_capacity(prefix.len() + hex.len());
    out.push_str(prefix);
    out.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_mode_drops_endpoint() {
        let key = Key::new("k").unwrap();
        let a = Scope::new(
            ScopeMode::Internal,
            Tenant::anonymous(),
            Endpoint::new("POST", "/a"),
            key.clone(),
        );
        let b = Scope::new(
            ScopeMode::Internal,
            Tenant::anonymous(),
            Endpoint::new("POST", "/b"),
            key.clone(),
        );
        assert_eq!(a, b);
        let c = Scope::new(
            ScopeMode::Public,
            Tenant::anonymous(),
            Endpoint::new("POST", "/a"),
            key.clone(),
        );
        let d = Scope::new(
            ScopeMode::Public,
            Tenant::anonymous(),
            Endpoint::new("POST", "/b"),
            key,
        );
        assert_ne!(c, d);
        assert_ne!(c.digest(), d.digest());
    }

    /// Redis keeps each record under its scope's digest, and a tenant named by
    /// credentials is stored by its HMAC: a release that spelled either differently
    /// would lose every stored record. The expected values were computed apart from
    /// this code, from the layouts the docs give (each part's length as a big-endian
    /// `u64`, then its bytes; lowercase hex; the tenant's HMAC input as
    /// [`TenantHasher`](crate::TenantHasher) documents it). The tenant is keyed by a
    /// secret since before the first release; the scope digest's layout is unchanged.
    #[test]
    fn digests_are_stable_across_releases() {
        let key = crate::TenantKey::new(&[0x42; 32]).unwrap();
        let tenant = key.credential("authorization", b"Bearer sk_live_secret");
        assert_eq!(
            tenant.as_str(),
            "hmac-sha256:1332d0dc777cfe968fe915a36e7f6948684dbcc48711bc0a658ce922e5bf6da8"
        );
        let keyed = Scope::from_parts(
            tenant,
            Some(Endpoint::new("post", "/v1/charges")),
            Key::new("k-1").unwrap(),
        );
        assert_eq!(
            keyed.digest(),
            "1d58245f9d22dec5ca281697d588471d6b3c48a92c2c1d5ea39fcd2dadff185e"
        );
        let scope = Scope::from_parts(
            Tenant::new("acct_1"),
            Some(Endpoint::new("post", "/v1/charges")),
            Key::new("k-1").unwrap(),
        );
        assert_eq!(
            scope.digest(),
            "b97ebaf440b5ad6cb1df23f158985d72b6227e041fe4fc8af96092eb4c47fc8f"
        );
        let anonymous = Scope::from_parts(Tenant::anonymous(), None, Key::new("k").unwrap());
        assert_eq!(
            anonymous.digest(),
            "195bd0c3161baf3dabc8d1e54a6e1c4aa703710b7327c5517fa5d2eece47b318"
        );
    }

    #[test]
    fn equal_scopes_hash_alike_whichever_hashed_first() {
        use std::collections::HashMap;
        let make = |key: &str| {
            Scope::new(
                ScopeMode::Public,
                Tenant::new("t"),
                Endpoint::new("POST", "/v1/charges"),
                Key::new(key).unwrap(),
            )
        };
        let mut map = HashMap::new();
        for i in 0..100 {
            map.insert(make(&format!("k{i}")), i);
        }
        // Fresh scopes (nothing cached yet) find the entries of equal ones.
        for i in 0..100 {
            assert_eq!(map.get(&make(&format!("k{i}"))), Some(&i));
        }
        assert_eq!(map.get(&make("k100")), None);
        // The cached hash takes no part in equality.
        let (a, b) = (make("same"), make("same"));
        let _ = map.get(&a);
        assert_eq!(a, b);
        assert_eq!(a.cmp(&b), std::cmp::Ordering::Equal);
    }

    #[test]
    fn digest_is_unambiguous() {
        // Without length prefixes these two would hash the same concatenation.
        let a = Scope::from_parts(Tenant::new("ab"), None, Key::new("c").unwrap());
        let b = Scope::from_parts(Tenant::new("a"), None, Key::new("bc").unwrap());
        assert_ne!(a.digest(), b.digest());
    }
}
