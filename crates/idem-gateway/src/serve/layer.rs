//! The idempotency layer the gateway serves through, made from its settings: the
//! layer around the proxy (or the proxy alone in pass-through mode), with its routes,
//! tenant sources and the tenant secret.

use std::sync::Arc;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use idem_core::{Store, StoreError, TenantKey};
use idem_tower::{IdempotencyBody, IdempotencyLayer};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

use super::{GatewayService, Mode, ServeError, tenants};
use crate::budget;
use crate::config::GatewayConfig;
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyBody};
use crate::route::{self, Route};
use crate::telemetry::Telemetry;

/// The layer configured from the gateway's settings. Tenants are hashed under
/// `tenant_key`, else under the store's own secret, which the layer fetches before it
/// scopes the first keyed request.
pub fn idempotency_layer(
    store: Arc<dyn Store>,
    config: &GatewayConfig,
    tenant_key: Option<TenantKey>,
    metrics: Arc<Metrics>,
) -> IdempotencyLayer<Arc<dyn Store>> {
    layer_over_routes(store, config, config.routes.clone(), tenant_key, metrics)
}

/// [`idempotency_layer`] over `routes` in place of the configuration's (the same
/// rules, with their tenant sources made).
fn layer_over_routes(
    store: Arc<dyn Store>,
    config: &GatewayConfig,
    routes: Vec<Route>,
    tenant_key: Option<TenantKey>,
    metrics: Arc<Metrics>,
) -> IdempotencyLayer<Arc<dyn Store>> {
    let routes: Arc<[Route]> = routes.into();
    let mut layer = IdempotencyLayer::new(store)
        .keyed_methods(config.keyed_methods.clone())
        .require_key(config.require_key)
        .scope_mode(config.scope)
        .profile(config.profile)
        .retention_header(config.retention_header.clone())
        .body_limit(config.body_limit)
        .response_limit(config.response_limit)
        .ttl(config.ttl)
        .tombstone_ttl(config.tombstone_ttl)
        .lease(config.lease)
        .max_wait(config.max_wait)
        .max_waiters(config.max_waiters)
        .grpc_release_codes(config.grpc_release_codes.clone())
        // The inner service is the proxy: a replay's `GET <reference>` goes upstream.
        .render_references(true)
        .tenant_headers(config.tenant_headers.iter().cloned())
        .require_tenant(config.require_tenant)
        .tenant_max_in_flight(config.tenant_max_in_flight)
        .tenant_key_rate(config.tenant_key_rate)
        .unverified_key_rate(config.unverified_key_rate)
        .tenant_headers_verified(config.tenant_headers_asserted())
        .observer(metrics);
    if let Some(statuses) = &config.release_statuses {
        layer = layer.release_statuses(statuses.iter());
    }
    for tenant in &config.tenant_overrides {
        layer = layer
            .tenant_override(tenant.id.clone(), tenant.to_override())
            .expect("checked when the configuration was read");
    }
    if let Some(key) = tenant_key {
        layer = layer.tenant_key(key);
    }
    if let Some(marker) = &config.replay_header {
        layer = layer.replay_header(marker.clone());
    }
    // The client timeout bounds a keyed body's arrival too: it is buffered whole before
    // anything is reserved.
    if let Some(timeout) = config.client_timeout {
        layer = layer.body_timeout(timeout);
    }
    if !routes.is_empty() {
        layer = layer.route_config(move |method, parts| {
            let path = parts.uri.path();
            route::find(&routes, method, path).map(|r| r.config_for(path))
        });
    }
    layer
}

/// The one key the gateway names tenants by: the operator's secret, else the store's
/// own (generated on its first use), read now so that a store holding an unusable one
/// stops the start. A store not reached yet (a deferred PostgreSQL or Redis) leaves
/// it to the layer, which reads it before it scopes the first keyed request; until
/// then keyed requests get the 503 they get while the store is unreachable.
pub(super) async fn tenant_key(
    config: &GatewayConfig,
    store: &dyn Store,
) -> Result<Option<TenantKey>, ServeError> {
    if let Some(key) = &config.tenant_key {
        return Ok(Some(key.clone()));
    }
    match TenantKey::from_store(store).await {
        Ok(key) => Ok(Some(key)),
        Err(StoreError::Unavailable(e)) => {
            tracing::info!(error = %e, "the tenant secret will be read from the store once it is reached");
            Ok(None)
        }
        Err(e) => Err(ServeError::TenantSecret(e)),
    }
}

/// The service behind the front of the proxy: the idempotency layer around the proxy
/// (taking over from `earlier`'s, after a reload), or the proxy alone in pass-through
/// mode; with the layer, the layer too.
pub(super) async fn service(
    config: &GatewayConfig,
    mode: Mode,
    store: &Arc<dyn Store>,
    metrics: &Arc<Metrics>,
    telemetry: Option<&Telemetry>,
    tenant_key: Option<TenantKey>,
    earlier: Option<&IdempotencyLayer<Arc<dyn Store>>>,
) -> Result<(GatewayService, Option<IdempotencyLayer<Arc<dyn Store>>>), ServeError> {
    let proxy = Proxy::speaking(
        config.upstream.clone(),
        config.upstream_protocol,
        config.upstream_tls.as_deref(),
        config.upstream_timeout,
        metrics.clone(),
    );
    Ok(match mode {
        Mode::Idempotent => {
            // With traces on, the layer's store calls and outcomes go through the
            // telemetry, which passes them on to the store and the metrics.
            let layer_store = match telemetry {
                Some(t) => t.store(store.clone()),
                None => store.clone(),
            };
            let (sources, routes) = tenants::sources(config, metrics).await?;
            let mut layer =
                layer_over_routes(layer_store, config, routes, tenant_key, metrics.clone());
            if let Some(sources) = sources {
                layer = layer.tenant_sources(sources);
            }
            if let Some(t) = telemetry {
                layer = layer.observer(t.observer(metrics.clone()));
            }
            if let Some(earlier) = earlier {
                layer = layer.take_over_from(earlier);
            }
            let svc = ServiceExt::<Request<Incoming>>::map_response(
                layer.clone().layer(proxy),
                |res: Response<IdempotencyBody<ProxyBody>>| {
                    // The front charges what the layer holds whole to the connection.
                    let buffered = res.body().is_buffered();
                    let mut res = res.map(|b| b.map_err(Into::into).boxed_unsync());
                    if buffered {
                        res.extensions_mut().insert(budget::Buffered);
                    }
                    res
                },
            );
            (BoxCloneSyncService::new(svc), Some(layer))
        }
        Mode::PassThrough => (BoxCloneSyncService::new(proxy), None),
    })
}
