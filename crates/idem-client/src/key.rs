//! Making keys (SPEC S2, S11): a random UUIDv4 per operation, or a keyed hash of a
//! business value so that the same business operation always gets the same key and no
//! personal data appears in it.

use std::fmt;

use hmac::{KeyInit, Mac};
use idem_core::Key;
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

/// A fresh random key: a UUIDv4 in its hyphenated lower-case form.
///
/// [`Client::operation`](crate::Client::operation) calls this for every new operation;
/// call it yourself only to store the key before the operation exists.
pub fn random_key() -> Key {
    Key::new(uuid::Uuid::new_v4().hyphenated().to_string()).expect("a UUID is a valid key")
}

/// Derives keys from business values with HMAC-SHA-256 under a caller secret.
///
/// Use it when the business operation already has a natural identity (a cart id, an
/// invoice number, a payout batch) and a restarted process must find the same key
/// without a journal. The value (which may be personal data, an e-mail address say)
/// never appears in the key: without the secret the key reveals nothing about it, and
/// it cannot be guessed by hashing candidate values.
///
/// The secret is the random salt of SPEC S11: keep it as you keep other secrets, and
/// keep it stable for as long as keys must match across restarts (at least the
/// server's record TTL, 24 h by default).
///
/// ```
/// use idem_client::KeyDeriver;
///
/// let deriver = KeyDeriver::new(b"a 32-byte secret from your vault".to_vec());
/// let a = deriver.derive("checkout", b"cart-8812");
/// assert_eq!(a, deriver.derive("checkout", b"cart-8812"));
/// assert_ne!(a, deriver.derive("refund", b"cart-8812"));
/// assert_eq!(a.as_str().len(), 64);
/// ```
#[derive(Clone)]
pub struct KeyDeriver {
    secret: Vec<u8>,
}

impl KeyDeriver {
    /// A deriver under `secret`. Use at least 32 random bytes.
    pub fn new(secret: impl Into<Vec<u8>>) -> KeyDeriver {
        KeyDeriver {
            secret: secret.into(),
        }
    }

    /// A deriver under 32 fresh random bytes. Keys from it match only while this value
    /// (or its [`secret`](Self::secret), stored somewhere safe) lives.
    pub fn random() -> KeyDeriver {
        let mut secret = vec![0u8; 32];
        getrandom::fill(&mut secret).expect("the operating system's random generator failed");
        KeyDeriver { secret }
    }

    /// The secret, to store it where a restarted process can find it again.
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The key of `value` for the kind of operation `purpose` names (`"checkout"`,
    /// `"refund"`): 64 lower-case hex characters of
    /// HMAC-SHA-256(secret, len(purpose) ‖ purpose ‖ value).
    ///
    /// The purpose keeps two operations on the same business value apart (charging and
    /// refunding one order must not share a key); its length prefix keeps
    /// `("ab", "c")` and `("a", "bc")` apart.
    pub fn derive(&self, purpose: &str, value: &[u8]) -> Key {
        let mut mac =
            HmacSha256::new_from_slice(&self.secret).expect("HMAC accepts keys of any length");
        mac.update(&(purpose.len() as u64).to_be_bytes());
        mac.update(purpose.as_bytes());
        mac.update(value);
        let digest = mac.finalize().into_bytes();
        Key::new(hex::encode(digest)).expect("64 hex characters are a valid key")
    }

    /// The [`BusinessId`] of `value` for the kind of operation `purpose` names: what
    /// [`Journal::persist_unique`](crate::Journal::persist_unique) sends at most once.
    ///
    /// It is HMAC-SHA-256 under the same secret, in a domain of its own, so it never
    /// equals a key from [`derive`](Self::derive) on the same value: the journal can
    /// hold both without one telling anything about the other.
    #[cfg(feature = "journal")]
    pub fn business_id(&self, purpose: &str, value: &[u8]) -> BusinessId {
        let mut mac =
            HmacSha256::new_from_slice(&self.secret).expect("HMAC accepts keys of any length");
        mac.update(BUSINESS_ID_DOMAIN);
        mac.update(&(purpose.len() as u64).to_be_bytes());
        mac.update(purpose.as_bytes());
        mac.update(value);
        BusinessId {
            digest: mac.finalize().into_bytes().into(),
        }
    }
}

/// What sets [`KeyDeriver::business_id`] apart from [`KeyDeriver::derive`]: `derive`
/// starts with a length, whose first byte is zero for any purpose shorter than 2^56.
#[cfg(feature = "journal")]
const BUSINESS_ID_DOMAIN: &[u8] = b"idem-client business id\0";

/// The identity of a business operation (an order number, a payout batch, an e-mail
/// address), as the journal stores it: a keyed hash, made by
/// [`KeyDeriver::business_id`], never the value itself.
///
/// Business ids are often personal data. The journal keeps only this 32-byte
/// HMAC-SHA-256 under the deriver's secret, so its file does not reveal the id, and
/// without the secret the id cannot be found by hashing candidates. Keep the secret
/// stable for as long as the journal keeps entries: under another secret the same id
/// is another business id, and would be sent again.
///
/// ```
/// use idem_client::KeyDeriver;
///
/// let deriver = KeyDeriver::new(b"a 32-byte secret from your vault".to_vec());
/// let id = deriver.business_id("payout", b"order-4711");
/// assert_eq!(id, deriver.business_id("payout", b"order-4711"));
/// assert_ne!(id, deriver.business_id("refund", b"order-4711"));
/// ```
#[cfg(feature = "journal")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BusinessId {
    digest: [u8; 32],
}

