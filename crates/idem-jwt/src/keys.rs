//! The keys a token is checked against: a JWKS document's public keys (RSA, P-256,
//! Ed25519) as `jsonwebtoken` reads them, where the document comes from, and the set
//! held and loaded again when a token names a key it lacks.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use super::JwtError;

/// The shortest time between two loads of a key set for unknown `kid`s.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

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
    kid: Option<String>,
    alg: Algorithm,
    pub(super) key: DecodingKey,
}

/// Parses a JWKS document. Keys this verifier cannot use (symmetric ones, other
/// curves, keys for encryption) are skipped; a key it could use but that is malformed
/// is an error, since a typo there would otherwise be a silent 401 for everyone.
pub(super) fn parse_jwks(bytes: &[u8]) -> Result<Vec<PublicKey>, String> {
    let set: JwkSet = serde_json::from_slice(bytes).map_err(|e| match e.is_data() {
        true => format!("no \"keys\" array of JWKs: {e}"),
        false => format!("not JSON: {e}"),
    })?;
    let mut out = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != PublicKeyUse::Signature)
        {
            continue;
        }
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
                let field = |name: &str| p.fields.get(name).and_then(Value::as_str);
                match (field("kty"), field("crv")) {
                    (Some("RSA"), _)
                    | (Some("EC"), Some("P-256"))
                    | (Some("OKP"), Some("Ed25519")) => {
                        return Err(format!("key {i} is not a well-formed key of its type"));
                    }
                    _ => continue,
                }
            }
            _ => continue,
        };
        let key = key.map_err(|e| format!("key {i} is not base64url: {e}"))?;
        if let Some((length, what)) = length
            && key.try_get_as_bytes().map_or(true, |b| b.len() != length)
        {
            return Err(format!("key {i}: {what}"));
        }
        if let Some(named) = jwk.common.key_algorithm
            && named != alg.into()
        {
            return Err(format!(
                "key {i} says alg {named}, but its type is for {alg:?}"
            ));
        }
        out.push(PublicKey {
            kid: jwk.common.key_id.clone(),
            alg,
            key,
        });
    }
    Ok(out)
}

/// A key set and where to load it again.
pub(super) struct KeyRing {
    pub(super) source: Box<dyn JwksSource>,
    keys: RwLock<Arc<Vec<Arc<PublicKey>>>>,
    /// When a token with an unknown `kid` last made the set load again, for the reload
    /// interval; held across a reload, so that concurrent requests with a new `kid`
    /// load it once.
    loaded: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

impl KeyRing {
    /// A ring with no key yet: [`reload`](Self::reload) loads them.
    pub(super) fn new(source: Box<dyn JwksSource>) -> KeyRing {
        KeyRing {
            source,
            keys: RwLock::default(),
            loaded: tokio::sync::Mutex::new(None),
        }
    }

    fn current(&self) -> Arc<Vec<Arc<PublicKey>>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Loads the set again; on failure the old set stays.
    pub(super) async fn reload(&self) -> Result<usize, String> {
        let bytes = self.source.load().await?;
        let keys: Vec<_> = parse_jwks(&bytes)?.into_iter().map(Arc::new).collect();
        let n = keys.len();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
        Ok(n)
    }

    /// The key `kid` names for `alg` (without a `kid`, the only key for `alg`),
    /// loading the set again (rate-limited) when it has no such key.
    pub(super) async fn find(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Arc<PublicKey>, JwtError> {
        let pick = |keys: &[Arc<PublicKey>]| -> Option<Arc<PublicKey>> {
            let mut fitting = keys.iter().filter(|k| k.alg == alg);
            match kid {
                Some(kid) => fitting.find(|k| k.kid.as_deref() == Some(kid)).cloned(),
                None => match (fitting.next(), fitting.next()) {
                    (Some(only), None) => Some(only.clone()),
                    _ => None,
                },
            }
        };
        let unknown = || {
            let name = accepted(alg).unwrap_or("?");
            JwtError::UnknownKey(kid.map(str::to_owned), name)
        };
        if let Some(key) = pick(&self.current()) {
            return Ok(key);
        }
        let mut loaded = self.loaded.lock().await;
        // Another request may have loaded it while this one waited.
        if let Some(key) = pick(&self.current()) {
            return Ok(key);
        }
        if loaded.is_some_and(|at| at.elapsed() < RELOAD_INTERVAL) {
            return Err(unknown());
        }
        *loaded = Some(tokio::time::Instant::now());
        if let Err(e) = self.reload().await {
            tracing::warn!(source = %self.source.describe(), error = %e, "could not load the JWKS again; keeping the old keys");
        }
        pick(&self.current()).ok_or_else(unknown)
    }
}
