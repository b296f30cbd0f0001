//! `idem serve`: the listeners, the idempotency layer around the proxy, the admin
//! router, the sweeper, and graceful shutdown.
//!
//! Shutdown (SIGTERM or SIGINT) stops accepting, lets open connections finish their
//! current request, then waits for every execution the layer spawned to finish and
//! record (a client that went away does not cancel its upstream call), bounded by
//! `--shutdown-timeout`. Upgraded connections (WebSocket tunnels) are not waited for:
//! they close when the process exits.

mod access;
mod front;
mod layer;
mod reload;
mod signals;
mod tenants;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use idem_core::{Store, StoreError, Sweeper, SweeperConfig};
use idem_tower::{IdempotencyLayer, InFlight};
use tokio::time::Instant;
use tower::BoxError;
use tower::util::BoxCloneSyncService;

use self::front::Front;
pub use self::layer::idempotency_layer;
use self::layer::{service, tenant_key};
pub(crate) use self::reload::Reloader;
use self::reload::{Generation, Parts};
use self::signals::reload_on_sighup;
pub use self::signals::shutdown_signal;
use crate::admin::{self, AdminState};
use crate::budget::AnswerBudget;
use crate::config::{GatewayConfig, ServeArgs};
pub use crate::listener::default_max_connections;
use crate::listener::{
    self, ADMIN_MAX_CONNECTIONS, ConnectionSlot, Connections, Listener, ListenerKind, Tls,
};
use crate::metrics::Metrics;
use crate::store::{self, OpenError, redact};
use crate::telemetry::{Telemetry, TelemetryError};
use arc_swap::ArcSwap;

/// The least time the store is given to close at shutdown, even when waiting for
/// in-flight requests used up the shutdown timeout: enough for a SQLite store to write
/// what is queued and fold its WAL into the file.
const STORE_CLOSE_MIN: Duration = Duration::from_secs(1);

/// The proxy's connection cap where the open-file limit cannot be read.
const UNKNOWN_FD_LIMIT_MAX_CONNECTIONS: usize = 1024;

/// The admin listener's client timeout, or `--client-timeout` when that is shorter:
/// an idle connection holds one of its [`ADMIN_MAX_CONNECTIONS`] places at most this
/// long, so that idle connections cannot lock the orchestrator's probes out for long.
const ADMIN_CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The body of answers the gateway sends to clients.
pub(crate) type ClientBody = UnsyncBoxBody<Bytes, BoxError>;

/// The layer around the proxy, or the proxy alone: its error is a failure to forward,
/// which the layer answers itself, and the front in pass-through mode.
type GatewayService =
    BoxCloneSyncService<Request<Incoming>, Response<ClientBody>, idem_tower::ForwardError>;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] OpenError),
    /// The store holds a tenant secret that cannot be used, or cannot store one.
    #[error("cannot read the tenant secret from the store: {0}")]
    TenantSecret(#[source] StoreError),
    /// The trace exporter could not start.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// A listener's certificate and key cannot be used.
    #[error("the {listener} listener's TLS: {source}")]
    Tls {
        /// `proxy` or `admin`.
        listener: &'static str,
        /// Why (boxed: rustls's errors are large).
        #[source]
        source: Box<crate::listener::TlsError>,
    },
    /// The bearer-token verifier could not be made: its key set could not be read,
    /// fetched or parsed.
    #[error("tenant_from = jwt: {0}")]
    Jwt(#[from] crate::config::JwtStartError),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ServeError {
    /// The exit status for it: 2 for a configuration wrong as written (a store URL
    /// that cannot work, TLS files included), 1 for everything else.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            ServeError::Store(e) => crate::exit::of_open(e),
            ServeError::Jwt(e) if e.as_written => crate::exit::CONFIG,
            _ => crate::exit::RUNTIME,
        }
    }
}

/// Whether requests go through the idempotency layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Idempotency-Key handling on (the point of the gateway).
    Idempotent,
    /// Plain reverse proxy: for measuring the layer's cost, and as an emergency bypass.
    PassThrough,
}

/// A gateway bound to its listeners, ready to run.
pub struct Gateway {
    listener: Listener,
    admin: Option<Listener>,
    /// What new requests are served with; swapped by a reload.
    live: Arc<ArcSwap<Generation>>,
    /// What builds the next generation.
    parts: Parts,
    /// The command line to read again on a reload; `None` until
    /// [`reloadable`](Gateway::reloadable).
    cli: Option<ServeArgs>,
    in_flight: Option<InFlight>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// Who may call the admin routes; swapped by a reload.
    admin_access: Arc<ArcSwap<admin::AdminAccess>>,
    /// `None` where the store expires records by itself (Redis).
    sweep_interval: Option<Duration>,
    shutdown_timeout: Duration,
    telemetry: Option<Telemetry>,
    /// Bytes of buffered answers one HTTP/2 connection may hold, and the largest
    /// answer the layer buffers.
    answer_budget: (usize, usize),
    /// SIGHUP, listened for since the gateway was bound.
    hangup: signals::Hangup,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("listen", &self.listener.local_addr().ok())
            .field(
                "admin",
                &self.admin.as_ref().and_then(|a| a.local_addr().ok()),
            )
            .finish_non_exhaustive()
    }
}

