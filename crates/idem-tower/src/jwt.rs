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

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderMap;
use serde_json::Value;

use crate::principal::Principal;

mod keys;

#[cfg(test)]
use keys::parse_jwks;
use keys::{Alg, KeyRing};
pub use keys::{JwksFile, JwksSource};

/// The default leeway for `exp` and `nbf`.
pub const DEFAULT_JWT_LEEWAY: Duration = Duration::from_secs(60);

/// The largest token read, in bytes; a longer `Authorization` is refused unread.
const MAX_TOKEN_LEN: usize = 16 * 1024;

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
