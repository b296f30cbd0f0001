//! The resolvers of the settings that take more than their value or its default: the
//! store's options, the counts and durations with a floor, the lists, and the access
//! log, trace and proxy settings. Each takes the layered settings and names the setting
//! at fault as the file names it; those of a concern with a module of its own (the
//! upstream, the JWT, the secrets, the listeners, the routes, the tenants) are there.

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, Method};
use idem_tower::{GrpcReleaseCodes, ReleaseStatuses};

use super::error::{ConfigError, invalid};
use super::values::{
    parse_admin_addr, parse_grpc_release_codes, parse_listen_addr, parse_methods,
    parse_release_statuses, parse_tenant_headers,
};
use super::{DEFAULT_CLIENT_TIMEOUT, DEFAULT_LISTEN, DEFAULT_UPSTREAM_TIMEOUT, ServeArgs};
use crate::access::AccessLog;
use crate::listener::CertName;
use crate::path::PathNormalization;
use crate::route::RouteMatching;
use crate::store::{Namespace, StoreOptions};
use crate::trusted::TrustedProxies;

/// The tenant headers unless configured otherwise.
const DEFAULT_TENANT_HEADER: &str = "authorization";

/// The keyed methods unless configured otherwise.
const DEFAULT_KEYED_METHODS: [&str; 2] = ["POST", "PATCH"];

pub(super) fn listen(a: &ServeArgs) -> Result<SocketAddr, ConfigError> {
    parse_listen_addr(a.listen.as_deref().unwrap_or(DEFAULT_LISTEN))
}

pub(super) fn admin(a: &ServeArgs) -> Result<Option<SocketAddr>, ConfigError> {
    a.admin.as_deref().map(parse_admin_addr).transpose()
}

/// A duration that must be longer than zero (`setting`, given or its default).
pub(super) fn positive(
    setting: &str,
    given: Option<Duration>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match given.unwrap_or(default) {
        zero if zero.is_zero() => Err(invalid(setting, "must be longer than zero")),
        value => Ok(value),
    }
}

