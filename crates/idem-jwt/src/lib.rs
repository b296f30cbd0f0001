//! Bearer JSON Web Tokens verified into an idempotency tenant, for
//! [`idem_tower::TenantSources::credential`] (SPEC S3): the principal a token names
//! stays the same when the token is refreshed, where a digest of the `Authorization`
//! header changes with every new token and would let a retry after a refresh execute
//! again.
//!
//! [`JwtVerifier`] checks a `Bearer` token (RFC 7519, compact JWS of RFC 7515) with
//! the `jsonwebtoken` crate, its signatures on ring, before its claims are believed:
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
//! A token whose `kid` is not in the key set makes the verifier load the set again, so
//! a rotated key is picked up without a restart. One load goes on at a time, and every
//! token that lacks its key waits for that one ([`DEFAULT_KEY_WAIT`] at most); a `kid`
//! still unknown once it has ended is refused at once, and the next such load starts
//! no sooner than [`RELOAD_INTERVAL`] after it ended. A signing key of the set that
//! the verifier does not use (`PS256`, `RS512`, another curve) is skipped with a
//! warning, and the rest of the set used.
//!
//! The token's `iss` and the configured claims' values are then its
//! [`Principal`], whose tenant is an HMAC under the layer's key
//! (`sub` by default; a claim name, or a JSON pointer such as `/org/id`): never the
//! token, and never a claim in clear. A claim names the tenant by its JSON type and
//! value: the number `1` and the string `"1"` are two tenants (see
//! [`JwtVerifierBuilder::claim`]).
//!
//! `jsonwebtoken` verifies with its process-wide crypto provider: the verifier
//! installs ring as that provider unless the process has one already (an
//! application's own, or one its `jsonwebtoken` features name), which then verifies
//! these tokens too.
//!
//! # Examples
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_jwt::{JwksFile, JwtVerifier};
//! use idem_tower::{IdempotencyLayer, TenantSources};
//!
//! # async fn layer(store: idem_core::MemoryStore) -> Result<(), String> {
//! let verifier = JwtVerifier::builder()
//!     .jwks(JwksFile("/etc/idem/jwks.json".into()))
//!     .issuer("https://auth.example.com/")
//!     .audience("payments-api")
//!     .build()
//!     .await?;
//! let _layer = IdempotencyLayer::new(store)
//!     .tenant_sources(TenantSources::new().credential(Arc::new(verifier)).headers());
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderMap;
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use idem_tower::{Credential, CredentialError, Principal, Verified};

mod claims;
mod keyring;
mod keys;
mod provider;

use claims::Claim;
pub use claims::{NUMBER_SUFFIX, check_claim};
use keyring::KeyRing;
pub use keyring::{DEFAULT_KEY_WAIT, KeySetObserver, LoadCause, RELOAD_INTERVAL};
use keys::accepted;
#[cfg(test)]
use keys::parse_jwks;
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
    /// The token names a key the set lacked, and the set did not load again within
    /// the bound on the wait ([`JwtVerifierBuilder::key_wait`]).
    #[error("the signing keys did not load within {0:?}; try again")]
    KeysLate(Duration),
    /// The token names a key the set lacks, and the last load of the set failed (the
    /// JWKS could not be fetched or read): whether the key exists cannot be known until
    /// a load succeeds. The failure's cause is logged, never told the client.
    #[error("the signing keys could not be loaded; try again")]
    KeysUnavailable,
}

