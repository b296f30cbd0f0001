//! Naming a tenant by its credentials without keeping anything a stolen store could
//! reverse (SPEC S3): an HMAC-SHA256 under a deployment secret.
//!
//! A plain hash of a credential is no protection: `Basic alice:hunter2` falls to a
//! short word list in a fraction of a millisecond. Keyed by a secret the store holds
//! apart from its records, or that the operator keeps outside the store, the digest
//! says nothing to someone who has the records alone, and nothing at all to someone
//! who has neither.

use std::fmt;

use hmac::{KeyInit, Mac};
use sha2::Sha256;

use crate::{Store, StoreError, Tenant};

type HmacSha256 = hmac::Hmac<Sha256>;

/// The shortest tenant secret accepted, in bytes: 256 bits, the HMAC-SHA256 key size.
/// A shorter one could be guessed along with the credentials.
pub const MIN_TENANT_SECRET_LEN: usize = 32;

/// The name under which a store keeps the tenant secret it generated (see
/// [`Store::init_secret`] and [`TenantKey::from_store`]).
pub const TENANT_SECRET_NAME: &str = "tenant-secret";

/// How a tenant named by [`TenantKey`] starts when stored: `hmac-sha256:` and 64
/// lower-case hex digits follow.
pub const TENANT_PREFIX: &str = "hmac-sha256:";

/// What every HMAC input starts with, so that the digest of a tenant can never equal
/// one this secret makes for another purpose, and a later layout can tell itself apart.
const DOMAIN: &[u8] = b"idem tenant v1\0";

/// A tenant secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TenantSecretError {
    /// The secret is shorter than [`MIN_TENANT_SECRET_LEN`] bytes.
    #[error(
        "the tenant secret is {len} bytes long; it needs at least {MIN_TENANT_SECRET_LEN} \
         (generate one with `openssl rand -hex 32`)"
    )]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// The system's random source failed while generating a secret.
    #[error("no random bytes for a tenant secret: {0}")]
    Random(String),
}

/// The key that names tenants: HMAC-SHA256 under a deployment secret.
///
/// Every instance in front of one store must use the same secret, or a retry that
/// reaches another instance (or this one restarted) is another tenant's and executes
/// again. [`TenantKey::from_store`] gets the one the store keeps (generating it on the
/// first start); [`TenantKey::new`] takes one the operator provides. Cheap to clone;
/// its `Debug` shows nothing of the secret.
///
/// ```
/// use idem_core::{TenantKey, TENANT_PREFIX};
///
/// let key = TenantKey::new(&[7u8; 32]).unwrap();
/// let tenant = key.credential("authorization", b"Basic YWxpY2U6aHVudGVyMg==");
/// assert!(tenant.as_str().starts_with(TENANT_PREFIX));
/// assert!(TenantKey::new(b"too short").is_err());
/// ```
#[derive(Clone)]
pub struct TenantKey {
    mac: HmacSha256,
}

impl TenantKey {
    /// A key from a secret of at least [`MIN_TENANT_SECRET_LEN`] bytes.
    pub fn new(secret: &[u8]) -> Result<TenantKey, TenantSecretError> {
        if secret.len() < MIN_TENANT_SECRET_LEN {
            return Err(TenantSecretError::TooShort { len: secret.len() });
        }
        let mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
        Ok(TenantKey { mac })
    }

    /// A fresh secret: [`MIN_TENANT_SECRET_LEN`] bytes from the system's random source.
    pub fn generate_secret() -> Result<Vec<u8>, TenantSecretError> {
        let mut secret = vec![0u8; MIN_TENANT_SECRET_LEN];
        getrandom::fill(&mut secret).map_err(|e| TenantSecretError::Random(e.to_string()))?;
        Ok(secret)
    }

