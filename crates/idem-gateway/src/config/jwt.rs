//! `tenant_from` and the `jwt_*` settings: a keyed request's tenant from its verified
//! bearer token (see [`idem_jwt::JwtVerifier`]), resolved and checked before the
//! gateway starts.

use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, ServeArgs, invalid};
pub(crate) use crate::tenant_source::TenantSource;

/// How bearer tokens are verified, when `tenant_from` names `jwt`.
#[derive(Clone)]
pub struct JwtSettings {
    /// The JWKS file of public keys.
    pub jwks_file: Option<PathBuf>,
    /// The JWKS URL.
    pub jwks_url: Option<String>,
    /// How often the URL is fetched again.
    pub jwks_refresh: Duration,
    /// The longest a request waits for the key set to load.
    pub jwks_wait: Duration,
    /// The file the HS256 secret was read from, for `check-config`.
    pub hs256_secret_file: Option<PathBuf>,
    /// The HS256 secret.
    pub hs256_secret: Option<Vec<u8>>,
    /// The required `iss`.
    pub issuer: Option<String>,
    /// The audiences, one of which `aud` must name.
    pub audiences: Vec<String>,
    /// The claims that name the tenant.
    pub claims: Vec<String>,
    /// Leeway for `exp` and `nbf`.
    pub leeway: Duration,
}

impl std::fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSettings")
            .field("jwks_file", &self.jwks_file)
            .field("jwks_url", &self.jwks_url)
            .field("jwks_wait", &self.jwks_wait)
            .field("hs256_secret_file", &self.hs256_secret_file)
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .field("claims", &self.claims)
            .field("leeway", &self.leeway)
            .finish_non_exhaustive()
    }
}

/// Why the verifier could not be made at start.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct JwtStartError {
    /// The setting at fault (`jwt_jwks_file`, `jwt_jwks_url`).
    pub setting: &'static str,
    /// What went wrong.
    pub message: String,
    /// Whether the setting is wrong as written (exit 2), rather than a key set that
    /// could not be fetched now (exit 1).
    pub as_written: bool,
}

impl JwtSettings {
    /// The verifier these settings describe, its key set loaded now (the URL fetched
    /// with its retries), its loads reported to `observer` (the metrics).
    pub async fn verifier(
        &self,
        observer: Option<std::sync::Arc<dyn idem_jwt::KeySetObserver>>,
    ) -> Result<idem_jwt::JwtVerifier, JwtStartError> {
        let mut b = idem_jwt::JwtVerifier::builder()
            .leeway(self.leeway)
            .key_wait(self.jwks_wait);
        if let Some(observer) = observer {
            b = b.observer(observer);
        }
        let setting = match (&self.jwks_file, &self.jwks_url) {
            (Some(file), _) => {
                b = b.jwks(idem_jwt::JwksFile(file.clone()));
                "jwt_jwks_file"
            }
            (None, Some(url)) => {
                let source =
                    crate::jwks::JwksUrl::new(url, None).map_err(|message| JwtStartError {
                        setting: "jwt_jwks_url",
                        message,
                        as_written: true,
                    })?;
                b = b.jwks(source);
                "jwt_jwks_url"
            }
            (None, None) => "jwt_hs256_secret_file",
        };
        if let Some(secret) = &self.hs256_secret {
            b = b.hs256_secret(secret.clone());
        }
        if let Some(issuer) = &self.issuer {
            b = b.issuer(issuer.clone());
        }
        for a in &self.audiences {
            b = b.audience(a.clone());
        }
        for c in &self.claims {
            b = b.claim(c.clone());
        }
        b.build().await.map_err(|message| JwtStartError {
            setting,
            message,
            as_written: setting != "jwt_jwks_url",
        })
    }
}

/// The `tenant_from` list, checked: any of `jwt`, `cert`, `headers`, in that order.
pub(super) fn parse_tenant_from(list: Option<&[String]>) -> Result<Vec<TenantSource>, ConfigError> {
    let Some(list) = list else {
        return Ok(vec![TenantSource::Headers]);
    };
    let mut sources = Vec::new();
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let source = match item.to_ascii_lowercase().as_str() {
            "jwt" => TenantSource::Jwt,
            "cert" => TenantSource::Cert,
            "headers" => TenantSource::Headers,
            _ => {
                return Err(invalid(
                    "tenant_from",
                    format!(
                        "{item:?} is no tenant source; give jwt, cert or headers, in that order"
                    ),
                ));
            }
        };
        if sources.contains(&source) {
            return Err(invalid("tenant_from", format!("{item} is named twice")));
        }
        sources.push(source);
    }
    if sources.is_empty() {
        return Err(invalid("tenant_from", "names no source"));
    }
    if !sources.is_sorted() {
        return Err(invalid(
            "tenant_from",
            "give the sources in the order jwt, cert, headers: a request is named by the \
             first that applies, and a later one would never be reached",
        ));
    }
    Ok(sources)
}