#[cfg(feature = "journal")]
impl BusinessId {
    /// The hash as stored in the journal's `business_id` column.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// Rebuilds a business id from a stored [`digest`](Self::digest).
    pub(crate) fn from_digest(digest: [u8; 32]) -> BusinessId {
        BusinessId { digest }
    }
}

#[cfg(feature = "journal")]
impl fmt::Debug for BusinessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A prefix tells entries apart in logs; the hash reveals nothing without the
        // secret anyway.
        write!(f, "BusinessId({}…)", hex::encode(&self.digest[..6]))
    }
}

impl fmt::Debug for KeyDeriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret is what keeps derived keys unguessable.
        f.debug_struct("KeyDeriver").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_keys_are_uuid_v4_and_distinct() {
        let a = random_key();
        let b = random_key();
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(a.as_str()).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
    }

    #[test]
    fn derived_key_is_stable_and_hides_the_value() {
        let d = KeyDeriver::new(b"secret-one".to_vec());
        let k = d.derive("signup-bonus", b"alice@example.com");
        assert_eq!(k, d.derive("signup-bonus", b"alice@example.com"));
        assert!(!k.as_str().contains("alice"));
        assert!(k.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn derived_key_depends_on_secret_purpose_and_value() {
        let d = KeyDeriver::new(b"secret-one".to_vec());
        let other = KeyDeriver::new(b"secret-two".to_vec());
        let k = d.derive("p", b"v");
        assert_ne!(k, other.derive("p", b"v"));
        assert_ne!(k, d.derive("q", b"v"));
        assert_ne!(k, d.derive("p", b"w"));
        // Without the length prefix these would hash the same bytes.
        assert_ne!(d.derive("ab", b"c"), d.derive("a", b"bc"));
    }

    #[test]
    fn derived_keys_never_change_across_releases() {
        // A restarted (or upgraded) client must derive the key it derived before, or
        // its retry executes the operation again. Pinned value; never update it.
        let d = KeyDeriver::new(b"Jefe".to_vec());
        assert_eq!(
            d.derive("checkout", b"cart-8812").as_str(),
            "6ac7932a3dd57feebf3e76cfed14e1f86c4b0c954fda7c339382189313ecf76a"
        );
    }

    #[cfg(feature = "journal")]
    #[test]
    fn business_ids_never_change_across_releases_and_are_not_keys() {
        // A journal written by one release must guard the same ids under the next.
        // Pinned value; never update it.
        let d = KeyDeriver::new(b"Jefe".to_vec());
        let id = d.business_id("checkout", b"cart-8812");
        assert_eq!(hex::encode(id.digest()), PINNED_BUSINESS_ID);
        assert_ne!(
            hex::encode(id.digest()),
            d.derive("checkout", b"cart-8812").as_str()
        );
        assert_ne!(
            id,
            KeyDeriver::new(b"other".to_vec()).business_id("checkout", b"cart-8812")
        );
        assert_ne!(id, d.business_id("checkout", b"cart-8813"));
        assert!(!format!("{id:?}").contains("cart"));
    }

    #[cfg(feature = "journal")]
    const PINNED_BUSINESS_ID: &str =
        "224bfd796b1c7bb0df9641372b38ad7fca66bd3027aed88b545264f72584e0f8";

    #[test]
    fn debug_does_not_show_the_secret() {
        let d = KeyDeriver::new(b"topsecret".to_vec());
        assert!(!format!("{d:?}").contains("topsecret"));
    }
}
