//! The tenant sources `tenant_from` names, made for the layer: the bearer-token
//! verifier with its key set loaded (and a JWKS URL refreshed while the gateway runs),
//! the client certificate's principal, the headers.

use std::sync::Arc;
use std::time::Duration;

use super::ServeError;
use crate::config::{GatewayConfig, TenantSource};

/// The layer's tenant sources, or `None` for the headers alone (the layer's default).
pub(super) async fn sources(
    config: &GatewayConfig,
) -> Result<Option<idem_tower::TenantSources>, ServeError> {
    if config.tenant_from == [TenantSource::Headers] {
        return Ok(None);
    }
    let mut sources = idem_tower::TenantSources::new();
    for source in &config.tenant_from {
        sources = match source {
            TenantSource::Jwt => {
                let jwt = config.jwt.as_ref().expect("jwt settings with jwt");
                let verifier = Arc::new(jwt.verifier().await?);
                if jwt.jwks_url.is_some() {
                    spawn_jwks_refresh(Arc::downgrade(&verifier), jwt.jwks_refresh);
                }
                sources.jwt(verifier)
            }
            // The front puts the certificate's principal in the extensions.
            TenantSource::Cert => sources.principal(),
            TenantSource::Headers => sources.headers(),
        };
    }
    Ok(Some(sources))
}

/// Fetches the JWKS URL again every `every`, until the verifier is dropped with the
/// gateway. A fetch that fails keeps the keys held, and says so.
fn spawn_jwks_refresh(verifier: std::sync::Weak<idem_tower::JwtVerifier>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(verifier) = verifier.upgrade() else {
                return;
            };
            if let Err(e) = verifier.reload().await {
                tracing::warn!(error = %e, "could not fetch the JWKS again; keeping the keys held");
            }
        }
    });
}