/// A count given as a number of any size, as the gateway counts (a larger one is as
/// good as no limit).
pub(super) fn count(given: Option<u64>, default: usize) -> usize {
    given.map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// `store_pool`, `store_namespace` and `migrate`.
pub(super) fn store_options(a: &ServeArgs) -> Result<StoreOptions, ConfigError> {
    Ok(StoreOptions {
        pool: a.store_pool,
        namespace: a
            .store_namespace
            .as_deref()
            .map(|name| Namespace::new(name).map_err(|e| invalid("store_namespace", e)))
            .transpose()?,
        schema: if a.no_migrate {
            idem_core::Schema::Existing
        } else {
            idem_core::Schema::Migrate
        },
    })
}

pub(super) fn tenant_headers(a: &ServeArgs) -> Result<Vec<HeaderName>, ConfigError> {
    match &a.tenant_header {
        Some(list) => parse_tenant_headers(list),
        None => parse_tenant_headers(&[DEFAULT_TENANT_HEADER.to_owned()]),
    }
}

pub(super) fn tenant_key_rate(a: &ServeArgs) -> Result<Option<idem_core::KeyRate>, ConfigError> {
    a.tenant_key_rate
        .as_deref()
        .map(|r| r.parse().map_err(|e| invalid("tenant_key_rate", e)))
        .transpose()
}

pub(super) fn unverified_key_rate(
    a: &ServeArgs,
) -> Result<Option<idem_core::KeyRate>, ConfigError> {
    a.unverified_key_rate
        .as_deref()
        .map(|r| r.parse().map_err(|e| invalid("unverified_key_rate", e)))
        .transpose()
}

pub(super) fn keyed_methods(a: &ServeArgs) -> Result<Vec<Method>, ConfigError> {
    let methods = match &a.keyed_methods {
        Some(list) => parse_methods(list, "keyed_methods")?,
        None => parse_methods(&DEFAULT_KEYED_METHODS.map(String::from), "keyed_methods")?,
    };
    // An empty list (an `IDEM_KEYED_METHODS` set to nothing, say) would turn keys off
    // without a word.
    if methods.is_empty() {
        return Err(invalid(
            "keyed_methods",
            "names no method; --passthrough is how to turn keys off",
        ));
    }
    Ok(methods)
}

/// The global `release_statuses`; `None` leaves each route its profile's
/// ([`ReleaseStatuses::of_profile`]).
pub(super) fn release_statuses(a: &ServeArgs) -> Result<Option<ReleaseStatuses>, ConfigError> {
    a.release_statuses
        .as_deref()
        .map(parse_release_statuses)
        .transpose()
}

pub(super) fn grpc_release_codes(a: &ServeArgs) -> Result<GrpcReleaseCodes, ConfigError> {
    match &a.grpc_release_codes {
        Some(list) => parse_grpc_release_codes(list, "grpc_release_codes"),
        None => Ok(GrpcReleaseCodes::default()),
    }
}

pub(super) fn path_normalization(a: &ServeArgs) -> Result<PathNormalization, ConfigError> {
    match &a.path_normalization {
        Some(list) => PathNormalization::from_items(list),
        None => Ok(PathNormalization::default()),
    }
    .map_err(|e| invalid("path_normalization", e))
}

pub(super) fn route_matching(a: &ServeArgs) -> Result<RouteMatching, ConfigError> {
    match &a.route_matching {
        Some(list) => RouteMatching::from_items(list),
        None => Ok(RouteMatching::default()),
    }
    .map_err(|e| invalid("route_matching", e))
}

/// `None` for no limit (`0s`).
pub(super) fn client_timeout(a: &ServeArgs) -> Result<Option<Duration>, ConfigError> {
    Ok(Some(a.client_timeout.unwrap_or(DEFAULT_CLIENT_TIMEOUT)).filter(|t| !t.is_zero()))
}

/// `None` derives it from the open-file limit when the gateway binds.
pub(super) fn max_connections(a: &ServeArgs) -> Result<Option<usize>, ConfigError> {
    match a.max_connections {
        Some(0) => Err(invalid("max_connections", "must be at least 1")),
        n => Ok(n.map(|n| n as usize)),
    }
}

/// The upstream timeout and 5 s more, unless given.
pub(super) fn shutdown_timeout(a: &ServeArgs) -> Result<Duration, ConfigError> {
    let upstream = a.upstream_timeout.unwrap_or(DEFAULT_UPSTREAM_TIMEOUT);
    Ok(a.shutdown_timeout
        .unwrap_or(upstream + Duration::from_secs(5)))
}

/// Where traces are posted: the setting, else the standard OpenTelemetry variable.
pub(super) fn otlp_endpoint(a: &ServeArgs) -> Result<Option<String>, ConfigError> {
    let standard = std::env::var(crate::telemetry::OTEL_ENDPOINT_ENV).ok();
    crate::telemetry::traces_url(a.otlp_endpoint.as_deref(), standard.as_deref())
        .map_err(|e| invalid("otlp_endpoint", e))
}

pub(super) fn access_log(a: &ServeArgs) -> Result<AccessLog, ConfigError> {
    let given = a.access_log.as_deref().map(AccessLog::parse).transpose();
    Ok(given
        .map_err(|e| invalid("access_log", e))?
        .unwrap_or(AccessLog::Sampled(1.0)))
}

pub(super) fn trusted_proxies(a: &ServeArgs) -> Result<TrustedProxies, ConfigError> {
    TrustedProxies::parse(a.trusted_proxies.as_deref().unwrap_or_default())
        .map_err(|e| invalid("trusted_proxies", e))
}

/// The headers only trusted proxies may set, which need trusted proxies to set them.
pub(super) fn trusted_headers(a: &ServeArgs) -> Result<Vec<HeaderName>, ConfigError> {
    crate::trusted::parse_trusted_headers(
        a.trusted_headers.as_deref().unwrap_or_default(),
        a.trusted_proxies.as_deref().unwrap_or_default(),
    )
    .map_err(|e| invalid("trusted_headers", e))
}

pub(super) fn tenant_cert_name(a: &ServeArgs) -> Result<CertName, ConfigError> {
    match a.tenant_cert_name.as_deref() {
        Some(name) => CertName::parse(name).map_err(|e| invalid("tenant_cert_name", e)),
        None => Ok(CertName::Uri),
    }
}