/// Every tenant source named anywhere, globally or on a route: what must be verifiable.
fn named_sources(a: &ServeArgs) -> Result<Vec<TenantSource>, ConfigError> {
    let mut named = parse_tenant_from(a.tenant_from.as_deref())?;
    for (i, rule) in a.route.iter().enumerate() {
        if let Some(list) = &rule.tenant_from {
            let sources = parse_tenant_from(Some(list)).map_err(|e| invalid(rule.name(i), e))?;
            named.extend(sources);
        }
    }
    named.sort();
    named.dedup();
    Ok(named)
}

/// The first setting given that names a key, if any.
fn key_given(a: &ServeArgs) -> Option<&'static str> {
    [
        ("jwt_jwks_file", a.jwt_jwks_file.is_some()),
        ("jwt_jwks_url", a.jwt_jwks_url.is_some()),
        ("jwt_hs256_secret_file", a.jwt_hs256_secret_file.is_some()),
    ]
    .into_iter()
    .find_map(|(name, given)| given.then_some(name))
}

/// The verification settings when `tenant_from` (globally or on a route) names `jwt`;
/// an error for a key given without it (nothing would be verified), for `jwt` without a
/// key, and for a secret file that cannot be read. The other `jwt_*` settings apply
/// only with `jwt`.
pub(super) fn resolve(a: &ServeArgs) -> Result<Option<JwtSettings>, ConfigError> {
    if !named_sources(a)?.contains(&TenantSource::Jwt) {
        return match key_given(a) {
            Some(name) => Err(invalid(
                name,
                "is set, but tenant_from does not name jwt, so no token is verified; add \
                 tenant_from = \"jwt\" (or \"jwt,headers\")",
            )),
            None => Ok(None),
        };
    }
    if a.jwt_jwks_file.is_some() && a.jwt_jwks_url.is_some() {
        return Err(invalid(
            "jwt_jwks_url",
            "give the JWKS as a file or as a URL, not both",
        ));
    }
    if key_given(a).is_none() {
        return Err(invalid(
            "tenant_from",
            "names jwt, but no key verifies tokens: set jwt_jwks_file, jwt_jwks_url or \
             jwt_hs256_secret_file",
        ));
    }
    let hs256_secret = match &a.jwt_hs256_secret_file {
        Some(path) => {
            let setting = "jwt_hs256_secret_file";
            let secret = super::secrets::read_secret_file(setting, path, "the HS256 secret file")?;
            idem_jwt::check_hs256_secret(&secret)
                .map_err(|e| invalid(setting, format!("{}: {e}", path.display())))?;
            Some(secret)
        }
        None => None,
    };
    let claims: Vec<String> = match &a.jwt_claims {
        Some(list) => list.iter().map(|c| c.trim().to_owned()).collect(),
        None => vec!["sub".to_owned()],
    };
    for claim in &claims {
        idem_jwt::check_claim(claim).map_err(|e| invalid("jwt_claims", e))?;
    }
    if claims.is_empty() {
        return Err(invalid("jwt_claims", "names no claim"));
    }
    Ok(Some(JwtSettings {
        jwks_file: a.jwt_jwks_file.clone(),
        jwks_url: a.jwt_jwks_url.clone(),
        jwks_refresh: a
            .jwt_jwks_refresh
            .unwrap_or(crate::jwks::DEFAULT_JWKS_REFRESH),
        jwks_wait: a.jwt_jwks_wait.unwrap_or(idem_jwt::DEFAULT_KEY_WAIT),
        hs256_secret_file: a.jwt_hs256_secret_file.clone(),
        hs256_secret,
        issuer: a.jwt_issuer.clone(),
        audiences: a
            .jwt_audience
            .as_ref()
            .map(|l| {
                l.iter()
                    .map(|a| a.trim().to_owned())
                    .filter(|a| !a.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
        claims,
        leeway: a.jwt_leeway.unwrap_or(idem_jwt::DEFAULT_JWT_LEEWAY),
    }))
}