impl JwtError {
    /// Whether the token could not be checked for the verifier's own fault (its keys
    /// did not load: [`KeysLate`](JwtError::KeysLate),
    /// [`KeysUnavailable`](JwtError::KeysUnavailable)) rather than because it is bad:
    /// the same token may verify on a retry.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, JwtError::KeysLate(_) | JwtError::KeysUnavailable)
    }

    /// What `jsonwebtoken` refused, as the verifier names it.
    fn refused(e: &Error, alg: &'static str) -> JwtError {
        let claim = |name: &str| match name {
            "exp" => JwtError::Expired,
            "nbf" => JwtError::NotYetValid,
            "iss" => JwtError::Issuer,
            "aud" => JwtError::Audience,
            _ => JwtError::Claim(name.to_owned()),
        };
        match e.kind() {
            ErrorKind::ExpiredSignature => JwtError::Expired,
            ErrorKind::ImmatureSignature => JwtError::NotYetValid,
            ErrorKind::InvalidIssuer => JwtError::Issuer,
            ErrorKind::InvalidAudience => JwtError::Audience,
            ErrorKind::MissingRequiredClaim(name) | ErrorKind::InvalidClaimFormat(name) => {
                claim(name)
            }
            ErrorKind::InvalidAlgorithm | ErrorKind::UnsupportedAlgorithm => {
                JwtError::Algorithm(alg.into())
            }
            ErrorKind::InvalidToken => JwtError::Malformed("not a compact JWS"),
            ErrorKind::Base64(_) => JwtError::Malformed("a segment is not base64url"),
            ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
                JwtError::Malformed("the payload is not base64url JSON")
            }
            _ => JwtError::Signature,
        }
    }

    /// Why a header was refused: an algorithm `jsonwebtoken` does not know (`none`) is
    /// named; anything else is malformed.
    fn header(token: &str, e: &Error) -> JwtError {
        let alg = token
            .split('.')
            .next()
            .and_then(|h| URL_SAFE_NO_PAD.decode(h).ok())
            .and_then(|h| serde_json::from_slice::<Value>(&h).ok())
            .and_then(|h| Some(h.get("alg")?.as_str()?.to_owned()));
        match alg {
            Some(alg)
                if matches!(e.kind(), ErrorKind::Json(_)) && alg.parse::<Algorithm>().is_err() =>
            {
                JwtError::Algorithm(alg)
            }
            _ => JwtError::Malformed("the header is not base64url JSON"),
        }
    }
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

/// Verifies bearer tokens and names their tenant (see the [module](self)).
pub struct JwtVerifier {
    keys: Option<Arc<KeyRing>>,
    hs256: Option<DecodingKey>,
    /// The registered claims' checks; the algorithm is the token's, once its key fits.
    validation: Validation,
    claims: Vec<Claim>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("jwks", &self.keys.as_ref().map(|k| k.source.describe()))
            .field("hs256", &self.hs256.is_some())
            .field("issuer", &self.validation.iss)
            .field("audiences", &self.validation.aud)
            .field("leeway", &self.validation.leeway)
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
    key_wait: Option<Duration>,
    observer: Option<Arc<dyn KeySetObserver>>,
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

    /// The leeway for `exp` and `nbf` (default [`DEFAULT_JWT_LEEWAY`]), in whole
    /// seconds (a fraction counts as one more).
    pub fn leeway(mut self, leeway: Duration) -> Self {
        self.leeway = Some(leeway);
        self
    }

    /// A claim that names the tenant, in order (default `sub` alone): a top-level
    /// claim's name, or a JSON pointer into the claims (`/org/id`).
    ///
    /// Its value must be a non-empty string or a number, and names the tenant with
    /// its JSON type: a string as it is (the [`Principal`]'s name is the claim's), a
    /// number by its value in a canonical form (`1`, `1.0` and `1e0` are one number;
    /// integers exact to 64 bits, others as doubles) under the claim's name with
    /// [`NUMBER_SUFFIX`] added, so the number `1` and the string `"1"` never name one
    /// tenant.
    pub fn claim(mut self, claim: impl Into<String>) -> Self {
        self.claims.push(claim.into());
        self
    }

    /// The longest a request waits for the key set to load when its token names a
    /// key the set lacks (default [`DEFAULT_KEY_WAIT`]); past it the token is refused
    /// ([`JwtError::KeysLate`]), and the load goes on for those that come after.
    pub fn key_wait(mut self, wait: Duration) -> Self {
        self.key_wait = Some(wait);
        self
    }

