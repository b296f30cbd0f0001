//! A verified JSON Web Token as a request's tenant (SPEC S3): the principal a token
//! names stays the same when the token is refreshed, where a digest of the
//! `Authorization` header changes with every new token and would let a retry after a
//! refresh execute again.
//!
//! [`JwtVerifier`] checks a `Bearer` token (RFC 7519, compact JWS of RFC 7515) before
//! its claims are believed:
//!
//! - **signature**: `RS256`, `ES256` and `EdDSA` (Ed25519) against the keys of a JWKS
//!   document ([`JwksSource`]: a file, or anything that fetches one), `HS256` against
//!   a shared secret. The algorithm must fit the key: a public key never verifies an
//!   `HS256` token, `none` is refused, and a header with `crit` is refused (no
//!   extension is understood). A token names its key by `kid`; without one, the only
//!   key of that algorithm is used.
//! - **time**: `exp` is required and `nbf` honoured, each with a leeway (60 s by
//!   default) for clocks that differ.
//! - **issuer and audience**, when set: `iss` must be the issuer, and `aud` (a string
//!   or a list) must name one of the audiences.
//!
//! A token whose `kid` is not in the key set makes the verifier load the set again
//! (at most once a second), so a rotated key is picked up without a restart.
//!
//! The token's `iss` and the configured claims' values are then its [`Principal`],
//! whose tenant is an HMAC under the layer's key (`sub` by default; a claim
//! name, or a JSON pointer such as `/org/id`): never the token, and never a claim in
//! clear.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderMap;
use ring::signature::{self, UnparsedPublicKey};
use serde_json::Value;

use crate::principal::Principal;

/// The default leeway for `exp` and `nbf`.
pub const DEFAULT_JWT_LEEWAY: Duration = Duration::from_secs(60);

/// The shortest time between two loads of a key set for unknown `kid`s.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The largest token read, in bytes; a longer `Authorization` is refused unread.
const MAX_TOKEN_LEN: usize = 16 * 1024;

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

/// Why a token was not believed. Its text goes into the 401's `detail`: it names what
/// failed, never the token or a key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtError {
    /// Not three base64url segments of JSON.
    #[error("the bearer token is not a well-formed JWT: {0}")]
    Malformed(&'static str),
    /// An algorithm this verifier does not accept (`none` among them).
    #[error("the token's algorithm {0:?} is not accepted")]
    Algorithm(String),
    /// The header has `crit`: an extension that must be understood, and none is.
    #[error("the token's header has crit, and no extension is understood")]
    Critical,
    /// No key of the set fits the token's `kid` and algorithm.
    #[error("no key for the token (kid {0:?}, alg {1})")]
    UnknownKey(Option<String>, &'static str),
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    Signature,
    /// `exp` is missing or past.
    #[error("the token has expired, or has no exp")]
    Expired,
    /// `nbf` is in the future.
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    /// `iss` is not the configured issuer.
    #[error("the token's issuer is not the one expected")]
    Issuer,
    /// `aud` names none of the configured audiences.
    #[error("the token's audience is not this API")]
    Audience,
    /// A claim that names the tenant is missing, or is not a string or a number.
    #[error("the token's claim {0} is missing or not a string or number")]
    Claim(String),
}

/// The algorithms a key may verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alg {
    Hs256,
    Rs256,
    Es256,
    EdDsa,
}