/// The proxy's connection cap: `--max-connections`, else derived from the open-file
/// limit ([`default_max_connections`]). A cap given above the derived one is kept, with
/// a warning: the process may run out of descriptors before it reaches it.
fn proxy_connection_cap(config: &GatewayConfig) -> usize {
    let store = store::descriptors(&config.store, &config.store_options);
    let nofile = listener::fd_limit();
    let derived = nofile.map(|n| default_max_connections(n, store, config.admin.is_some()));
    match (config.max_connections, derived) {
        (Some(given), Some(derived)) if given > derived => {
            tracing::warn!(
                max_connections = given,
                open_file_limit = nofile,
                fits = derived,
                "--max-connections is more than the open-file limit leaves room for; \
                 accepts may fail with too many open files before the cap is reached"
            );
            given
        }
        (Some(given), _) => given,
        (None, Some(derived)) => derived,
        (None, None) => UNKNOWN_FD_LIMIT_MAX_CONNECTIONS,
    }
}

impl Gateway {
    /// Opens the store and binds the listeners. A PostgreSQL or Redis store that cannot
    /// be reached yet does not fail the start: the gateway serves unkeyed traffic and
    /// answers keyed requests 503 until a background task reaches the store.
    pub async fn bind(config: &GatewayConfig, mode: Mode) -> Result<Gateway, ServeError> {
        let store = store::open_or_defer(&config.store, config.store_options.clone()).await?;
        Gateway::bind_with_store(config, mode, store).await
    }

    /// Binds the listeners around an already-open store.
    pub(crate) async fn bind_with_store(
        config: &GatewayConfig,
        mode: Mode,
        store: Arc<dyn Store>,
    ) -> Result<Gateway, ServeError> {
        // Sealed first, so that the layer, the admin listener and the metrics all read
        // and write through it (SPEC S17).
        let store: Arc<dyn Store> = match &config.record_keys {
            Some(keys) => {
                tracing::info!(
                    current = keys.current_id(),
                    keys = keys.ids().count(),
                    "recorded answers are sealed"
                );
                Arc::new(
                    idem_core::Sealed::new(store, keys.clone())
                        .read_unsealed(config.read_unsealed_records),
                )
            }
            None => store,
        };
        let metrics = Arc::new(
            Metrics::new()
                .with_store(store.clone())
                .with_tenant_metrics(config.tenant_metrics),
        );
        let telemetry = match &config.otlp_endpoint {
            Some(url) => Some(Telemetry::start(url, &config.routes, &config.store)?),
            None => None,
        };
        let admin_access = admin::AdminAccess::of(config).shared();
        let parts = Parts {
            mode,
            store: store.clone(),
            metrics: metrics.clone(),
            telemetry: telemetry.clone(),
            admin_access: admin_access.clone(),
        };
        let tenant_key = match mode {
            Mode::Idempotent => tenant_key(config, &*store).await?,
            Mode::PassThrough => None,
        };
        let first = Generation::build(
            1,
            config.clone(),
            ServeArgs::default(),
            &parts,
            tenant_key,
            None,
        )
        .await?;
        let in_flight = first.layer.as_ref().map(IdempotencyLayer::in_flight);
        let (listener, admin) = listeners(config, &metrics)?;
        tracing::info!(
            store = %redact(&config.store),
            namespace = %config.store_options.namespace.clone().unwrap_or_default(),
            upstream = %config.upstream,
            mode = ?mode,
            max_connections = listener.max_connections(),
            "gateway configured"
        );
        // A store that deletes expired records by itself (Redis's native TTLs) needs
        // no sweeper; Redis's purge walks the keyspace, which would cost a busy server
        // far more than it saves.
        let sweep_interval = (!store.expires_natively()).then_some(config.sweep_interval);
        Ok(Gateway {
            listener,
            admin,
            live: Arc::new(ArcSwap::from_pointee(first)),
            parts,
            cli: None,
            in_flight,
            store,
            metrics,
            admin_access,
            sweep_interval,
            shutdown_timeout: config.shutdown_timeout,
            telemetry,
            answer_budget: (config.http2.answer_budget, config.response_limit),
            hangup: signals::Hangup::listen(),
        })
    }

