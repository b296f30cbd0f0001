//! The tenant sources `tenant_from` names, made for the layer: the bearer-token
//! verifier with its key set loaded (and a JWKS URL refreshed while the gateway runs),
//! the client certificate's principal, the headers.

use std::sync::Arc;
use std::time::Duration;

use super::ServeError;
use crate::config::{GatewayConfig, TenantSource};
use crate::metrics::Metrics;
use crate::route::Route;

/// The sources `tenant_from` names, made: the layer's (`None` for the headers alone,
/// the layer's default), and the routes with a `tenant_from` of their own given
/// theirs. One bearer-token verifier, with its key set loaded, serves them all; its
/// loads of the key set are counted in `metrics`.
pub(super) async fn sources(
    config: &GatewayConfig,
    metrics: &Arc<Metrics>,
) -> Result<(Option<idem_tower::TenantSources>, Vec<Route>), ServeError> {
    let verifier = match &config.jwt {
        Some(jwt) if config.names_source(TenantSource::Jwt) => {
            let observer: Arc<dyn idem_jwt::KeySetObserver> = metrics.clone();
            let verifier = Arc::new(jwt.verifier(Some(observer)).await?);
            if jwt.jwks_url.is_some() {
                spawn_jwks_refresh(Arc::downgrade(&verifier), jwt.jwks_refresh);
            }
            Some(verifier)
        }
        _ => None,
    };
    let made = |list: &[TenantSource]| {
        let mut sources = idem_tower::TenantSources::new();
        for source in list {
            sources = match source {
                TenantSource::Jwt => {
                    sources.credential(verifier.clone().expect("a verifier wherever jwt is named"))
                }
                // The front puts the certificate's principal in the extensions.
                TenantSource::Cert => sources.principal(),
                TenantSource::Headers => sources.headers(),
            };
        }
        sources
    };
    let global = (config.tenant_from != [TenantSource::Headers]).then(|| made(&config.tenant_from));
    let routes = config
        .routes
        .iter()
        .map(|r| match &r.tenant_from {
            Some(list) => r.clone().with_tenant_sources(made(list)),
            None => r.clone(),
        })
        .collect();
    Ok((global, routes))
}

/// Fetches the JWKS URL again every `every`, until the verifier is dropped with the
/// gateway. A fetch that fails keeps the keys held, and says so.
fn spawn_jwks_refresh(verifier: std::sync::Weak<idem_jwt::JwtVerifier>, every: Duration) {
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
