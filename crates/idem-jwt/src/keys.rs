//! The keys a token is checked against: a JWKS document's public keys (RSA, P-256,
//! Ed25519) as `jsonwebtoken` reads them, and where the document comes from. The set
//! held, and loaded again, is the [key ring](super::keyring)'s.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// Where a JWKS document (RFC 7517 §5, `{"keys": [...]}`) comes from.
pub trait JwksSource: Send + Sync + 'static {
    /// Reads the document's bytes.
    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send + '_>>;

    /// Where it comes from, for messages (`/etc/idem/jwks.json`).
    fn describe(&self) -> String;
}

/// A JWKS document in a file, read again when a token names a key it lacks.
#[derive(Clone, Debug)]
pub struct JwksFile(pub PathBuf);

impl JwksSource for JwksFile {
    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send + '_>> {
        Box::pin(async move {
            tokio::task::spawn_blocking({
                let path = self.0.clone();
                move || std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
            })
            .await
            .map_err(|e| e.to_string())?
        })
    }

    fn describe(&self) -> String {
        self.0.display().to_string()
    }
}

/// The name of an algorithm the verifier accepts; `None` for the others.
pub(super) fn accepted(alg: Algorithm) -> Option<&'static str> {
    Some(match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::RS256 => "RS256",
        Algorithm::ES256 => "ES256",
        Algorithm::EdDSA => "EdDSA",
        _ => return None,
    })
}

/// One public key of a JWKS document, and the one algorithm it verifies.
#[derive(Debug)]
pub(super) struct PublicKey {
    pub(super) kid: Option<String>,
    pub(super) alg: Algorithm,
    pub(super) key: DecodingKey,
}

/// A signing key of a JWKS document that this verifier does not use: an algorithm it
/// does not verify (`PS256`, `RS512`, `ES384`), or a curve or key type it has no
/// algorithm for. Tokens signed with it are refused (401) as naming no key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Skipped {
    /// The key's `kid`, if it has one.
    pub(super) kid: Option<String>,
    /// Its `alg` as written, or its type (`kty EC, crv P-384`) when it names none.
    pub(super) alg: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kid {
            Some(kid) => write!(f, "kid {kid:?} ({})", self.alg),
            None => write!(f, "a key without a kid ({})", self.alg),
        }
    }
}

/// A JWKS document read: the keys this verifier uses, and the signing keys it skipped.
#[derive(Debug)]
pub(super) struct KeySet {
    pub(super) keys: Vec<PublicKey>,
    pub(super) skipped: Vec<Skipped>,
}

/// The RSA algorithms other than `RS256`: a key naming one is the issuer's, for tokens
/// this verifier does not accept (`PS256`, `RS512`), or for encryption.
fn other_rsa(alg: KeyAlgorithm) -> Option<bool> {
    match alg {
        KeyAlgorithm::RS384
        | KeyAlgorithm::RS512
        | KeyAlgorithm::PS256
        | KeyAlgorithm::PS384
        | KeyAlgorithm::PS512 => Some(true),
        KeyAlgorithm::RSA1_5 | KeyAlgorithm::RSA_OAEP | KeyAlgorithm::RSA_OAEP_256 => Some(false),
        _ => None,
    }
}

/// Parses a JWKS document. Keys for encryption are passed over; signing keys this
/// verifier cannot use (an algorithm it does not verify, such as `PS256` or `RS512`;
/// another curve; a symmetric key) are skipped and named in [`KeySet::skipped`], so
/// that one of them never makes the whole set refused. A key it could use but that is
/// malformed, or whose `alg` cannot be its type's (`ES256` on an RSA key), is an
/// error, since a typo there would otherwise be a silent 401 for everyone.
pub(super) fn parse_jwks(bytes: &[u8]) -> Result<KeySet, String> {
    let set: JwkSet = serde_json::from_slice(bytes).map_err(|e| match e.is_data() {
        true => format!("no \"keys\" array of JWKs: {e}"),
        false => format!("not JSON: {e}"),
    })?;
    // The same keys as written, for the names of algorithms jsonwebtoken does not know.
    let written: Vec<Value> = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|mut doc| match doc.get_mut("keys").map(Value::take) {
            Some(Value::Array(keys)) => Some(keys),
            _ => None,
        })
        .unwrap_or_default();
    let mut out = KeySet {
        keys: Vec::new(),
        skipped: Vec::new(),
    };
    for (i, jwk) in set.keys.iter().enumerate() {
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != PublicKeyUse::Signature)
        {
            continue;
        }
        let field = |name: &str| written.get(i)?.get(name)?.as_str().map(str::to_owned);
        // Named by its `alg` as written, else by its type and curve.
        let skip = |out: &mut KeySet| {
            let kind = || {
                let kty = field("kty").unwrap_or_else(|| "?".into());
                match field("crv") {
                    Some(crv) => format!("kty {kty}, crv {crv}"),
                    None => format!("kty {kty}"),
                }
            };
            out.skipped.push(Skipped {
                kid: jwk.common.key_id.clone(),
                alg: field("alg").unwrap_or_else(kind),
            });
        };
        // The key, and the length of its bytes where a wrong one is a typo.
        let (alg, key, length) = match &jwk.algorithm {
            AlgorithmParameters::RSA(p) => (
                Algorithm::RS256,
                DecodingKey::from_rsa_components(&p.n, &p.e),
                None,
            ),
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => (
                Algorithm::ES256,
                DecodingKey::from_ec_components(&p.x, &p.y),
                Some((65, "a P-256 x and y are 32 bytes each")),
            ),
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => (
                Algorithm::EdDSA,
                DecodingKey::from_ed_components(&p.x),
                Some((32, "an Ed25519 x is 32 bytes")),
            ),
            // A key of a type this verifier uses that jsonwebtoken could not read.
            AlgorithmParameters::Other(p) => {
                let other = |name: &str| p.fields.get(name).and_then(Value::as_str);
                if let (Some("RSA"), _)
                | (Some("EC"), Some("P-256"))
                | (Some("OKP"), Some("Ed25519")) = (other("kty"), other("crv"))
                {
                    return Err(format!("key {i} is not a well-formed key of its type"));
                }
                skip(&mut out);
                continue;
            }
            // Another curve (P-384, Ed448), a symmetric key, a type yet unknown.
            _ => {
                skip(&mut out);
                continue;
            }
        };
        if let Some(named) = jwk.common.key_algorithm
            && named != alg.into()
        {
            match (named, alg) {
                // An RSA key for encryption that does not say `use`.
                (named, Algorithm::RS256) if other_rsa(named) == Some(false) => continue,
                // The issuer's key for an algorithm this verifier does not accept:
                // skipped, and the rest of the set used.
                (named, Algorithm::RS256) if other_rsa(named) == Some(true) => {}
                (KeyAlgorithm::UNKNOWN_ALGORITHM, _) => {}
                _ => {
                    return Err(format!(
                        "key {i} says alg {named}, but its type is for {alg:?}"
                    ));
                }
            }
            skip(&mut out);
            continue;
        }
        let key = key.map_err(|e| format!("key {i} is not base64url: {e}"))?;
        if let Some((length, what)) = length
            && key.try_get_as_bytes().map_or(true, |b| b.len() != length)
        {
            return Err(format!("key {i}: {what}"));
        }
        out.keys.push(PublicKey {
            kid: jwk.common.key_id.clone(),
            alg,
            key,
        });
    }
    Ok(out)
}
