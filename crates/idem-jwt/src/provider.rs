//! ring as `jsonwebtoken`'s crypto provider: the library the workspace's TLS already
//! uses, where `jsonwebtoken`'s own providers would bring aws-lc-rs or a second set of
//! crypto crates. It verifies only, each algorithm with a key of its own family, so a
//! public key is never taken as an HMAC secret whatever a token's header says.

use jsonwebtoken::crypto::{self, CryptoProvider, KeyUtils};
use jsonwebtoken::errors::{ErrorKind, Result, new_error};
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind, signature};
use ring::signature::{self as sig, RsaPublicKeyComponents, UnparsedPublicKey};

static RING: CryptoProvider = CryptoProvider {
    signer_factory: |_, _| {
        Err(new_error(ErrorKind::Provider(
            "this provider only verifies".into(),
        )))
    },
    verifier_factory,
    key_utils: KeyUtils::new_unimplemented(),
};

/// Makes ring the process's provider, unless it has one already (an application's
/// own, or one its `jsonwebtoken` features name), which then verifies for idem too.
pub(super) fn install() {
    if CryptoProvider::try_get_default().is_none() {
        // Another thread may install one first: that one verifies as well.
        let _ = RING.install_default();
    }
}

/// A verifier of `alg` with `key`, when the key is of the algorithm's family.
pub(super) fn verifier_factory(
    alg: &Algorithm,
    key: &DecodingKey,
) -> Result<Box<dyn crypto::JwtVerifier>> {
    if key.family() != alg.family() {
        return Err(new_error(ErrorKind::InvalidAlgorithm));
    }
    let public = |alg: &'static dyn sig::VerificationAlgorithm| -> Result<Key> {
        Ok(Key::Public(alg, key.try_get_as_bytes()?.to_vec()))
    };
    let verify = match (alg, key.kind()) {
        (Algorithm::HS256, _) => Key::Hmac(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            key.try_get_as_bytes()?,
        )),
        (Algorithm::RS256, DecodingKeyKind::RsaModulusExponent { n, e }) => Key::Rsa {
            n: n.clone(),
            e: e.clone(),
        },
        (Algorithm::RS256, _) => public(&sig::RSA_PKCS1_2048_8192_SHA256)?,
        (Algorithm::ES256, _) => public(&sig::ECDSA_P256_SHA256_FIXED)?,
        (Algorithm::EdDSA, _) => public(&sig::ED25519)?,
        _ => return Err(new_error(ErrorKind::UnsupportedAlgorithm)),
    };
    Ok(Box::new(Verifier {
        alg: *alg,
        key: verify,
    }))
}

struct Verifier {
    alg: Algorithm,
    key: Key,
}

enum Key {
    Hmac(ring::hmac::Key),
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// A P-256 point, an Ed25519 key, or an RSA key in DER.
    Public(&'static dyn sig::VerificationAlgorithm, Vec<u8>),
}

impl signature::Verifier<Vec<u8>> for Verifier {
    fn verify(
        &self,
        message: &[u8],
        signature: &Vec<u8>,
    ) -> std::result::Result<(), signature::Error> {
        match &self.key {
            Key::Hmac(key) => ring::hmac::verify(key, message, signature).is_ok(),
            Key::Rsa { n, e } => RsaPublicKeyComponents { n, e }
                .verify(&sig::RSA_PKCS1_2048_8192_SHA256, message, signature)
                .is_ok(),
            Key::Public(alg, key) => UnparsedPublicKey::new(*alg, key)
                .verify(message, signature)
                .is_ok(),
        }
        .then_some(())
        .ok_or_else(signature::Error::new)
    }
}

impl crypto::JwtVerifier for Verifier {
    fn algorithm(&self) -> Algorithm {
        self.alg
    }
}