    /// The key under the secret `store` keeps as [`TENANT_SECRET_NAME`], which this
    /// call generates and stores when there is none yet. Instances that start at once
    /// on one store all get the one secret that was stored first.
    ///
    /// Fails as the store does, and with [`StoreError::Corrupt`] when the stored
    /// secret is shorter than [`MIN_TENANT_SECRET_LEN`].
    pub async fn from_store<S: Store + ?Sized>(store: &S) -> crate::Result<TenantKey> {
        let candidate = TenantKey::generate_secret().map_err(StoreError::unavailable)?;
        let secret = store.init_secret(TENANT_SECRET_NAME, &candidate).await?;
        TenantKey::new(&secret).map_err(|e| {
            StoreError::Corrupt(format!("the stored {TENANT_SECRET_NAME} is unusable: {e}"))
        })
    }

    /// A hasher for one request's tenant: give it each source (header) the tenant is
    /// named by, in the configured order, then [`finish`](TenantHasher::finish).
    pub fn hasher(&self) -> TenantHasher {
        let mut mac = self.mac.clone();
        mac.update(DOMAIN);
        TenantHasher {
            mac,
            present: false,
        }
    }

    /// The tenant named by one source with one value: `credential`, as `source`
    /// carried it. The same as a [`hasher`](Self::hasher) given that source alone.
    pub fn credential(&self, source: &str, credential: &[u8]) -> Tenant {
        let mut h = self.hasher();
        h.source(source, [credential]);
        h.finish()
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantKey(..)")
    }
}

/// One tenant's HMAC in the making (see [`TenantKey::hasher`]).
///
/// Each source is written as its name's length (a big-endian `u64`) and bytes, then
/// each of its values as a `1` byte, the value's length and its bytes, then a `0`
/// byte. So no two different lists of sources and values give the same input: a
/// source without values (absent) differs from one with an empty value, two values
/// from their concatenation, and a value from the next source's name.
pub struct TenantHasher {
    mac: HmacSha256,
    /// Whether any source had a value.
    present: bool,
}

impl TenantHasher {
    /// Adds a source (a header name, say) and its values in order; none when the
    /// request did not carry it.
    pub fn source<V: AsRef<[u8]>>(
        &mut self,
        name: &str,
        values: impl IntoIterator<Item = V>,
    ) -> &mut TenantHasher {
        self.mac.update(&(name.len() as u64).to_be_bytes());
        self.mac.update(name.as_bytes());
        for value in values {
            let value = value.as_ref();
            self.present = true;
            self.mac.update(&[1]);
            self.mac.update(&(value.len() as u64).to_be_bytes());
            self.mac.update(value);
        }
        self.mac.update(&[0]);
        self
    }

    /// Whether any source given so far had a value.
    pub fn any_present(&self) -> bool {
        self.present
    }

    /// The tenant: `hmac-sha256:<hex>`, or [`Tenant::anonymous`] when no source had a
    /// value.
    pub fn finish(self) -> Tenant {
        if !self.present {
            return Tenant::anonymous();
        }
        let digest = self.mac.finalize().into_bytes();
        Tenant::new(crate::scope::hex_digest(TENANT_PREFIX, &digest))
    }
}

