//! The settings of `idem serve`, resolved: the command line, then the `IDEM_*`
//! environment (both read by clap), then the `--config` TOML file (read by serde), then
//! the defaults, checked together into one [`GatewayConfig`] before anything starts.
//!
//! [`ServeArgs`] declares every setting once, for all three sources; the file takes
//! them under the same names (with `_` for `-`) and adds per-route rules (the
//! repository's `contrib/idem.toml` shows every setting at its default):
//!
//! ```toml
//! upstream = "http://127.0.0.1:3000"
//! store = "sqlite://idem.db"
//! ttl = "24h"
//!
//! [[route]]
//! method = "POST"
//! path = "/v1/orders/{id}/capture"
//! require_key = true
//! ttl = "1h"
//! ignore = ["/client_sent_at"]
//! store_headers = ["x-order-id"]
//! ```
//!
//! A new setting is declared once, as a field of [`ServeArgs`]: its flag, variable,
//! TOML key, type and help text together. How it layers ([`ServeArgs::over`]) follows
//! from its type; the compiler then asks for the one line that resolves it
//! ([`GatewayConfig::from_args`] takes `ServeArgs` apart in full), into a field of
//! [`GatewayConfig`], and tests ask for its line in `check-config` and the guide.

mod args;
mod choices;
pub(crate) mod diff;
mod error;
mod file;
mod jwt;
mod listeners;
mod print;
mod routes;
mod rules;
mod secrets;
mod tenants;
#[cfg(test)]
mod tests;
mod toml_form;
mod upstream;
mod values;

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::{DEFAULT_BODY_LIMIT, DEFAULT_LEASE, DEFAULT_TTL, RecordKeys, ScopeMode, TenantKey};
use idem_tower::{DEFAULT_RESPONSE_LIMIT, GrpcReleaseCodes, ReleaseStatuses};

pub use self::args::ServeArgs;
pub use self::error::ConfigError;
pub(crate) use self::jwt::{JwtSettings, JwtStartError, TenantSource};
pub use self::rules::{RouteRule, TenantRule};
pub use self::secrets::{TENANT_SECRET_ENV, TenantSecret};
pub(crate) use self::secrets::{record_keys, tenant_key};
pub(crate) use self::tenants::TenantLimits;
pub(crate) use self::upstream::Upstream;
pub use self::upstream::UpstreamProtocol;
pub(crate) use self::values::parse_admin_addr;
pub(crate) use self::values::parse_tenant_headers;

use self::error::invalid;
use self::file::read_file;
use self::listeners::{http2_limits, tls_files};
use self::routes::compile_route;
use self::secrets::admin_token;
use self::values::{
    parse_grpc_release_codes, parse_listen_addr, parse_methods, parse_release_statuses,
    parse_request_id_header,
};
use crate::listener::{Http2Limits, TlsFiles};
use crate::path::PathNormalization;
use crate::route::{Route, RouteMatching};
use crate::store::{Namespace, StoreOptions};

/// The default listen address.
pub(crate) const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The default store: an SQLite file in the working directory.
pub(crate) const DEFAULT_STORE: &str = "sqlite://idem.db";
/// The default upstream timeout.
pub(crate) const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// The default time between sweeps of expired records.
pub(crate) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// How long a client connection may take to send a request's headers unless configured
/// otherwise (hyper's own default).
pub(crate) const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The tenant headers unless configured otherwise.
const DEFAULT_TENANT_HEADER: &str = "authorization";

/// The keyed methods unless configured otherwise.
const DEFAULT_KEYED_METHODS: [&str; 2] = ["POST", "PATCH"];