impl Alg {
    fn parse(name: &str) -> Option<Alg> {
        Some(match name {
            "HS256" => Alg::Hs256,
            "RS256" => Alg::Rs256,
            "ES256" => Alg::Es256,
            "EdDSA" => Alg::EdDsa,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
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
struct PublicKey {
    kid: Option<String>,
    alg: Alg,
    /// RSA: `n` and `e`; EC: the uncompressed point; Ed25519: the 32 bytes.
    material: Material,
}

#[derive(Debug)]
enum Material {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    Point(Vec<u8>),
}

impl PublicKey {
    fn verify(&self, message: &[u8], sig: &[u8]) -> bool {
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
fn parse_jwks(bytes: &[u8]) -> Result<Vec<PublicKey>, String> {
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

/// The shortest `HS256` secret accepted, in bytes: as long as the hash.
pub const MIN_HS256_SECRET: usize = 32;

/// Whether `secret` is long enough for `HS256` ([`MIN_HS256_SECRET`]): the check
/// [`JwtVerifierBuilder::build`] makes, for a configuration to make before it builds.
pub fn check_hs256_secret(secret: &[u8]) -> Result<(), String> {
    if secret.len() < MIN_HS256_SECRET {
        return Err(format!(
            "the HS256 secret is {} bytes; it must be at least {MIN_HS256_SECRET}",
            secret.len()
        ));
    }
    Ok(())
}

/// Whether `claim` names a claim (a name, or a JSON pointer other than `/`): the check
/// [`JwtVerifierBuilder::build`] makes, for a configuration to make before it builds.
pub fn check_claim(claim: &str) -> Result<(), String> {
    if claim.is_empty() || claim == "/" {
        return Err(format!("{claim:?} names no claim"));
    }
    Ok(())
}

/// A key set and where to load it again.
struct KeyRing {
    source: Box<dyn JwksSource>,
    keys: RwLock<Arc<Vec<PublicKey>>>,
    /// When a token with an unknown `kid` last made the set load again, for the reload
    /// interval; held across a reload, so that concurrent requests with a new `kid`
    /// load it once.
    loaded: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

impl KeyRing {
    fn current(&self) -> Arc<Vec<PublicKey>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Loads the set again; on failure the old set stays.
    async fn reload(&self) -> Result<usize, String> {
        let bytes = self.source.load().await?;
        let keys = parse_jwks(&bytes)?;
        let n = keys.len();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
        Ok(n)
    }

    /// Verifies `sig` over `message` with the key `kid` names for `alg`, loading the
    /// set again (rate-limited) when it has no such key.
    async fn verify(
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

/// A claim that names the tenant: a top-level name, or a JSON pointer (`/org/id`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim(String);

impl Claim {
    fn find<'a>(&self, claims: &'a Value) -> Option<&'a Value> {
        if self.0.starts_with('/') {
            claims.pointer(&self.0)
        } else {
            claims.get(&self.0)
        }
    }
}

/// Verifies bearer tokens and names their tenant (see the [module](self)).
pub struct JwtVerifier {
    keys: Option<KeyRing>,
    hs256: Option<ring::hmac::Key>,
    issuer: Option<String>,
    audiences: Vec<String>,
    leeway: Duration,
    claims: Vec<Claim>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("jwks", &self.keys.as_ref().map(|k| k.source.describe()))
            .field("hs256", &self.hs256.is_some())
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .field("leeway", &self.leeway)
            .field("claims", &self.claims)
            .finish()
    }
}

/// Builds a [`JwtVerifier`].
#[derive(Default)]
pub struct JwtVerifierBuilder {
    jwks: Option<Box<dyn JwksSource>>,
    hs256: Option<Vec<u8>>,
    issuer: Option<String>,
    audiences: Vec<String>,
    leeway: Option<Duration>,
    claims: Vec<String>,
}

impl JwtVerifierBuilder {
    /// The public keys (`RS256`, `ES256`, `EdDSA`), from a JWKS document.
    pub fn jwks(mut self, source: impl JwksSource) -> Self {
        self.jwks = Some(Box::new(source));
        self
    }

    /// The shared secret of `HS256` tokens (at least [`MIN_HS256_SECRET`] bytes).
    pub fn hs256_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.hs256 = Some(secret.into());
        self
    }

    /// The `iss` every token must carry.
    pub fn issuer(mut self, issuer: impl Into<String>) -> Self {
        self.issuer = Some(issuer.into());
        self
    }

    /// An audience a token's `aud` may name; with several, any one will do.
    pub fn audience(mut self, audience: impl Into<String>) -> Self {
        self.audiences.push(audience.into());
        self
    }

    /// The leeway for `exp` and `nbf` (default [`DEFAULT_JWT_LEEWAY`]).
    pub fn leeway(mut self, leeway: Duration) -> Self {
        self.leeway = Some(leeway);
        self
    }

    /// A claim that names the tenant, in order (default `sub` alone): a top-level
    /// claim's name, or a JSON pointer into the claims (`/org/id`).
    pub fn claim(mut self, claim: impl Into<String>) -> Self {
        self.claims.push(claim.into());
        self
    }

    /// The verifier, with its key set loaded once. Fails when no key is given, the
    /// secret is short, a claim is empty, or the key set cannot be loaded or parsed.
    pub async fn build(self) -> Result<JwtVerifier, String> {
        if self.jwks.is_none() && self.hs256.is_none() {
            return Err("give a JWKS (public keys) or an HS256 secret".into());
        }
        if let Some(secret) = &self.hs256 {
            check_hs256_secret(secret)?;
        }
        for claim in &self.claims {
            check_claim(claim)?;
        }
        let keys = match self.jwks {
            Some(source) => {
                let ring = KeyRing {
                    source,
                    keys: RwLock::new(Arc::new(Vec::new())),
                    loaded: tokio::sync::Mutex::new(None),
                };
                let n = ring
                    .reload()
                    .await
                    .map_err(|e| format!("the JWKS at {}: {e}", ring.source.describe()))?;
                if n == 0 {
                    return Err(format!(
                        "the JWKS at {} has no RS256, ES256 or EdDSA signing key",
                        ring.source.describe()
                    ));
                }
                Some(ring)
            }
            None => None,
        };
        let claims = if self.claims.is_empty() {
            vec![Claim("sub".into())]
        } else {
            self.claims.into_iter().map(Claim).collect()
        };
        Ok(JwtVerifier {
            keys,
            hs256: self
                .hs256
                .map(|s| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &s)),
            issuer: self.issuer,
            audiences: self.audiences,
            leeway: self.leeway.unwrap_or(DEFAULT_JWT_LEEWAY),
            claims,
        })
    }
}

impl JwtVerifier {
    /// A builder.
    pub fn builder() -> JwtVerifierBuilder {
        JwtVerifierBuilder::default()
    }

    /// Loads the key set again (a periodic refresh, say); on failure the old set
    /// stays and the error is returned. Without a key set, does nothing.
    pub async fn reload(&self) -> Result<(), String> {
        match &self.keys {
            Some(ring) => ring.reload().await.map(drop),
            None => Ok(()),
        }
    }

    /// Verifies `token` now.
    pub async fn verify(&self, token: &str) -> Result<Principal, JwtError> {
        self.verify_at(token, SystemTime::now()).await
    }

    /// Verifies `token` as of `now`.
    pub async fn verify_at(&self, token: &str, now: SystemTime) -> Result<Principal, JwtError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(JwtError::Malformed("longer than 16 KiB"));
        }
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed("not three segments"));
        };
        let decode = |seg: &str| URL_SAFE_NO_PAD.decode(seg);
        let header: Value = decode(h)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(Value::is_object)
            .ok_or(JwtError::Malformed("the header is not base64url JSON"))?;
        let sig = decode(s).map_err(|_| JwtError::Malformed("the signature is not base64url"))?;
        let alg_name = header.get("alg").and_then(Value::as_str).unwrap_or("");
        let alg = Alg::parse(alg_name).ok_or_else(|| JwtError::Algorithm(alg_name.into()))?;
        if header.get("crit").is_some() {
            return Err(JwtError::Critical);
        }
        let kid = header.get("kid").and_then(Value::as_str);
        let message = &token.as_bytes()[..h.len() + 1 + p.len()];
        match alg {
            Alg::Hs256 => {
                let key = self
                    .hs256
                    .as_ref()
                    .ok_or_else(|| JwtError::Algorithm(alg_name.into()))?;
                ring::hmac::verify(key, message, &sig).map_err(|_| JwtError::Signature)?;
            }
            _ => {
                let ring = self
                    .keys
                    .as_ref()
                    .ok_or_else(|| JwtError::Algorithm(alg_name.into()))?;
                ring.verify(kid, alg, message, &sig).await?;
            }
        }
        // Only a signed payload is read.
        let claims: Value = decode(p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(Value::is_object)
            .ok_or(JwtError::Malformed("the payload is not base64url JSON"))?;
        self.check(&claims, now)?;
        let mut named = Vec::with_capacity(self.claims.len());
        for claim in &self.claims {
            let value = match claim.find(&claims) {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => return Err(JwtError::Claim(claim.0.clone())),
            };
            named.push((claim.0.clone(), value));
        }
        let issuer = claims.get("iss").and_then(Value::as_str).map(str::to_owned);
        Ok(Principal::new(issuer, named))
    }

    /// The registered claims: times, issuer, audience.
    fn check(&self, claims: &Value, now: SystemTime) -> Result<(), JwtError> {
        let now = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let leeway = self.leeway.as_secs_f64();
        let time = |name: &str| claims.get(name).and_then(Value::as_f64);
        match time("exp") {
            Some(exp) if now <= exp + leeway => {}
            _ => return Err(JwtError::Expired),
        }
        if claims.get("nbf").is_some() {
            match time("nbf") {
                Some(nbf) if nbf <= now + leeway => {}
                _ => return Err(JwtError::NotYetValid),
            }
        }
        if let Some(issuer) = &self.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(issuer.as_str())
        {
            return Err(JwtError::Issuer);
        }
        if !self.audiences.is_empty() {
            let names = |v: &Value| self.audiences.iter().any(|a| v.as_str() == Some(a));
            let ok = match claims.get("aud") {
                Some(Value::Array(list)) => list.iter().any(names),
                Some(one) => names(one),
                None => false,
            };
            if !ok {
                return Err(JwtError::Audience);
            }
        }
        Ok(())
    }
}

/// The compact JWT a request carries as `Authorization: Bearer <token>`: one such
/// field, whose token has the shape of one (three segments). An opaque bearer token
/// or another scheme is `None`, and the next tenant source names the tenant.
pub fn bearer_jwt(headers: &HeaderMap) -> Option<&str> {
    let mut fields = headers.get_all(http::header::AUTHORIZATION).iter();
    let (Some(field), None) = (fields.next(), fields.next()) else {
        return None;
    };
    let text = field.to_str().ok()?;
    let (scheme, token) = text.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && token.bytes().filter(|&b| b == b'.').count() == 2)
        .then_some(token)
}

#[cfg(test)]
mod tests;