    /// Makes the gateway reload its configuration on SIGHUP and `POST /reload`: `cli`
    /// (the command line and environment it was resolved from) is resolved again over
    /// the `--config` file read anew, and what may change is put in force for new
    /// requests (see [`Reloader`]). `layered` is what the configuration in force was
    /// resolved from ([`GatewayConfig::layered`] of `cli`, as read at start), which the
    /// first reload is compared with. Without it, SIGHUP reloads the TLS certificates
    /// only and `POST /reload` is refused.
    pub(crate) fn reloadable(mut self, cli: ServeArgs, layered: ServeArgs) -> Gateway {
        let first = self.live.load_full();
        self.live.store(Arc::new(first.with_args(layered)));
        self.cli = Some(cli);
        self
    }

    /// The proxy's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The admin listener's bound address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|a| a.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then shuts down gracefully: stops accepting,
    /// lets the open connections and the executions in flight finish until the
    /// shutdown deadline, stops the admin listener and the sweeper, and closes the
    /// store last.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Gateway {
            listener,
            admin,
            live,
            parts,
            cli,
            in_flight,
            store,
            metrics,
            admin_access,
            sweep_interval,
            shutdown_timeout,
            telemetry,
            answer_budget,
            hangup,
        } = self;
        let tls: Vec<(&'static str, Tls)> = [
            ("proxy", listener.tls_config().cloned()),
            (
                "admin",
                admin.as_ref().and_then(|a| a.tls_config().cloned()),
            ),
        ]
        .into_iter()
        .filter_map(|(name, tls)| tls.map(|t| (name, t)))
        .collect();
        let reloader = Arc::new(Reloader::new(live.clone(), parts, cli, tls));
        let reloads = tokio::spawn(reload_on_sighup(hangup, reloader.clone()));
        let sweeper = sweep_interval.map(|every| {
            Sweeper::spawn(
                store.clone(),
                SweeperConfig {
                    every,
                    ..SweeperConfig::default()
                },
            )
        });
        let admin = admin.map(|listener| {
            admin::spawn(
                listener,
                AdminState {
                    store: store.clone(),
                    metrics: metrics.clone(),
                    access: admin_access,
                    reloader: Some(reloader.clone()),
                },
            )
        });
        let front = Front {
            live,
            metrics,
            telemetry: telemetry.clone(),
        };
        // Called once a connection: each has a budget of its own.
        let serve = |peer, slot: &ConnectionSlot| {
            let front = front.clone();
            let slot = slot.clone();
            let budget = AnswerBudget::new(answer_budget.0, answer_budget.1);
            hyper::service::service_fn(move |req| front.call(peer, &slot, &budget, req))
        };
        let connections = listener.run(serve, shutdown).await;

        tracing::info!("shutting down: no new connections; finishing in-flight requests");
        let deadline = Instant::now() + shutdown_timeout;
        finish(connections, in_flight, deadline).await;
        if let Some(admin) = admin {
            admin.stop().await;
        }
        if let Some(sweeper) = sweeper {
            sweeper.stop();
        }
        reloads.abort();
        close(&*store, deadline).await;
        // After the store: the spans of the last executions' writes go out too.
        if let Some(telemetry) = telemetry {
            telemetry.shutdown().await;
        }
        tracing::info!("stopped");
    }
}

/// The proxy's listener and the admin one, if any, bound with their caps and client
/// timeouts.
fn listeners(
    config: &GatewayConfig,
    metrics: &Arc<Metrics>,
) -> Result<(Listener, Option<Listener>), ServeError> {
    let bind = |addr| listener::bind(addr).map_err(|source| ServeError::Bind { addr, source });
    let tls = |files: &Option<listener::TlsFiles>, listener| {
        files
            .clone()
            .map(Tls::load)
            .transpose()
            .map_err(|source| ServeError::Tls {
                listener,
                source: Box::new(source),
            })
    };
    let proxy_tls = tls(&config.tls, "proxy")?;
    let admin_tls = tls(&config.admin_tls, "admin")?;
    let proxy = bind(config.listen)?;
    let admin = match config.admin {
        Some(addr) => {
            match (&config.admin_token, config.admin_open) {
                (Some(_), _) => {}
                (None, true) => tracing::warn!(
                    %addr,
                    "--admin-open: the admin listener has no token, and serves /keys (every \
                     tenant's records and answers, and their deletion) and /reload to anyone \
                     who can reach it; set --admin-token-file instead"
                ),
                (None, false) => tracing::info!(
                    %addr,
                    "the admin listener has no --admin-token: it serves /healthz, /readyz and \
                     /metrics, and refuses /keys and /reload (403 admin-route-closed)"
                ),
            }
            if !addr.ip().is_loopback() && config.admin_token.is_none() {
                tracing::warn!(%addr, "the admin listener is not on loopback and has no --admin-token");
            }
            Some(bind(addr)?)
        }
        None => None,
    };
    let proxy = Listener::new(
        proxy,
        ListenerKind::Proxy,
        proxy_connection_cap(config),
        config.client_timeout,
        metrics.clone(),
    )
    .http2_limits(&config.http2)
    .tls(proxy_tls);
    // An admin listener always has a short client timeout: nothing it serves needs a
    // connection that idles longer, and `/readyz` must not wait behind idle ones.
    let admin_timeout = config
        .client_timeout
        .map_or(ADMIN_CLIENT_TIMEOUT, |t| t.min(ADMIN_CLIENT_TIMEOUT));
    let admin = admin.map(|tcp| {
        Listener::new(
            tcp,
            ListenerKind::Admin,
            ADMIN_MAX_CONNECTIONS,
            Some(admin_timeout),
            metrics.clone(),
        )
        .http2_limits(&config.http2)
        .tls(admin_tls.clone())
        .reclaim_idle()
    });
    Ok((proxy, admin))
}