/// Everything `idem serve` runs with.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The upstream API.
    pub upstream: Upstream,
    /// The proxy's listen address.
    pub listen: SocketAddr,
    /// The store URL.
    pub store: String,
    /// Store settings (pool size, namespace).
    pub store_options: StoreOptions,
    /// The admin listener, if any.
    pub admin: Option<SocketAddr>,
    /// The admin bearer token, if any.
    pub admin_token: Option<String>,
    /// Whether keyed methods need a key.
    pub require_key: bool,
    /// Record lifetime.
    pub ttl: Duration,
    /// How long a tombstone outlives a completed record (SPEC S16); zero for none.
    pub tombstone_ttl: Duration,
    /// Attempt lease.
    pub lease: Duration,
    /// The longest a duplicate waits for an in-progress attempt (SPEC S15).
    pub max_wait: Duration,
    /// The most duplicates that wait at once.
    pub max_waiters: usize,
    /// Upstream timeout.
    pub upstream_timeout: Duration,
    /// The HTTP spoken to the upstream.
    pub upstream_protocol: UpstreamProtocol,
    /// For an `https://` upstream, the TLS client settings (the roots its certificate
    /// must chain to: `--upstream-ca`'s, else the system's); `None` for `http://`.
    pub upstream_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Keyed body limit in bytes.
    pub body_limit: usize,
    /// Largest keyed answer recorded, in bytes.
    pub response_limit: usize,
    /// The headers naming the tenant together, in order.
    pub tenant_headers: Vec<HeaderName>,
    /// Whether a keyed request without any of them is refused (401).
    pub require_tenant: bool,
    /// Where a keyed request's tenant comes from, in order.
    pub tenant_from: Vec<TenantSource>,
    /// How bearer tokens are verified, when `tenant_from` names `jwt`.
    pub jwt: Option<JwtSettings>,
    /// The most keyed requests of one tenant in progress at once; `0` for no cap.
    pub tenant_max_in_flight: usize,
    /// The most new keys per tenant, if limited.
    pub tenant_key_rate: Option<idem_core::KeyRate>,
    /// Tenants whose limits are their own.
    pub tenant_overrides: Vec<TenantLimits>,
    /// How many of the busiest tenants the metrics count.
    pub tenant_metrics: usize,
    /// Which name of a verified client certificate names the tenant (with `cert` in
    /// `tenant_from`).
    pub tenant_cert_name: crate::listener::CertName,
    /// The key tenants are hashed under, from the operator's secret; `None` for the
    /// store's own.
    pub tenant_key: Option<TenantKey>,
    /// The keys recorded answers are sealed with (SPEC S17); `None` stores them plain.
    pub record_keys: Option<RecordKeys>,
    /// Whether a sealing gateway replays answers the store holds unsealed (a migration
    /// setting) rather than refusing them.
    pub read_unsealed_records: bool,
    /// The scope mode.
    pub scope: ScopeMode,
    /// The dialect of the gateway's own answers; a route may name its own.
    pub profile: idem_tower::Profile,
    /// The keyed methods.
    pub keyed_methods: Vec<Method>,
    /// Upstream statuses that release the key rather than being recorded.
    pub release_statuses: ReleaseStatuses,
    /// gRPC statuses that release a gRPC call's key rather than being recorded (SPEC S18).
    pub grpc_release_codes: GrpcReleaseCodes,
    /// How request paths are normalised before any rule sees them (SPEC S14).
    pub path_normalization: PathNormalization,
    /// How `[[route]]` templates match normalised paths.
    pub route_matching: RouteMatching,
    /// How long a client connection may take to send a request's headers (idle time
    /// before them included), and may leave the gateway's writes to it without
    /// progress; `None` for no limit.
    pub client_timeout: Option<Duration>,
    /// The most client connections the proxy holds open; `None` derives it from the
    /// open-file limit when the gateway binds
    /// ([`default_max_connections`](crate::listener::default_max_connections)).
    pub max_connections: Option<usize>,
    /// Time between sweeps.
    pub sweep_interval: Duration,
    /// Longest graceful-shutdown wait.
    pub shutdown_timeout: Duration,
    /// Where traces are posted (`…/v1/traces`); `None` when tracing is off.
    pub otlp_endpoint: Option<String>,
    /// Whether, and how often, a line per request is logged.
    pub access_log: crate::access::AccessLog,
    /// The header that carries the request id.
    pub request_id_header: http::HeaderName,
    /// The proxies whose `X-Forwarded-For` names the client (`--trusted-proxies`).
    pub trusted_proxies: crate::trusted::TrustedProxies,
    /// Headers only the trusted proxies may set; removed from other peers' requests.
    pub trusted_headers: Vec<HeaderName>,
    /// The limits on HTTP/2 client connections.
    pub http2: Http2Limits,
    /// The proxy listener's certificate and key, when it terminates TLS.
    pub tls: Option<TlsFiles>,
    /// The admin listener's, when it terminates TLS.
    pub admin_tls: Option<TlsFiles>,
    /// Per-route rules.
    pub routes: Vec<Route>,
}

impl GatewayConfig {
    /// Whether `source` names a tenant anywhere: in `tenant_from`, or a route's.
    pub(crate) fn names_source(&self, source: TenantSource) -> bool {
        self.tenant_from.contains(&source)
            || self
                .routes
                .iter()
                .any(|r| r.tenant_from.as_ref().is_some_and(|l| l.contains(&source)))
    }

