//! Live reload: the configuration read again on SIGHUP or `POST /reload`, and what it
//! may change put in force for new requests without dropping a connection.
//!
//! What a request is served with is one [`Generation`]: the idempotency layer around
//! a proxy to the upstream, the access log's settings, the path normalisation and the
//! client certificate's tenant name. A reload builds the next one from the file and
//! swaps it in; requests already in progress finish under the one they started with.
//! The next layer [takes over](idem_tower::IdempotencyLayer::take_over_from) from the
//! last: executions in flight, waiting duplicates and the counts under the tenant
//! limits carry on, and a record reserved under earlier fingerprint rules is compared
//! by them. A configuration that does not resolve, or whose token verifier cannot
//! start, is refused: the generation in force stays, and the log says why. Settings
//! that cannot change while serving ([`Reload::Restart`](crate::config::Reload::Restart))
//! keep their running values, and the log names those that differ.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use idem_core::Store;
use idem_tower::IdempotencyLayer;

use super::access::AccessSettings;
use super::{GatewayService, Mode, ServeError};
use crate::config::diff;
use crate::config::{GatewayConfig, ServeArgs, TenantSource};
use crate::metrics::Metrics;
use crate::telemetry::Telemetry;

/// What new requests are served with.
pub(super) struct Generation {
    /// 1 for the configuration the gateway started with, one more for each reload.
    pub(super) number: u64,
    pub(super) service: GatewayService,
    pub(super) access: Arc<AccessSettings>,
    pub(super) paths: crate::path::PathNormalization,
    /// Which name of a verified client certificate names the tenant, with `cert` in
    /// `tenant_from`.
    pub(super) cert_tenant: Option<crate::listener::CertName>,
    /// The dialect of the gateway's own answers outside the layer (an invalid path,
    /// an unreachable upstream for an unkeyed request).
    pub(super) profile: idem_tower::Profile,
    /// The layer, for the next generation to take over from.
    pub(super) layer: Option<IdempotencyLayer<Arc<dyn Store>>>,
    /// The idempotency document, where a path is set for it.
    pub(super) document: Option<Arc<crate::document::Document>>,
    /// The headers the gateway publishes, which browsers may read where CORS lets them.
    pub(super) exposed: Arc<[http::HeaderName]>,
    /// The configuration, and the settings it was resolved from (for the files it
    /// names), to compare the next with.
    config: GatewayConfig,
    args: ServeArgs,
}

/// What a generation is built with besides its configuration.
#[derive(Clone)]
pub(super) struct Parts {
    pub(super) mode: Mode,
    pub(super) store: Arc<dyn Store>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) telemetry: Option<Telemetry>,
    /// Who may call the admin routes: put in force with each generation.
    pub(super) admin_access: Arc<ArcSwap<crate::admin::AdminAccess>>,
}

impl Generation {
    /// The generation `number` of `config` (read from `args`), taking over from
    /// `earlier`'s layer.
    pub(super) async fn build(
        number: u64,
        config: GatewayConfig,
        args: ServeArgs,
        parts: &Parts,
        tenant_key: Option<idem_core::TenantKey>,
        earlier: Option<&IdempotencyLayer<Arc<dyn Store>>>,
    ) -> Result<Generation, ServeError> {
        let (service, layer) = super::service(
            &config,
            parts.mode,
            &parts.store,
            &parts.metrics,
            parts.telemetry.as_ref(),
            tenant_key,
            earlier,
        )
        .await?;
        parts.metrics.set_tenant_metrics(config.tenant_metrics);
        Ok(Generation {
            number,
            service,
            access: Arc::new(AccessSettings {
                log: config.access_log,
                request_id_header: config.request_id_header.clone(),
                routes: config.routes.clone().into(),
                trusted_proxies: config.trusted_proxies.clone(),
                trusted_headers: config.trusted_headers.clone().into(),
            }),
            paths: config.path_normalization,
            cert_tenant: config
                .names_source(TenantSource::Cert)
                .then_some(config.tenant_cert_name),
            profile: config.profile,
            layer,
            // Without the layer no key is kept: a document saying otherwise would lie.
            document: (parts.mode == Mode::Idempotent)
                .then(|| crate::document::Document::of(&config).map(Arc::new))
                .flatten(),
            exposed: config.published_headers().into(),
            config,
            args,
        })
    }
}

impl Generation {
    /// This generation, its configuration read from `args`.
    pub(super) fn with_args(&self, args: ServeArgs) -> Generation {
        Generation {
            number: self.number,
            service: self.service.clone(),
            access: self.access.clone(),
            paths: self.paths,
            cert_tenant: self.cert_tenant,
            profile: self.profile,
            layer: self.layer.clone(),
            document: self.document.clone(),
            exposed: self.exposed.clone(),
            config: self.config.clone(),
            args,
        }
    }
}

/// Why a reload kept the generation in force.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ReloadError {
    /// The gateway was started without a command line to read again (embedded).
    #[error("this gateway was not started from a configuration it can read again")]
    NotReloadable,
    /// The configuration does not resolve.
    #[error("the configuration is not valid: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// It resolves, but what it describes cannot start (a key set that cannot be read).
    #[error("the configuration cannot be put in force: {0}")]
    Start(#[from] ServeError),
}

