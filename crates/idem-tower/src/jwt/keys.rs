//! The keys a token is checked against: a JWKS document's public keys (RSA, P-256,
//! Ed25519), where the document comes from, and the set held and loaded again when a
//! token names a key it lacks.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, UnparsedPublicKey};
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

/// The algorithms a key may verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Alg {
    Hs256,
    Rs256,
    Es256,
    EdDsa,
}

impl Alg {
    pub(super) fn parse(name: &str) -> Option<Alg> {
        Some(match name {
            "HS256" => Alg::Hs256,
            "RS256" => Alg::Rs256,
            "ES256" => Alg::Es256,
            "EdDSA" => Alg::EdDsa,
            _ => return None,
        })
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Alg::Hs256 => "HS256",
            Alg::Rs256 => "RS256",
            Alg::Es256 => "ES256",
            Alg::EdDsa => "EdDSA",
        }
    }
}

/// One public key of a JWKS document.
#[derive(Debug)]
pub(super) struct PublicKey {
    kid: Option<String>,
    alg: Alg,
    /// RSA: `n` and `e`; EC: the uncompressed point; Ed25519: the 32 bytes.
    material: Material,
}

#[derive(Debug)]
pub(super) enum Material {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    Point(Vec<u8>),
}

impl PublicKey {
    pub(super) fn verify(&self, message: &[u8], sig: &[u8]) -> bool {
        match (&self.material, self.alg) {
            (Material::Rsa { n, e }, Alg::Rs256) => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
                .is_ok(),
            (Material::Point(p), Alg::Es256) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, p)
                    .verify(message, sig)
                    .is_ok()
            }
            (Material::Point(p), Alg::EdDsa) => UnparsedPublicKey::new(&signature::ED25519, p)
                .verify(message, sig)
                .is_ok(),
            _ => false,
        }
    }
}

/// Parses a JWKS document. Keys this verifier cannot use (symmetric ones, other
/// curves, keys for encryption) are skipped; a key it could use but that is malformed
/// is an error, since a typo there would otherwise be a silent 401 for everyone.
pub(super) fn parse_jwks(bytes: &[u8]) -> Result<Vec<PublicKey>, String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("no \"keys\" array")?;
    let mut out = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let field = |name: &str| key.get(name).and_then(Value::as_str);
        let bytes = |name: &str| -> Result<Vec<u8>, String> {
            let text = field(name).ok_or_else(|| format!("key {i} has no {name}"))?;
            URL_SAFE_NO_PAD
                .decode(text)
                .map_err(|e| format!("key {i}'s {name} is not base64url: {e}"))
        };
        if field("use").is_some_and(|u| u != "sig") {
            continue;
        }
        let (alg, material) = match (field("kty"), field("crv")) {
            (Some("RSA"), _) => (
                Alg::Rs256,
                Material::Rsa {
                    n: bytes("n")?,
                    e: bytes("e")?,
                },
            ),
            (Some("EC"), Some("P-256")) => {
                let (x, y) = (bytes("x")?, bytes("y")?);
                if x.len() != 32 || y.len() != 32 {
                    return Err(format!("key {i}: a P-256 x and y are 32 bytes each"));
                }
                let mut point = vec![4];
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                (Alg::Es256, Material::Point(point))
            }
            (Some("OKP"), Some("Ed25519")) => {
                let x = bytes("x")?;
                if x.len() != 32 {
                    return Err(format!("key {i}: an Ed25519 x is 32 bytes"));
                }
                (Alg::EdDsa, Material::Point(x))
            }
            _ => continue,
        };
        if let Some(named) = field("alg")
            && named != alg.name()
        {
            return Err(format!(
                "key {i} says alg {named:?}, but its type is for {}",
                alg.name()
            ));
        }
        out.push(PublicKey {
            kid: field("kid").map(str::to_owned),
            alg,
            material,
        });
    }
    Ok(out)
}

/// A key set and where to load it again.
pub(super) struct KeyRing {
    pub(super) source: Box<dyn JwksSource>,
    pub(super) keys: RwLock<Arc<Vec<PublicKey>>>,
    /// When a token with an unknown `kid` last made the set load again, for the reload
    /// interval; held across a reload, so that concurrent requests with a new `kid`
    /// load it once.
    pub(super) loaded: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

impl KeyRing {
    pub(super) fn current(&self) -> Arc<Vec<PublicKey>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Loads the set again; on failure the old set stays.
    pub(super) async fn reload(&self) -> Result<usize, String> {
        let bytes = self.source.load().await?;
        let keys = parse_jwks(&bytes)?;
        let n = keys.len();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
        Ok(n)
    }

    /// Verifies `sig` over `message` with the key `kid` names for `alg`, loading the
    /// set again (rate-limited) when it has no such key.
    pub(super) async fn verify(
        &self,
        kid: Option<&str>,
        alg: Alg,
        message: &[u8],
        sig: &[u8],
    ) -> Result<(), JwtError> {
        let pick = |keys: &[PublicKey]| -> Option<bool> {
            let mut fitting = keys.iter().filter(|k| k.alg == alg);
            let key = match kid {
                Some(kid) => fitting.find(|k| k.kid.as_deref() == Some(kid))?,
                None => {
                    let first = fitting.next()?;
                    if fitting.next().is_some() {
                        return None;
                    }
                    first
                }
            };
            Some(key.verify(message, sig))
        };
        let unknown = || JwtError::UnknownKey(kid.map(str::to_owned), alg.name());
        if let Some(ok) = pick(&self.current()) {
            return ok.then_some(()).ok_or(JwtError::Signature);
        }
        let mut loaded = self.loaded.lock().await;
        // Another request may have loaded it while this one waited.
        if let Some(ok) = pick(&self.current()) {
            return ok.then_some(()).ok_or(JwtError::Signature);
        }
        if loaded.is_some_and(|at| at.elapsed() < RELOAD_INTERVAL) {
            return Err(unknown());
        }
        *loaded = Some(tokio::time::Instant::now());
        if let Err(e) = self.reload().await {
            tracing::warn!(source = %self.source.describe(), error = %e, "could not load the JWKS again; keeping the old keys");
        }
        match pick(&self.current()) {
            Some(ok) => ok.then_some(()).ok_or(JwtError::Signature),
            None => Err(unknown()),
        }
    }
}