    /// Settings that work as written but probably do not do what was meant, each as a
    /// sentence; `serve` logs them as warnings at start, `check-config` prints them.
    /// The upstream's host is looked up (a name that does not resolve is one).
    pub(crate) async fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let lease = humantime::format_duration(self.lease);
        if self.ttl < self.lease {
            warnings.push(format!(
                "ttl {} is shorter than the lease {lease}: a record can expire while its \
                 attempt still runs, and a retry then executes again",
                humantime::format_duration(self.ttl)
            ));
        }
        if self.max_wait > self.lease {
            warnings.push(format!(
                "max_wait {} is longer than the lease {lease}: no duplicate waits longer \
                 than the lease, so the excess is never used",
                humantime::format_duration(self.max_wait)
            ));
        }
        let authority = &self.upstream.authority;
        let port = authority
            .port_u16()
            .unwrap_or(if self.upstream.is_tls() { 443 } else { 80 });
        let lookup = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::net::lookup_host((authority.host().trim_matches(['[', ']']), port)),
        )
        .await;
        match lookup.map(|found| found.map(|mut addrs| addrs.next().is_some())) {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => warnings.push(format!(
                "the upstream host {} resolves to no address",
                authority.host()
            )),
            Ok(Err(e)) => warnings.push(format!(
                "the upstream host {} does not resolve ({e}); requests will get 502 until it does",
                authority.host()
            )),
            Err(_) => warnings.push(format!(
                "looking up the upstream host {} took over 2 s",
                authority.host()
            )),
        }
        warnings
    }

    /// Resolves the command line (and environment) over the `--config` file it names.
    pub fn resolve(args: &ServeArgs) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::from_args(GatewayConfig::layered(args)?)
    }

    /// The command line (and environment) over the `--config` file it names, before
    /// the defaults: what [`resolve`](Self::resolve) checks and completes.
    pub(crate) fn layered(args: &ServeArgs) -> Result<ServeArgs, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => ServeArgs::default(),
        };
        Ok(args.clone().over(file))
    }

    /// [`layered`](Self::layered) and [`resolve`](Self::resolve) from one read of the
    /// file: the settings as layered, for what names files (`check-config`'s output, a
    /// reload's comparison), and the configuration they resolve to.
    pub(crate) fn resolve_layered(
        args: &ServeArgs,
    ) -> Result<(ServeArgs, GatewayConfig), ConfigError> {
        let layered = GatewayConfig::layered(args)?;
        let config = GatewayConfig::from_args(layered.clone())?;
        Ok((layered, config))
    }

    /// Resolves the command line (and environment) over a file already read.
    pub fn merge(args: &ServeArgs, file: ServeArgs) -> Result<GatewayConfig, ConfigError> {
        GatewayConfig::from_args(args.clone().over(file))
    }

    /// Checks layered settings and fills in the defaults of those left out.
    pub fn from_args(args: ServeArgs) -> Result<GatewayConfig, ConfigError> {
        // Destructured in full, so that a new setting cannot be left unresolved.
        let ServeArgs {
            // Read before the layering, to find the file.
            config: _,
            upstream,
            listen,
            store,
            store_pool,
            store_namespace,
            no_migrate,
            admin,
            admin_token: token,
            admin_token_file,
            require_key,
            ttl,
            tombstone_ttl,
            lease,
            max_wait,
            max_waiters,
            upstream_timeout,
            upstream_protocol,
            upstream_ca,
            body_limit,
            response_limit,
            tenant_header,
            require_tenant,
            tenant_secret_file,
            tenant_from,
            tenant_max_in_flight,
            tenant_key_rate,
            tenant_metrics,
            jwt_jwks_file,
            jwt_jwks_url,
            jwt_jwks_refresh,
            jwt_hs256_secret_file,
            jwt_issuer,
            jwt_audience,
            jwt_claims,
            jwt_leeway,
            tenant_secret,
            record_key_file,
            read_unsealed_records,
            scope,
            profile,
            keyed_methods,
            release_statuses,
            grpc_release_codes,
            path_normalization,
            route_matching,
            client_timeout,
            max_connections,
            sweep_interval,
            // A mode rather than a setting of the gateway: see `serve::Mode`.
            passthrough: _,
            shutdown_timeout,
            otlp_endpoint,
            access_log,
            request_id_header,
            trusted_proxies,
            trusted_headers,
            http2_max_concurrent_streams,
            http2_max_header_list_size,
            http2_keepalive_interval,
            http2_keepalive_timeout,
            http2_answer_budget,
            tls_cert,
            tls_key,
            tls_client_ca,
            tenant_cert_name,
            admin_tls_cert,
            admin_tls_key,
            route,
            tenant,
        } = args;
        let upstream = upstream.ok_or_else(|| {
            invalid(
                "upstream",
                "required: give --upstream URL, IDEM_UPSTREAM or `upstream` in --config",
            )
        })?;
        let listen = listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen = parse_listen_addr(listen)?;
        let tenant_headers = match &tenant_header {
            Some(list) => parse_tenant_headers(list)?,
            None => parse_tenant_headers(&[DEFAULT_TENANT_HEADER.to_owned()])?,
        };
        let tenant_from = jwt::parse_tenant_from(tenant_from.as_deref())?;
        let keyed_methods = match &keyed_methods {
            Some(list) => parse_methods(list, "keyed_methods")?,
            None => parse_methods(&DEFAULT_KEYED_METHODS.map(String::from), "keyed_methods")?,
        };
        // An empty list (an `IDEM_KEYED_METHODS` set to nothing, say) would turn keys off
        // without a word.
        if keyed_methods.is_empty() {
            return Err(invalid(
                "keyed_methods",
                "names no method; --passthrough is how to turn keys off",
            ));
        }
        let path_normalization = match &path_normalization {
            Some(list) => PathNormalization::from_items(list),
            None => Ok(PathNormalization::default()),
        }
        .map_err(|e| invalid("path_normalization", e))?;
        let route_matching = match &route_matching {
            Some(list) => RouteMatching::from_items(list),
            None => Ok(RouteMatching::default()),
        }
        .map_err(|e| invalid("route_matching", e))?;
        let routes = route
            .into_iter()
            .enumerate()
            .map(|(i, rule)| compile_route(i, rule, path_normalization, route_matching))
            .collect::<Result<Vec<_>, _>>()?;
        // Every source named anywhere: what must be verifiable.
        let mut named = tenant_from.clone();
        for r in &routes {
            named.extend(r.tenant_from.iter().flatten().copied());
        }
        named.sort();
        named.dedup();
        if named.contains(&TenantSource::Cert) && tls_client_ca.is_none() {
            return Err(invalid(
                "tenant_from",
                "names cert (globally or on a route), but tls_client_ca is not set, so no \
                 client certificate is asked for",
            ));
        }
        let upstream_timeout = upstream_timeout.unwrap_or(DEFAULT_UPSTREAM_TIMEOUT);
        let upstream = Upstream::parse(&upstream)?;
        let upstream_tls = match (upstream.is_tls(), upstream_ca) {
            (true, ca) => Some(std::sync::Arc::new(
                crate::tls_client::tls_client_config(ca.as_deref())
                    .map_err(|e| invalid("upstream_ca", e))?,
            )),
            // A CA for an upstream that no TLS reaches is a mistake worth saying.
            (false, Some(_)) => {
                return Err(invalid(
                    "upstream_ca",
                    "given for an http:// upstream, which is reached without TLS",
                ));
            }
            (false, None) => None,
        };
        let config = GatewayConfig {
            upstream,
            listen,
            store: store.unwrap_or_else(|| DEFAULT_STORE.to_owned()),
            store_options: StoreOptions {
                pool: store_pool,
                namespace: store_namespace
                    .as_deref()
                    .map(|name| Namespace::new(name).map_err(|e| invalid("store_namespace", e)))
                    .transpose()?,
                schema: if no_migrate {
                    idem_core::Schema::Existing
                } else {
                    idem_core::Schema::Migrate
                },
            },
            admin: admin.as_deref().map(parse_admin_addr).transpose()?,
            admin_token: admin_token(token, admin_token_file)?,
            require_key,
            ttl: ttl.unwrap_or(DEFAULT_TTL),
            tombstone_ttl: tombstone_ttl.unwrap_or(Duration::ZERO),
            lease: lease.unwrap_or(DEFAULT_LEASE),
            max_wait: max_wait.unwrap_or(idem_tower::DEFAULT_MAX_WAIT),
            max_waiters: max_waiters.unwrap_or(idem_tower::DEFAULT_MAX_WAITERS),
            upstream_timeout,
            upstream_protocol: upstream_protocol.unwrap_or_default(),
            upstream_tls,
            body_limit: body_limit.unwrap_or(DEFAULT_BODY_LIMIT),
            response_limit: response_limit.unwrap_or(DEFAULT_RESPONSE_LIMIT),
            tenant_headers,
            require_tenant,
            tenant_key: tenant_key(tenant_secret.as_ref(), tenant_secret_file.as_deref(), None)?,
            jwt: jwt::resolve(
                &named,
                jwt::JwtArgs {
                    jwks_file: jwt_jwks_file.as_ref(),
                    jwks_url: jwt_jwks_url.as_ref(),
                    jwks_refresh: jwt_jwks_refresh,
                    hs256_secret_file: jwt_hs256_secret_file.as_ref(),
                    issuer: jwt_issuer.as_ref(),
                    audience: jwt_audience.as_ref(),
                    claims: jwt_claims.as_ref(),
                    leeway: jwt_leeway,
                },
            )?,
            tenant_from,
            tenant_max_in_flight: usize::try_from(tenant_max_in_flight.unwrap_or(0))
                .unwrap_or(usize::MAX),
            tenant_key_rate: tenant_key_rate
                .as_deref()
                .map(|r| r.parse().map_err(|e| invalid("tenant_key_rate", e)))
                .transpose()?,
            tenant_overrides: tenant
                .into_iter()
                .map(TenantLimits::from_rule)
                .collect::<Result<_, _>>()?,
            tenant_metrics: usize::try_from(
                tenant_metrics.unwrap_or(crate::metrics::DEFAULT_TENANT_METRICS as u64),
            )
            .unwrap_or(usize::MAX),
            record_keys: record_keys(record_key_file.as_deref())?,
            read_unsealed_records,
            profile: profile.unwrap_or_default(),
            scope: scope.unwrap_or_default(),
            keyed_methods,
            release_statuses: match &release_statuses {
                Some(list) => parse_release_statuses(list)?,
                None => ReleaseStatuses::default(),
            },
            grpc_release_codes: match &grpc_release_codes {
                Some(list) => parse_grpc_release_codes(list, "grpc_release_codes")?,
                None => GrpcReleaseCodes::default(),
            },
            path_normalization,
            route_matching,
            client_timeout: Some(client_timeout.unwrap_or(DEFAULT_CLIENT_TIMEOUT))
                .filter(|t| !t.is_zero()),
            max_connections: match max_connections {
                Some(0) => return Err(invalid("max_connections", "must be at least 1")),
                n => n.map(|n| n as usize),
            },
            sweep_interval: sweep_interval.unwrap_or(DEFAULT_SWEEP_INTERVAL),
            shutdown_timeout: shutdown_timeout.unwrap_or(upstream_timeout + Duration::from_secs(5)),
            access_log: access_log
                .as_deref()
                .map(crate::access::AccessLog::parse)
                .transpose()
                .map_err(|e| invalid("access_log", e))?
                .unwrap_or(crate::access::AccessLog::Sampled(1.0)),
            request_id_header: parse_request_id_header(request_id_header.as_deref())?,
            trusted_proxies: crate::trusted::TrustedProxies::parse(
                trusted_proxies.as_deref().unwrap_or_default(),
            )
            .map_err(|e| invalid("trusted_proxies", e))?,
            trusted_headers: crate::trusted::parse_trusted_headers(
                trusted_headers.as_deref().unwrap_or_default(),
                trusted_proxies.as_deref().unwrap_or_default(),
            )
            .map_err(|e| invalid("trusted_headers", e))?,
            otlp_endpoint: crate::telemetry::traces_url(
                otlp_endpoint.as_deref(),
                std::env::var(crate::telemetry::OTEL_ENDPOINT_ENV)
                    .ok()
                    .as_deref(),
            )
            .map_err(|e| invalid("otlp_endpoint", e))?,
            http2: http2_limits(
                http2_max_concurrent_streams,
                http2_max_header_list_size,
                http2_keepalive_interval,
                http2_keepalive_timeout,
                http2_answer_budget,
            )?,
            tls: match (tls_files("tls", tls_cert, tls_key)?, tls_client_ca) {
                (Some(files), client_ca) => Some(TlsFiles { client_ca, ..files }),
                (None, Some(_)) => {
                    return Err(invalid("tls_client_ca", "needs tls_cert and tls_key"));
                }
                (None, None) => None,
            },
            tenant_cert_name: match tenant_cert_name.as_deref() {
                Some(name) => crate::listener::CertName::parse(name)
                    .map_err(|e| invalid("tenant_cert_name", e))?,
                None => crate::listener::CertName::Uri,
            },
            admin_tls: tls_files("admin_tls", admin_tls_cert, admin_tls_key)?,
            routes,
        };
        for (setting, value) in [
            ("lease", config.lease),
            ("ttl", config.ttl),
            // Zero would time out every upstream call at once, leaving each keyed
            // request's record in progress until its lease lapsed.
            ("upstream_timeout", config.upstream_timeout),
            // Zero would leave the store without a sweeper, growing without bound.
            ("sweep_interval", config.sweep_interval),
        ] {
            if value.is_zero() {
                return Err(invalid(setting, "must be longer than zero"));
            }
        }
        Ok(config)
    }
}