/// What a reload did: the generation now in force, and the changed settings it could
/// not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reloaded {
    /// The generation in force.
    pub(crate) generation: u64,
    /// The settings that changed and were applied.
    pub(crate) applied: Vec<String>,
    /// The settings that changed and take a restart: their running values stay.
    pub(crate) need_restart: Vec<String>,
}

/// Reads the configuration again and puts it in force; shared by the SIGHUP handler
/// and the admin listener.
pub(crate) struct Reloader {
    live: Arc<ArcSwap<Generation>>,
    parts: Parts,
    /// One reload at a time.
    lock: tokio::sync::Mutex<()>,
    /// Why the last reload was refused, if it was.
    last_error: Mutex<Option<String>>,
    /// The command line and environment the gateway was started with, whose
    /// `--config` file is read again; `None` for a gateway embedded with a
    /// configuration of its own, which cannot be read again.
    cli: Option<ServeArgs>,
    /// The listeners' certificates and keys, read again by every reload.
    tls: Vec<(&'static str, crate::listener::Tls)>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Reloader {
    pub(super) fn new(
        live: Arc<ArcSwap<Generation>>,
        parts: Parts,
        cli: Option<ServeArgs>,
        tls: Vec<(&'static str, crate::listener::Tls)>,
    ) -> Reloader {
        Reloader {
            live,
            parts,
            lock: tokio::sync::Mutex::new(()),
            last_error: Mutex::new(None),
            cli,
            tls,
        }
    }

    /// The generation in force: 1 until a reload succeeds.
    pub(crate) fn generation(&self) -> u64 {
        self.live.load().number
    }

    /// Why the last reload was refused, if the last one was.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the listeners' certificates and keys again (SIGHUP and `POST /reload`
    /// alike, so a rotated private key is in force either way), then the
    /// configuration file (and the files it names), resolves it under the same
    /// command line and environment, and puts what may change in force for new
    /// requests. On any error the generation in force stays.
    pub(crate) async fn reload(&self) -> Result<Reloaded, ReloadError> {
        let _one = self.lock.lock().await;
        super::signals::reload_tls(&self.tls);
        let result = self.reload_locked().await;
        let mut last = self.last_error.lock().unwrap_or_else(|e| e.into_inner());
        match &result {
            Ok(r) => {
                *last = None;
                tracing::info!(
                    generation = r.generation,
                    applied = %r.applied.join(","),
                    "configuration reloaded; new requests use it"
                );
                if !r.need_restart.is_empty() {
                    tracing::warn!(
                        settings = %r.need_restart.join(","),
                        "these settings changed but take a restart; their running values stay"
                    );
                }
            }
            Err(ReloadError::NotReloadable) => {
                tracing::info!(
                    "{}; only TLS certificates are reloaded",
                    ReloadError::NotReloadable
                );
            }
            Err(e) => {
                *last = Some(e.to_string());
                tracing::error!(
                    error = %e,
                    generation = self.live.load().number,
                    "reload refused; the configuration in force stays"
                );
            }
        }
        result
    }

    async fn reload_locked(&self) -> Result<Reloaded, ReloadError> {
        let Some(cli) = &self.cli else {
            return Err(ReloadError::NotReloadable);
        };
        let current = self.live.load_full();
        let (layered, mut config) = GatewayConfig::resolve_layered(cli)?;
        let changes = diff::diff(&current.config, &current.args, &config, &layered);
        config.keep_restart_only(&current.config);
        for warning in config.warnings().await {
            tracing::warn!("reload: {warning}");
        }
        let access = crate::admin::AdminAccess::of(&config);
        let generation = Generation::build(
            current.number + 1,
            config,
            layered,
            &self.parts,
            None,
            current.layer.as_ref(),
        )
        .await?;
        let (need_restart, applied): (Vec<_>, Vec<_>) = changes.into_iter().partition(|c| !c.live);
        let reloaded = Reloaded {
            generation: generation.number,
            applied: applied.into_iter().map(|c| c.setting).collect(),
            need_restart: need_restart.into_iter().map(|c| c.setting).collect(),
        };
        self.live.store(Arc::new(generation));
        // From this moment on, the token of the new configuration, and only it.
        self.parts.admin_access.store(Arc::new(access));
        Ok(reloaded)
    }
}

#[async_trait::async_trait]
impl crate::admin::Reload for Reloader {
    fn generation(&self) -> u64 {
        Reloader::generation(self)
    }

    fn last_error(&self) -> Option<String> {
        Reloader::last_error(self)
    }

    async fn reload(&self) -> Result<serde_json::Value, String> {
        Reloader::reload(self)
            .await
            .map(|r| {
                serde_json::json!({
                    "generation": r.generation,
                    "applied": r.applied,
                    "restart_required": r.need_restart,
                })
            })
            .map_err(|e| e.to_string())
    }
}
