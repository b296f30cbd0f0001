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

    #[test]
    fn debug_does_not_show_the_secret() {
        let d = KeyDeriver::new(b"topsecret".to_vec());
        assert!(!format!("{d:?}").contains("topsecret"));
    }
}