impl fmt::Debug for TenantHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantHasher")
            .field("present", &self.present)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    fn key(byte: u8) -> TenantKey {
        TenantKey::new(&[byte; 32]).unwrap()
    }

    /// A source and its values, as a request would carry them.
    type Source<'a> = (&'a str, &'a [&'a [u8]]);

    /// Sources in order.
    type Sources<'a> = [Source<'a>];

    fn tenant(key: &TenantKey, sources: &Sources<'_>) -> Tenant {
        let mut h = key.hasher();
        for (name, values) in sources {
            h.source(name, values.iter());
        }
        h.finish()
    }

    #[test]
    fn secrets_shorter_than_32_bytes_are_refused() {
        assert_eq!(
            TenantKey::new(&[1; 31]).unwrap_err(),
            TenantSecretError::TooShort { len: 31 }
        );
        assert!(TenantKey::new(b"").is_err());
        assert!(TenantKey::new(&[1; 32]).is_ok());
        let message = TenantKey::new(b"hunter2").unwrap_err().to_string();
        assert!(
            message.contains("7 bytes") && message.contains("32"),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn generated_secrets_are_32_random_bytes() {
        let a = TenantKey::generate_secret().unwrap();
        let b = TenantKey::generate_secret().unwrap();
        assert_eq!(a.len(), MIN_TENANT_SECRET_LEN);
        assert_ne!(a, b);
    }

    /// The stored name is neither the credential, nor its SHA-256, nor anything a
    /// word list over the credential could reach without the secret.
    #[test]
    fn stored_tenant_is_keyed_not_a_plain_hash() {
        let credential = b"Basic alice:hunter2";
        let t = key(1).credential("authorization", credential);
        let plain = hex::encode(Sha256::digest(credential));
        assert!(t.as_str().starts_with(TENANT_PREFIX), "{t}");
        assert_eq!(t.as_str().len(), TENANT_PREFIX.len() + 64);
        assert!(!t.as_str().contains(&plain), "{t}");
        assert!(!t.as_str().contains("alice"), "{t}");
        assert_eq!(t, key(1).credential("authorization", credential));
        assert_ne!(t, key(2).credential("authorization", credential));
        assert_ne!(
            t,
            key(1).credential("authorization", b"Basic alice:hunter3")
        );
    }

    #[test]
    fn no_source_with_a_value_is_anonymous() {
        assert_eq!(tenant(&key(1), &[]), Tenant::anonymous());
        assert_eq!(
            tenant(&key(1), &[("authorization", &[]), ("stripe-account", &[])]),
            Tenant::anonymous()
        );
        // An empty value is a value: not anonymous.
        assert_ne!(
            tenant(&key(1), &[("authorization", &[b""])]),
            Tenant::anonymous()
        );
    }

    /// Different lists of sources and values never meet, however their bytes line up.
    #[test]
    fn distinct_header_sets_never_collide() {
        let k = key(3);
        let cases: Vec<Vec<Source>> = vec![
            vec![("a", &[b"x"]), ("b", &[])],
            vec![("a", &[b"x"]), ("b", &[b""])],
            vec![("a", &[]), ("b", &[b"x"])],
            vec![("a", &[b"x", b"y"])],
            vec![("a", &[b"xy"])],
            vec![("a", &[b"y", b"x"])],
            vec![("a", &[b"x"]), ("b", &[b"y"])],
            vec![("a", &[b"x", b"y"]), ("b", &[])],
            vec![("ab", &[b"x"])],
            vec![("a", &[b"bx"])],
            vec![("b", &[b"y"]), ("a", &[b"x"])],
        ];
        let names: Vec<Tenant> = cases.iter().map(|c| tenant(&k, c)).collect();
        for (i, a) in names.iter().enumerate() {
            for (j, b) in names.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{:?} and {:?} collide", cases[i], cases[j]);
            }
        }
    }

    #[test]
    fn debug_shows_no_secret() {
        let shown = format!("{:?} {:?}", key(0x41), key(0x41).hasher());
        assert!(!shown.contains("AAAA") && !shown.contains("65"), "{shown}");
    }

    /// A record's scope is named by the stored tenant: a release that spelled the
    /// HMAC input differently would orphan every record. The expected value was
    /// computed apart from this code from the layout documented on [`TenantHasher`]:
    /// HMAC-SHA256, key 32 bytes of 0x01, over `"idem tenant v1\0"`, then
    /// `u64be(13) "authorization" 0x01 u64be(19) "Basic alice:hunter2" 0x00`.
    #[test]
    fn tenant_layout_is_stable_across_releases() {
        assert_eq!(
            key(1)
                .credential("authorization", b"Basic alice:hunter2")
                .as_str(),
            "hmac-sha256:3dd334cefd4ec52f95f2e1b8337dd16aeabd2e0a08ff46275419406e9e733b8d"
        );
    }
}