/// Lets the open connections finish their requests, then the executions the layer
/// spawned finish and record, until `deadline`.
async fn finish(connections: Connections, in_flight: Option<InFlight>, deadline: Instant) {
    if !connections.finish(deadline).await {
        tracing::warn!("some connections were still open at the shutdown deadline");
    }
    if let Some(in_flight) = in_flight
        && tokio::time::timeout_at(deadline, in_flight.wait())
            .await
            .is_err()
    {
        tracing::warn!(
            left = in_flight.count(),
            "executions still running at the shutdown deadline; their keys stay in progress until their leases lapse"
        );
    }
}

/// Closes the store: a SQLite store writes what is queued and folds its WAL into the
/// file. Bounded too, so that a store that cannot finish (a SQLite lock another process
/// holds, a server that stopped answering) does not keep the process alive past its
/// deadline. What it committed is safe; SQLite replays a WAL left behind.
async fn close(store: &dyn Store, deadline: Instant) {
    let closing = deadline.max(Instant::now() + STORE_CLOSE_MIN);
    if tokio::time::timeout_at(closing, store.close())
        .await
        .is_err()
    {
        tracing::warn!("the store had not closed by the shutdown deadline; stopping without it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::ServeArgs;

    async fn bound(store_url: &str) -> Gateway {
        let args = ServeArgs {
            upstream: Some("http://127.0.0.1:9".to_owned()),
            listen: Some("127.0.0.1:0".to_owned()),
            store: Some(store_url.to_owned()),
            ..ServeArgs::default()
        };
        let config = GatewayConfig::from_args(args).expect("config");
        let store = store::open_or_defer(store_url, store::StoreOptions::default())
            .await
            .expect("store");
        Gateway::bind_with_store(&config, Mode::Idempotent, store)
            .await
            .expect("bind")
    }

    /// A memory store whose close never finishes.
    struct NeverCloses {
        inner: idem_core::MemoryStore,
        close_started: Arc<std::sync::atomic::AtomicBool>,
    }

    #[async_trait::async_trait]
    impl idem_core::Forward for NeverCloses {
        type Target = idem_core::MemoryStore;

        fn target(&self) -> idem_core::Result<&idem_core::MemoryStore> {
            Ok(&self.inner)
        }

        async fn forward_close(&self) {
            self.close_started
                .store(true, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
    }

    /// A store that never finishes closing does not keep the gateway from stopping:
    /// `run` returns once the store's least closing time is over.
    #[tokio::test]
    async fn a_store_that_never_closes_does_not_hold_up_shutdown() {
        let args = ServeArgs {
            upstream: Some("http://127.0.0.1:9".to_owned()),
            listen: Some("127.0.0.1:0".to_owned()),
            shutdown_timeout: Some(Duration::from_millis(100)),
            ..ServeArgs::default()
        };
        let config = GatewayConfig::from_args(args).expect("config");
        let close_started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let store = NeverCloses {
            inner: idem_core::MemoryStore::new(),
            close_started: close_started.clone(),
        };
        let gateway = Gateway::bind_with_store(&config, Mode::Idempotent, Arc::new(store))
            .await
            .expect("bind");
        // Far above the shutdown timeout plus STORE_CLOSE_MIN: without the bound, run
        // would never return.
        tokio::time::timeout(Duration::from_secs(30), gateway.run(std::future::ready(())))
            .await
            .expect("the gateway stops although its store never closes");
        assert!(close_started.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn no_sweeper_walks_a_redis_keyspace() {
        assert_eq!(bound("redis://127.0.0.1:6379").await.sweep_interval, None);
        let dir = tempfile::tempdir().unwrap();
        let sqlite = format!("sqlite://{}/idem.db", dir.path().display());
        assert_eq!(
            bound(&sqlite).await.sweep_interval,
            Some(Duration::from_secs(60))
        );
        assert!(bound("memory://").await.sweep_interval.is_some());
    }
}