    /// What the key set's loads and waits are reported to (metrics).
    pub fn observer(mut self, observer: Arc<dyn KeySetObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The verifier, with its key set loaded once. Fails when no key is given, the
    /// secret is short, a claim is empty, or the key set cannot be loaded or parsed.
    pub async fn build(self) -> Result<JwtVerifier, String> {
        if self.jwks.is_none() && self.hs256.is_none() {
            return Err("give a JWKS (public keys) or an HS256 secret".into());
        }
        let hs256 = match &self.hs256 {
            Some(secret) => {
                check_hs256_secret(secret)?;
                Some(DecodingKey::from_secret(secret).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        for claim in &self.claims {
            check_claim(claim)?;
        }
        provider::install();
        let keys = match self.jwks {
            Some(source) => {
                let wait = self.key_wait.unwrap_or(DEFAULT_KEY_WAIT);
                let ring = KeyRing::new(source, wait, self.observer.clone());
                let n = ring
                    .load(LoadCause::Start)
                    .await
                    .map_err(|e| format!("the JWKS at {}: {e}", ring.source.describe()))?;
                if n == 0 {
                    let skipped: Vec<String> =
                        ring.skipped().iter().map(ToString::to_string).collect();
                    let skipped = match skipped.is_empty() {
                        true => String::new(),
                        false => format!(" (it has {})", skipped.join(", ")),
                    };
                    return Err(format!(
                        "the JWKS at {} has no RS256, ES256 or EdDSA signing key{skipped}",
                        ring.source.describe()
                    ));
                }
                Some(Arc::new(ring))
            }
            None => None,
        };
        let claims = if self.claims.is_empty() {
            vec![Claim::new("sub".into())]
        } else {
            self.claims.into_iter().map(Claim::new).collect()
        };
        let leeway = self.leeway.unwrap_or(DEFAULT_JWT_LEEWAY);
        let mut validation = Validation::new(Algorithm::HS256);
        // Bounded, since it is taken from the time now in whole seconds.
        validation.leeway = (leeway.as_secs() + u64::from(leeway.subsec_nanos() > 0)).min(1 << 30);
        validation.validate_nbf = true;
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            validation.required_spec_claims.insert("iss".into());
        }
        // Without audiences, any `aud` will do (jsonwebtoken would refuse them all).
        validation.validate_aud = !self.audiences.is_empty();
        if validation.validate_aud {
            validation.set_audience(&self.audiences);
            validation.required_spec_claims.insert("aud".into());
        }
        Ok(JwtVerifier {
            keys,
            hs256,
            validation,
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
        if token.len() > MAX_TOKEN_LEN {
            return Err(JwtError::Malformed("longer than 16 KiB"));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| JwtError::header(token, &e))?;
        let alg = header.alg;
        let name = accepted(alg).ok_or_else(|| JwtError::Algorithm(format!("{alg:?}")))?;
        if header.crit.is_some() {
            return Err(JwtError::Critical);
        }
        // The key is chosen by the token's algorithm, so an `HS256` token meets the
        // secret alone, never a public key.
        let public;
        let key = match alg {
            Algorithm::HS256 => self.hs256.as_ref(),
            _ => match &self.keys {
                Some(ring) => {
                    public = ring.find(header.kid.as_deref(), alg).await?;
                    Some(&public.key)
                }
                None => None,
            },
        }
        .ok_or_else(|| JwtError::Algorithm(name.into()))?;
        let mut validation = self.validation.clone();
        validation.algorithms = vec![alg];
        let claims = match jsonwebtoken::decode::<Value>(token, key, &validation) {
            Ok(data) => data.claims,
            // A payload jsonwebtoken cannot read as claims (a `sub` that is an object):
            // refused either way, it is read only to say which claim is at fault.
            Err(e) if matches!(e.kind(), ErrorKind::Json(_)) => {
                let claims = jsonwebtoken::dangerous::insecure_decode_claims(token);
                let named = claims.map(|c| self.named(&c));
                return Err(match named {
                    Ok(Err(e)) => e,
                    _ => JwtError::Malformed("the payload is not base64url JSON"),
                });
            }
            Err(e) => return Err(JwtError::refused(&e, name)),
        };
        if !claims.is_object() {
            return Err(JwtError::Malformed("the payload is not base64url JSON"));
        }
        let issuer = claims.get("iss").and_then(Value::as_str).map(str::to_owned);
        // jsonwebtoken takes a list of issuers as naming the issuer too; one must be it.
        if self.validation.iss.is_some() && issuer.is_none() {
            return Err(JwtError::Issuer);
        }
        Ok(Principal::new(issuer, self.named(&claims)?))
    }

    /// The names and values of the claims that name the tenant, in order.
    fn named(&self, claims: &Value) -> Result<Vec<(String, String)>, JwtError> {
        self.claims.iter().map(|c| c.named(claims)).collect()
    }
}

/// A bearer JWT as a tenant source: a keyed request whose token does not verify is
/// answered 401 `invalid-credential`; one whose token cannot be checked because the
/// key set did not load ([`JwtError::is_unavailable`]) 503 `credential-unavailable`
/// with `Retry-After`, since the fault is the service's and the same token may verify
/// on a retry; one without a bearer JWT goes on to the next source.
impl Credential for JwtVerifier {
    fn find<'a>(&self, headers: &'a HeaderMap) -> Option<&'a str> {
        bearer_jwt(headers)
    }

    fn principal<'a>(&'a self, token: &'a str) -> Verified<'a> {
        Box::pin(async move {
            self.verify(token)
                .await
                .map_err(|e| match e.is_unavailable() {
                    true => CredentialError::Unavailable {
                        reason: e.to_string(),
                        retry_after: RELOAD_INTERVAL,
                    },
                    false => CredentialError::Refused(e.to_string()),
                })
        })
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

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
