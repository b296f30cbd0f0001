//! The resolved gateway settings: command line, then `IDEM_*` environment (both read by
//! clap), then the `--config` TOML file, then the defaults.
//!
//! The TOML file takes the `serve` options under the same names (with `_` for `-`) and
//! adds per-route rules (the repository's `contrib/idem.toml` shows every setting at its
//! default):
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

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use idem_core::{DEFAULT_BODY_LIMIT, DEFAULT_LEASE, DEFAULT_TTL, ScopeMode, TenantKey};
use idem_tower::{DEFAULT_RESPONSE_LIMIT, ReleaseStatuses};
use serde::Deserialize;

use crate::cli::{ScopeArg, ServeArgs};
use crate::path::PathNormalization;
use crate::route::{PathTemplate, Route};

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The default store: an SQLite file in the working directory.
pub const DEFAULT_STORE: &str = "sqlite://idem.db";
/// The default upstream timeout.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// The default time between sweeps of expired records.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// How long a client connection may take to send a request's headers unless configured
/// otherwise (hyper's own default).
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The `--config` file cannot be read.
    #[error("cannot read the config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The `--config` file is not valid TOML for this program.
    #[error("the config file {path} is invalid: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A setting has an unusable value.
    #[error("{setting}: {reason}")]
    Invalid {
        /// Which setting.
        setting: String,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(setting: impl Into<String>, reason: impl ToString) -> ConfigError {
    ConfigError::Invalid {
        setting: setting.into(),
        reason: reason.to_string(),
    }
}

/// A byte count from the command line (already parsed), else from the file (a number or
/// a string such as `"1MiB"`), else `default`.
fn bytes(
    cli: Option<usize>,
    file: Option<ByteSize>,
    setting: &str,
    default: usize,
) -> Result<usize, ConfigError> {
    match (cli, file) {
        (Some(n), _) => Ok(n),
        (None, Some(ByteSize::Bytes(n))) => {
            usize::try_from(n).map_err(|_| invalid(setting, "too large"))
        }
        (None, Some(ByteSize::Text(s))) => parse_byte_size(&s).map_err(|e| invalid(setting, e)),
        (None, None) => Ok(default),
    }
}

/// The `--config` file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `--upstream`.
    pub upstream: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--store`.
    pub store: Option<String>,
    /// `--store-pool`.
    pub store_pool: Option<u32>,
    /// `--store-namespace`.
    pub store_namespace: Option<String>,
    /// `--admin`.
    pub admin: Option<String>,
    /// `--admin-token`.
    pub admin_token: Option<String>,
    /// `--admin-token-file`.
    pub admin_token_file: Option<std::path::PathBuf>,
    /// `--require-key`.
    pub require_key: Option<bool>,
    /// `--ttl`.
    pub ttl: Option<String>,
    /// `--lease`.
    pub lease: Option<String>,
    /// `--upstream-timeout`.
    pub upstream_timeout: Option<String>,
    /// `--body-limit`: a number of bytes or a string such as `"1MiB"`.
    pub body_limit: Option<ByteSize>,
    /// `--response-limit`: a number of bytes or a string such as `"8MiB"`.
    pub response_limit: Option<ByteSize>,
    /// `--tenant-header`: a list (`["Authorization", "Stripe-Account"]`) or one
    /// comma-separated string.
    pub tenant_header: Option<HeaderList>,
    /// `--require-tenant`.
    pub require_tenant: Option<bool>,
    /// `--tenant-secret-file`.
    pub tenant_secret_file: Option<std::path::PathBuf>,
    /// `--scope`.
    pub scope: Option<ScopeArg>,
    /// `--keyed-methods`.
    pub keyed_methods: Option<Vec<String>>,
    /// `--release-statuses`, as numbers: `[409, 429, 503]`; `[]` releases none.
    pub release_statuses: Option<Vec<u16>>,
    /// `--path-normalization`: a list, `["rfc3986", "merge-slashes"]`, or one string,
    /// `"none"` or `"rfc3986,merge-slashes"`.
    pub path_normalization: Option<ItemList>,
    /// `--client-timeout`.
    pub client_timeout: Option<String>,
    /// `--max-connections`.
    pub max_connections: Option<u32>,
    /// `--sweep-interval`.
    pub sweep_interval: Option<String>,
    /// `--shutdown-timeout`.
    pub shutdown_timeout: Option<String>,
    /// Per-route rules, first match wins.
    #[serde(default)]
    pub route: Vec<RouteRule>,
}

/// A list of header names in the file: an array, or one comma-separated string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum HeaderList {
    /// `"Authorization,Stripe-Account"`.
    Text(String),
    /// `["Authorization", "Stripe-Account"]`.
    List(Vec<String>),
}

impl HeaderList {
    fn into_vec(self) -> Vec<String> {
        match self {
            HeaderList::Text(s) => s.split(',').map(str::to_owned).collect(),
            HeaderList::List(v) => v,
        }
    }
}

/// The environment variable that holds the tenant secret itself.
pub const TENANT_SECRET_ENV: &str = "IDEM_TENANT_SECRET";

/// A tenant secret as read from [`TENANT_SECRET_ENV`]: its bytes, which `Debug` never
/// shows.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantSecret(Vec<u8>);

impl TenantSecret {
    /// A secret of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> TenantSecret {
        TenantSecret(bytes.into())
    }

    /// The secret in [`TENANT_SECRET_ENV`], if it is set.
    pub fn from_env() -> Option<TenantSecret> {
        std::env::var_os(TENANT_SECRET_ENV).map(|v| TenantSecret(v.into_encoded_bytes()))
    }
}

impl std::fmt::Debug for TenantSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TenantSecret({} bytes)", self.0.len())
    }
}

/// The tenant key from the operator's secret: `IDEM_TENANT_SECRET`, or the file the
/// command line (else the config file) names; `None` when neither is given, and the
/// store's own secret is used. Surrounding ASCII whitespace is trimmed (a file's
/// trailing newline), then the secret must be at least 32 bytes. Given both ways, the
/// secret is refused rather than one picked: two gateways that picked differently
/// would name every client differently.
pub fn tenant_key(
    from_env: Option<&TenantSecret>,
    cli_file: Option<&Path>,
    config_file: Option<&Path>,
) -> Result<Option<TenantKey>, ConfigError> {
    let file = cli_file.or(config_file);
    let (setting, secret) = match (from_env, file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "tenant_secret_file",
                format!(
                    "the tenant secret is given twice, in {TENANT_SECRET_ENV} and as a file; \
                     give it once"
                ),
            ));
        }
        (Some(secret), None) => (TENANT_SECRET_ENV.to_owned(), secret.0.clone()),
        (None, Some(path)) => {
            let bytes = std::fs::read(path).map_err(|e| {
                invalid(
                    "tenant_secret_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            warn_if_readable_by_others(path);
            (format!("tenant_secret_file {}", path.display()), bytes)
        }
        (None, None) => return Ok(None),
    };
    TenantKey::new(secret.trim_ascii())
        .map(Some)
        .map_err(|e| invalid(setting, e))
}

/// A secret file that others may read lets them name every tenant.
fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                file = %path.display(),
                "the tenant secret file is readable by others than its owner; chmod 600 it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// The tenant headers as given: names, in order, without repeats.
pub(crate) fn parse_tenant_headers(list: &[String]) -> Result<Vec<HeaderName>, ConfigError> {
    let mut names: Vec<HeaderName> = Vec::new();
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let name = HeaderName::try_from(item)
            .map_err(|e| invalid("tenant_header", format!("{item:?}: {e}")))?;
        if names.contains(&name) {
            return Err(invalid(
                "tenant_header",
                format!("{item:?} is listed twice"),
            ));
        }
        names.push(name);
    }
    if names.is_empty() {
        return Err(invalid(
            "tenant_header",
            "the list is empty; name at least one header, e.g. Authorization",
        ));
    }
    Ok(names)
}

/// A byte count in the file: an integer or a string with a unit.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ByteSize {
    /// Bytes.
    Bytes(u64),
    /// `"64KiB"`, `"1MiB"`, `"1048576"`.
    Text(String),
}

/// A list setting in the file: a TOML array of strings, or one comma-separated string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ItemList {
    /// `["rfc3986", "merge-slashes"]`.
    Many(Vec<String>),
    /// `"rfc3986,merge-slashes"`, `"none"`.
    One(String),
}

impl ItemList {
    fn items(&self) -> Vec<&str> {
        match self {
            ItemList::Many(items) => items.iter().map(String::as_str).collect(),
            ItemList::One(list) => list.split(',').collect(),
        }
    }
}

/// A `[[route]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    /// The method; any method when left out.
    pub method: Option<String>,
    /// The path template, e.g. `/v1/orders/{id}/capture`.
    pub path: String,
    /// Whether the key is required on this route.
    pub require_key: Option<bool>,
    /// Record lifetime on this route.
    pub ttl: Option<String>,
    /// JSON pointers left out of the fingerprint.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// Extra response headers stored and replayed.
    #[serde(default)]
    pub store_headers: Vec<String>,
    /// The statuses that release the key on this route, replacing the global list.
    pub release_statuses: Option<Vec<u16>>,
}

/// Where the upstream is.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http`.
    pub scheme: http::uri::Scheme,
    /// Host and port.
    pub authority: http::uri::Authority,
    /// A path prefix without trailing slash (empty for none).
    pub base_path: String,
}

impl Upstream {
    /// Parses an `http://host:port[/prefix]` URL.
    pub fn parse(url: &str) -> Result<Upstream, ConfigError> {
        let uri: Uri = url
            .parse()
            .map_err(|e| invalid("upstream", format!("{url:?} is not a URL: {e}")))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| invalid("upstream", "the URL needs a scheme, e.g. http://"))?;
        if scheme != http::uri::Scheme::HTTP {
            return Err(invalid(
                "upstream",
                "only http:// upstreams are supported (terminate TLS in front of the upstream's network)",
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| invalid("upstream", "the URL needs a host"))?;
        if uri.query().is_some() {
            return Err(invalid("upstream", "the URL may not carry a query"));
        }
        Ok(Upstream {
            scheme,
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The upstream URI for an incoming request's URI: its path and query, after the
    /// base path.
    ///
    /// Without a base path the incoming path and query, already parsed, are reused as
    /// they are rather than written out and parsed again.
    pub fn uri_for(&self, incoming: &Uri) -> Result<Uri, http::Error> {
        let builder = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone());
        match incoming.path_and_query() {
            Some(pq) if self.base_path.is_empty() => builder.path_and_query(pq.clone()),
            pq => builder.path_and_query(format!(
                "{}{}",
                self.base_path,
                pq.map_or("/", |p| p.as_str())
            )),
        }
        .build()
    }
}

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
    pub store_options: crate::store::StoreOptions,
    /// The admin listener, if any.
    pub admin: Option<SocketAddr>,
    /// The admin bearer token, if any.
    pub admin_token: Option<String>,
    /// Whether keyed methods need a key.
    pub require_key: bool,
    /// Record lifetime.
    pub ttl: Duration,
    /// Attempt lease.
    pub lease: Duration,
    /// Upstream timeout.
    pub upstream_timeout: Duration,
    /// Keyed body limit in bytes.
    pub body_limit: usize,
    /// Largest keyed answer recorded, in bytes.
    pub response_limit: usize,
    /// The headers naming the tenant together, in order.
    pub tenant_headers: Vec<HeaderName>,
    /// Whether a keyed request without any of them is refused (401).
    pub require_tenant: bool,
    /// The key tenants are hashed under, from the operator's secret; `None` for the
    /// store's own.
    pub tenant_key: Option<TenantKey>,
    /// The scope mode.
    pub scope: ScopeMode,
    /// The keyed methods.
    pub keyed_methods: Vec<Method>,
    /// Upstream statuses that release the key rather than being recorded.
    pub release_statuses: ReleaseStatuses,
    /// How request paths are normalised before any rule sees them (SPEC S14).
    pub path_normalization: PathNormalization,
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
    /// Per-route rules.
    pub routes: Vec<Route>,
}

impl GatewayConfig {
    /// Merges the command line (and environment) over the file over the defaults.
    pub fn resolve(args: &ServeArgs) -> Result<GatewayConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        GatewayConfig::merge(args, file)
    }

    /// Merges already-read parts.
    pub fn merge(args: &ServeArgs, file: FileConfig) -> Result<GatewayConfig, ConfigError> {
        let dur = |cli: Option<Duration>,
                   file: &Option<String>,
                   name: &str,
                   default: Duration|
         -> Result<Duration, ConfigError> {
            match (cli, file) {
                (Some(d), _) => Ok(d),
                (None, Some(s)) => crate::cli::parse_duration(s).map_err(|e| invalid(name, e)),
                (None, None) => Ok(default),
            }
        };
        let upstream = args.upstream.clone().or(file.upstream).ok_or_else(|| {
            invalid(
                "upstream",
                "required: give --upstream URL, IDEM_UPSTREAM or `upstream` in --config",
            )
        })?;
        let listen = args
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen: SocketAddr = listen
            .parse()
            .map_err(|e| invalid("listen", format!("{listen:?}: {e}")))?;
        let admin = args
            .admin
            .clone()
            .or(file.admin)
            .map(|a| parse_admin_addr(&a))
            .transpose()?;
        let admin_token = admin_token(
            args.admin_token.clone().or(file.admin_token),
            args.admin_token_file.clone().or(file.admin_token_file),
        )?;
        let body_limit = bytes(
            args.body_limit,
            file.body_limit,
            "body_limit",
            DEFAULT_BODY_LIMIT,
        )?;
        let response_limit = bytes(
            args.response_limit,
            file.response_limit,
            "response_limit",
            DEFAULT_RESPONSE_LIMIT,
        )?;
        let tenant_headers = parse_tenant_headers(
            &args
                .tenant_header
                .clone()
                .or(file.tenant_header.map(HeaderList::into_vec))
                .unwrap_or_else(|| vec!["authorization".to_owned()]),
        )?;
        let tenant_key = tenant_key(
            args.tenant_secret.as_ref(),
            args.tenant_secret_file.as_deref(),
            file.tenant_secret_file.as_deref(),
        )?;
        let scope = match args.scope.or(file.scope).unwrap_or(ScopeArg::Public) {
            ScopeArg::Public => ScopeMode::Public,
            ScopeArg::Internal => ScopeMode::Internal,
        };
        let methods = args
            .keyed_methods
            .clone()
            .or(file.keyed_methods)
            .unwrap_or_else(|| vec!["POST".into(), "PATCH".into()]);
        let keyed_methods = parse_methods(&methods, "keyed_methods")?;
        // An empty list (an `IDEM_KEYED_METHODS` set to nothing, say) would turn keys off
        // without a word.
        if keyed_methods.is_empty() {
            return Err(invalid(
                "keyed_methods",
                "names no method; --passthrough is how to turn keys off",
            ));
        }
        let release_statuses = match (&args.release_statuses, file.release_statuses) {
            (Some(list), _) => parse_release_statuses(list)?,
            (None, Some(codes)) => check_release_statuses(codes, "release_statuses")?,
            (None, None) => ReleaseStatuses::default(),
        };
        let path_normalization = match (&args.path_normalization, &file.path_normalization) {
            (Some(list), _) => PathNormalization::from_items(list),
            (None, Some(list)) => PathNormalization::from_items(list.items()),
            (None, None) => Ok(PathNormalization::default()),
        }
        .map_err(|e| invalid("path_normalization", e))?;
        let upstream_timeout = dur(
            args.upstream_timeout,
            &file.upstream_timeout,
            "upstream_timeout",
            DEFAULT_UPSTREAM_TIMEOUT,
        )?;
        let routes = file
            .route
            .into_iter()
            .enumerate()
            .map(|(i, r)| route_from_rule(i, r, path_normalization))
            .collect::<Result<Vec<_>, _>>()?;
        let config = GatewayConfig {
            upstream: Upstream::parse(&upstream)?,
            listen,
            store: args
                .store
                .clone()
                .or(file.store)
                .unwrap_or_else(|| DEFAULT_STORE.to_owned()),
            store_options: crate::store::StoreOptions {
                pool: args.store_pool.or(file.store_pool),
                namespace: args
                    .store_namespace
                    .as_deref()
                    .or(file.store_namespace.as_deref())
                    .map(|name| {
                        crate::store::Namespace::new(name)
                            .map_err(|e| invalid("store_namespace", e))
                    })
                    .transpose()?,
            },
            admin,
            admin_token,
            require_key: args.require_key || file.require_key.unwrap_or(false),
            ttl: dur(args.ttl, &file.ttl, "ttl", DEFAULT_TTL)?,
            lease: dur(args.lease, &file.lease, "lease", DEFAULT_LEASE)?,
            upstream_timeout,
            body_limit,
            response_limit,
            tenant_headers,
            require_tenant: args.require_tenant || file.require_tenant.unwrap_or(false),
            tenant_key,
            scope,
            keyed_methods,
            release_statuses,
            path_normalization,
            client_timeout: Some(dur(
                args.client_timeout,
                &file.client_timeout,
                "client_timeout",
                DEFAULT_CLIENT_TIMEOUT,
            )?)
            .filter(|t| !t.is_zero()),
            max_connections: match args.max_connections.or(file.max_connections) {
                Some(0) => return Err(invalid("max_connections", "must be at least 1")),
                n => n.map(|n| n as usize),
            },
            sweep_interval: dur(
                args.sweep_interval,
                &file.sweep_interval,
                "sweep_interval",
                DEFAULT_SWEEP_INTERVAL,
            )?,
            shutdown_timeout: dur(
                args.shutdown_timeout,
                &file.shutdown_timeout,
                "shutdown_timeout",
                upstream_timeout + Duration::from_secs(5),
            )?,
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

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.display().to_string(),
        source: Box::new(source),
    })
}

fn parse_methods(list: &[String], setting: &str) -> Result<Vec<Method>, ConfigError> {
    list.iter()
        .map(|m| m.trim())
        .filter(|m| !m.is_empty())
        .map(|m| {
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|e| invalid(setting, format!("{m:?}: {e}")))
        })
        .collect()
}

/// `--release-statuses` as given: status codes, or `none` alone for none.
fn parse_release_statuses(list: &[String]) -> Result<ReleaseStatuses, ConfigError> {
    let items: Vec<&str> = list
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    match items.as_slice() {
        [] => {
            return Err(invalid(
                "release_statuses",
                "the list is empty; give status codes, or none to record every answer",
            ));
        }
        [only] if only.eq_ignore_ascii_case("none") => return Ok(ReleaseStatuses::new([])),
        _ => {}
    }
    let codes = items
        .iter()
        .map(|s| {
            s.parse::<u16>().map_err(|_| {
                invalid(
                    "release_statuses",
                    format!("{s:?} is not a status code (give e.g. 409,429,503, or none)"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_release_statuses(codes, "release_statuses")
}

/// Admits only 4xx and 5xx: any other answer says the request was executed, and
/// releasing it would let a retry execute it again.
fn check_release_statuses(codes: Vec<u16>, setting: &str) -> Result<ReleaseStatuses, ConfigError> {
    codes
        .into_iter()
        .map(|code| match code {
            400..=599 => Ok(StatusCode::from_u16(code).expect("400-599 are status codes")),
            _ => Err(invalid(
                setting,
                format!(
                    "{code}: only 4xx and 5xx answers can release a key; any other status \
                     means the request was executed, and a retry would execute it again"
                ),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(ReleaseStatuses::new)
}

fn route_from_rule(
    i: usize,
    rule: RouteRule,
    paths: PathNormalization,
) -> Result<Route, ConfigError> {
    let name = format!("route[{i}] ({})", rule.path);
    let method = match rule.method.as_deref().map(str::trim) {
        None | Some("*") | Some("") => None,
        Some(m) => Some(parse_methods(&[m.to_owned()], &name)?.remove(0)),
    };
    let template = PathTemplate::parse(&rule.path).map_err(|e| invalid(&name, e))?;
    // Rules see normalised paths only: a template in another spelling would never
    // match, and its require_key would silently hold nowhere.
    template
        .check_normal(paths)
        .map_err(|e| invalid(&name, e))?;
    let ttl = rule
        .ttl
        .as_deref()
        .map(crate::cli::parse_duration)
        .transpose()
        .map_err(|e| invalid(&name, e))?;
    if ttl.is_some_and(|t| t.is_zero()) {
        return Err(invalid(&name, "ttl must be longer than zero"));
    }
    let store_headers = rule
        .store_headers
        .iter()
        .map(|h| {
            HeaderName::try_from(h.as_str()).map_err(|e| invalid(&name, format!("{h:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut route = Route::new(
        method,
        template,
        rule.require_key,
        ttl,
        rule.ignore,
        store_headers,
    )
    .map_err(|e| invalid(&name, e))?;
    route.release_statuses = rule
        .release_statuses
        .map(|codes| check_release_statuses(codes, &format!("{name} release_statuses")))
        .transpose()?;
    Ok(route)
}

/// The admin bearer token, given as itself or as a file that holds it (one line; the
/// line end is dropped). Both at once is an error rather than one silently winning: an
/// operator who moved the token to a file and forgot the old setting would otherwise
/// run with a token they believe retired. A token that is empty, or that a bearer
/// header cannot carry as it is (surrounding whitespace, which the header's parsing
/// trims; anything but printable ASCII), is refused at start instead of locking every
/// caller out, or letting an empty header in.
fn admin_token(
    token: Option<String>,
    file: Option<std::path::PathBuf>,
) -> Result<Option<String>, ConfigError> {
    let (token, setting) = match (token, file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "admin_token_file",
                "give the admin token or a file holding it, not both \
                 (--admin-token/IDEM_ADMIN_TOKEN/admin_token and \
                 --admin-token-file/IDEM_ADMIN_TOKEN_FILE/admin_token_file)",
            ));
        }
        (None, None) => return Ok(None),
        (Some(token), None) => (token, "admin_token"),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                invalid(
                    "admin_token_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            warn_if_others_can_read(&path);
            let line = text.strip_suffix('\n').unwrap_or(&text);
            let line = line.strip_suffix('\r').unwrap_or(line);
            (line.to_owned(), "admin_token_file")
        }
    };
    if token.trim().is_empty() {
        return Err(invalid(
            setting,
            "the admin token is empty; give a long random value, or no token",
        ));
    }
    if token.trim() != token {
        return Err(invalid(
            setting,
            "the admin token starts or ends with whitespace, which an Authorization \
             header cannot carry",
        ));
    }
    if !token.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(invalid(
            setting,
            "the admin token has a character that is not printable ASCII (or a second \
             line), which an Authorization header cannot carry",
        ));
    }
    Ok(Some(token))
}

/// A secret in a file that others may read is not much of a secret: say so, but start
/// (the operator may know why, a group-readable file for a sidecar, say).
fn warn_if_others_can_read(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o004 != 0
        {
            tracing::warn!(
                path = %path.display(),
                mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
                "the admin token file is readable by every user; chmod 600 it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// An admin address: `ADDR:PORT`, or a bare port bound to loopback.
pub fn parse_admin_addr(s: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(port) = s.trim().parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.trim()
        .parse()
        .map_err(|e| invalid("admin", format!("{s:?}: {e}")))
}

/// Parses a byte count: `1048576`, `64KiB`, `1MiB`, `2MB`, `1GiB` (binary units for
/// `Ki`/`Mi`/`Gi` and for bare `K`/`M`/`G`, decimal for `KB`/`MB`/`GB`).
pub fn parse_byte_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (examples: 65536, 64KiB, 1MiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?} (use B, KiB, MiB, GiB)"
            ));
        }
    };
    num.checked_mul(mult)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(upstream: &str) -> ServeArgs {
        ServeArgs {
            upstream: Some(upstream.to_owned()),
            ..ServeArgs::default()
        }
    }

    #[test]
    fn defaults_follow_the_issue() {
        let c =
            GatewayConfig::merge(&args("http://127.0.0.1:3000"), FileConfig::default()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.store, "sqlite://idem.db");
        assert_eq!(c.admin, None);
        assert!(!c.require_key);
        assert_eq!(c.ttl, Duration::from_secs(24 * 3600));
        assert_eq!(c.lease, Duration::from_secs(60));
        assert_eq!(c.upstream_timeout, Duration::from_secs(60));
        assert_eq!(c.body_limit, 1024 * 1024);
        assert_eq!(c.response_limit, 8 * 1024 * 1024);
        assert_eq!(c.tenant_headers, vec![http::header::AUTHORIZATION]);
        assert!(!c.require_tenant);
        assert!(c.tenant_key.is_none(), "the store's own secret");
        assert_eq!(c.scope, ScopeMode::Public);
        assert_eq!(c.keyed_methods, vec![Method::POST, Method::PATCH]);
        assert_eq!(c.client_timeout, Some(Duration::from_secs(30)));
        assert_eq!(c.store_options.namespace, None, "the stores' own: idem");
    }

    #[test]
    fn settings_that_would_disable_protection_are_refused() {
        let zero = Some(Duration::ZERO);
        let cases: [(&str, ServeArgs); 6] = [
            (
                "lease",
                ServeArgs {
                    lease: zero,
                    ..args("http://127.0.0.1:1")
                },
            ),
            (
                "ttl",
                ServeArgs {
                    ttl: zero,
                    ..args("http://127.0.0.1:1")
                },
            ),
            (
                "upstream_timeout",
                ServeArgs {
                    upstream_timeout: zero,
                    ..args("http://127.0.0.1:1")
                },
            ),
            (
                "sweep_interval",
                ServeArgs {
                    sweep_interval: zero,
                    ..args("http://127.0.0.1:1")
                },
            ),
            (
                "keyed_methods",
                ServeArgs {
                    keyed_methods: Some(vec![]),
                    ..args("http://127.0.0.1:1")
                },
            ),
            (
                "keyed_methods",
                ServeArgs {
                    keyed_methods: Some(vec![" ".into(), "".into()]),
                    ..args("http://127.0.0.1:1")
                },
            ),
        ];
        for (setting, a) in cases {
            let e = GatewayConfig::merge(&a, FileConfig::default()).unwrap_err();
            assert!(e.to_string().contains(setting), "{setting}: {e}");
        }
        for file in [
            "upstream = \"http://127.0.0.1:1\"\nsweep_interval = \"0s\"",
            "upstream = \"http://127.0.0.1:1\"\n[[route]]\npath = \"/x\"\nttl = \"0s\"",
        ] {
            let file: FileConfig = toml::from_str(file).unwrap();
            let e = GatewayConfig::merge(&ServeArgs::default(), file).unwrap_err();
            assert!(e.to_string().contains("longer than zero"), "{e}");
        }
    }

    #[test]
    fn store_namespace_from_the_command_line_or_the_file_and_checked() {
        let file = |ns: &str| -> FileConfig {
            toml::from_str(&format!(
                "upstream = \"http://127.0.0.1:1\"\nstore_namespace = \"{ns}\""
            ))
            .unwrap()
        };
        let c = GatewayConfig::merge(&ServeArgs::default(), file("payments")).unwrap();
        let ns = c.store_options.namespace.unwrap();
        assert_eq!(
            (
                ns.suffixed("_records").unwrap().to_string(),
                format!("{ns}:")
            ),
            ("payments_records".into(), "payments:".into())
        );
        let a = ServeArgs {
            store_namespace: Some("orders".into()),
            ..ServeArgs::default()
        };
        let c = GatewayConfig::merge(&a, file("payments")).unwrap();
        assert_eq!(c.store_options.namespace.unwrap().as_str(), "orders");
        let e = GatewayConfig::merge(&ServeArgs::default(), file("pay-ments")).unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.contains("store_namespace") && shown.contains("\"pay-ments\" is not a namespace"),
            "{shown}"
        );
    }

    #[test]
    fn client_timeout_from_the_file_the_command_line_or_off() {
        let file = || -> FileConfig {
            toml::from_str("upstream = \"http://127.0.0.1:1\"\nclient_timeout = \"5s\"").unwrap()
        };
        let c = GatewayConfig::merge(&ServeArgs::default(), file()).unwrap();
        assert_eq!(c.client_timeout, Some(Duration::from_secs(5)));
        let mut a = ServeArgs {
            client_timeout: Some(Duration::from_millis(1500)),
            ..ServeArgs::default()
        };
        let c = GatewayConfig::merge(&a, file()).unwrap();
        assert_eq!(c.client_timeout, Some(Duration::from_millis(1500)));
        a.client_timeout = Some(Duration::ZERO);
        let c = GatewayConfig::merge(&a, file()).unwrap();
        assert_eq!(c.client_timeout, None, "0s turns it off");
    }

    #[test]
    fn max_connections_from_the_file_or_the_command_line_and_never_zero() {
        let file = |n: u32| -> FileConfig {
            toml::from_str(&format!(
                "upstream = \"http://127.0.0.1:1\"\nmax_connections = {n}"
            ))
            .unwrap()
        };
        let bare: FileConfig = toml::from_str("upstream = \"http://127.0.0.1:1\"").unwrap();
        let c = GatewayConfig::merge(&ServeArgs::default(), bare).unwrap();
        assert_eq!(c.max_connections, None, "derived when the gateway binds");
        let c = GatewayConfig::merge(&ServeArgs::default(), file(300)).unwrap();
        assert_eq!(c.max_connections, Some(300));
        let a = ServeArgs {
            max_connections: Some(4),
            ..ServeArgs::default()
        };
        assert_eq!(
            GatewayConfig::merge(&a, file(300)).unwrap().max_connections,
            Some(4)
        );
        let e = GatewayConfig::merge(&ServeArgs::default(), file(0)).unwrap_err();
        assert!(e.to_string().contains("max_connections"), "{e}");
    }

    fn codes(c: &GatewayConfig) -> Vec<u16> {
        c.release_statuses.iter().map(|s| s.as_u16()).collect()
    }

    #[test]
    fn routes_may_release_their_own_statuses() {
        let file: FileConfig = toml::from_str(
            r#"
            [[route]]
            path = "/v1/payouts"
            release_statuses = [503, 502]

            [[route]]
            path = "/v1/refunds"
            "#,
        )
        .unwrap();
        let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
        let route: Vec<u16> = c.routes[0]
            .release_statuses
            .as_ref()
            .expect("the route's own list")
            .iter()
            .map(|s| s.as_u16())
            .collect();
        assert_eq!(route, vec![502, 503]);
        assert!(
            c.routes[1].release_statuses.is_none(),
            "the global list applies"
        );

        let file: FileConfig =
            toml::from_str("[[route]]\npath = \"/v1/x\"\nrelease_statuses = [204]").unwrap();
        let err = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("/v1/x")
                && text.contains("release_statuses")
                && text.contains("204: only"),
            "{text}"
        );
    }

    #[test]
    fn release_statuses_default_to_the_layers() {
        let c =
            GatewayConfig::merge(&args("http://127.0.0.1:3000"), FileConfig::default()).unwrap();
        assert_eq!(codes(&c), idem_tower::DEFAULT_RELEASE_STATUSES.to_vec());
    }

    #[test]
    fn release_statuses_from_the_command_line_and_the_file() {
        let file =
            || -> FileConfig { toml::from_str("release_statuses = [503, 409, 409]").unwrap() };
        let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file()).unwrap();
        assert_eq!(codes(&c), vec![409, 503], "sorted, without repeats");

        let mut cli = args("http://127.0.0.1:3000");
        cli.release_statuses = Some(vec![" 429".into(), "418".into(), "".into()]);
        let c = GatewayConfig::merge(&cli, file()).unwrap();
        assert_eq!(codes(&c), vec![418, 429], "the command line wins");

        for none in ["none", "NONE"] {
            cli.release_statuses = Some(vec![none.into()]);
            let c = GatewayConfig::merge(&cli, FileConfig::default()).unwrap();
            assert!(c.release_statuses.is_empty());
        }
        let file: FileConfig = toml::from_str("release_statuses = []").unwrap();
        let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
        assert!(c.release_statuses.is_empty());
    }

    #[test]
    fn release_statuses_refuse_answers_that_mean_executed() {
        let mut cli = args("http://127.0.0.1:3000");
        for (list, says) in [
            (vec!["409", "200"], "200: only 4xx and 5xx"),
            (vec!["302"], "302: only 4xx and 5xx"),
            (vec!["600"], "600: only 4xx and 5xx"),
            (vec!["conflict"], "\"conflict\" is not a status code"),
            (vec!["none", "409"], "\"none\" is not a status code"),
            (vec![""], "the list is empty"),
            (vec![" ", ""], "the list is empty"),
        ] {
            cli.release_statuses = Some(list.iter().map(|s| s.to_string()).collect());
            let err = GatewayConfig::merge(&cli, FileConfig::default()).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("release_statuses") && text.contains(says),
                "{list:?}: {text}"
            );
        }
        let file: FileConfig = toml::from_str("release_statuses = [201]").unwrap();
        let err = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap_err();
        assert!(err.to_string().contains("201: only 4xx and 5xx"), "{err}");
    }

    #[test]
    fn tenant_headers_from_the_command_line_or_the_file_and_checked() {
        let file = |toml: &str| -> FileConfig { toml::from_str(toml).unwrap() };
        let c = GatewayConfig::merge(
            &args("http://127.0.0.1:1"),
            file("tenant_header = [\"Authorization\", \"Stripe-Account\"]\nrequire_tenant = true"),
        )
        .unwrap();
        assert_eq!(
            c.tenant_headers,
            vec![
                http::header::AUTHORIZATION,
                HeaderName::from_static("stripe-account")
            ]
        );
        assert!(c.require_tenant);
        let c = GatewayConfig::merge(
            &args("http://127.0.0.1:1"),
            file("tenant_header = \"X-Api-Key, Stripe-Account\""),
        )
        .unwrap();
        assert_eq!(c.tenant_headers.len(), 2);
        let mut a = args("http://127.0.0.1:1");
        a.tenant_header = Some(vec!["x-api-key".into()]);
        let c = GatewayConfig::merge(&a, file("tenant_header = \"Authorization\"")).unwrap();
        assert_eq!(c.tenant_headers, vec![HeaderName::from_static("x-api-key")]);
        for (list, says) in [
            (vec!["", " "], "the list is empty"),
            (vec!["Authorization", "authorization"], "listed twice"),
            (vec!["bad header"], "\"bad header\""),
        ] {
            a.tenant_header = Some(list.iter().map(|s| s.to_string()).collect());
            let e = GatewayConfig::merge(&a, FileConfig::default()).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("tenant_header") && text.contains(says),
                "{text}"
            );
        }
    }

    #[test]
    fn tenant_secret_from_the_environment_or_a_file_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "  0123456789abcdef0123456789abcdef\n").unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "0123456789abcdef0123456789abcde\n").unwrap();
        let env = TenantSecret::new("0123456789abcdef0123456789abcdef");
        let from_file = tenant_key(None, Some(&good), None).unwrap().unwrap();
        let from_env = tenant_key(Some(&env), None, None).unwrap().unwrap();
        let name = |k: &TenantKey| k.credential("authorization", b"basic x");
        assert_eq!(
            name(&from_file),
            name(&from_env),
            "the file's whitespace is trimmed"
        );
        let from_config = tenant_key(None, None, Some(&good)).unwrap().unwrap();
        assert_eq!(name(&from_config), name(&from_env));
        assert!(tenant_key(None, None, None).unwrap().is_none());

        let e = tenant_key(None, Some(&short), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("31 bytes") && e.contains("at least 32"), "{e}");
        assert!(!e.contains("0123456789"), "the secret is shown: {e}");
        let e = tenant_key(Some(&TenantSecret::new("hunter2")), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("IDEM_TENANT_SECRET") && !e.contains("hunter2"),
            "{e}"
        );
        let e = tenant_key(Some(&env), Some(&good), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
        let e = tenant_key(None, Some(&dir.path().join("none")), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tenant_secret_file") && e.contains("cannot read"),
            "{e}"
        );
        assert!(!format!("{env:?}").contains("0123"), "{env:?}");
    }

    #[test]
    fn path_normalization_from_the_command_line_the_file_or_the_default() {
        let c =
            GatewayConfig::merge(&args("http://127.0.0.1:3000"), FileConfig::default()).unwrap();
        assert_eq!(c.path_normalization, PathNormalization::default());
        assert_eq!(c.path_normalization.to_string(), "rfc3986,merge-slashes");
        for toml in [
            "path_normalization = [\"rfc3986\", \"lowercase\"]",
            "path_normalization = \"rfc3986,lowercase\"",
        ] {
            let file: FileConfig = toml::from_str(toml).unwrap();
            let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
            assert_eq!(
                c.path_normalization.to_string(),
                "rfc3986,lowercase",
                "{toml}"
            );
        }
        let file = || -> FileConfig { toml::from_str("path_normalization = \"none\"").unwrap() };
        let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file()).unwrap();
        assert!(c.path_normalization.is_none());
        let mut cli = args("http://127.0.0.1:3000");
        cli.path_normalization = Some(vec!["merge-slashes".into(), "trailing-slash".into()]);
        let c = GatewayConfig::merge(&cli, file()).unwrap();
        assert_eq!(
            c.path_normalization.to_string(),
            "merge-slashes,trailing-slash",
            "the command line wins"
        );
    }

    #[test]
    fn route_paths_are_written_as_the_normal_paths_they_match() {
        let file = |normalization: &str, path: &str| -> FileConfig {
            toml::from_str(&format!(
                "path_normalization = \"{normalization}\"\n[[route]]\npath = \"{path}\""
            ))
            .unwrap()
        };
        let a = args("http://127.0.0.1:3000");
        for (normalization, path, says) in [
            (
                "rfc3986,merge-slashes",
                "/v1//charges",
                "write it /v1/charges",
            ),
            ("rfc3986", "/v1/%63harges", "write it /v1/charges"),
            (
                "rfc3986",
                "/v1/orders/{id}/./capture",
                "write it /v1/orders/{id}/capture",
            ),
            ("rfc3986", "/v1/a%2fb", "write it /v1/a%2Fb"),
            ("rfc3986", "/../v1", "climbs above the root"),
            (
                "rfc3986,lowercase",
                "/V1/Orders/{Id}",
                "write it /v1/orders/{Id}",
            ),
            (
                "rfc3986,trailing-slash",
                "/v1/charges/",
                "write it /v1/charges",
            ),
        ] {
            let err = GatewayConfig::merge(&a, file(normalization, path)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&format!("route[0] ({path})"))
                    && text.contains("never matches")
                    && text.contains(says),
                "{normalization} {path}: {text}"
            );
        }
        for (normalization, path) in [
            ("rfc3986,merge-slashes", "/v1/orders/{id}/capture"),
            ("rfc3986,merge-slashes", "/v1/charges/"),
            ("rfc3986,merge-slashes", "/files/{*rest}"),
            ("rfc3986,merge-slashes", "/v1/a%2Fb"),
            ("none", "/V1//%63harges/./"),
        ] {
            let c = GatewayConfig::merge(&a, file(normalization, path));
            assert!(c.is_ok(), "{normalization} {path}: {c:?}");
        }
    }

    #[test]
    fn path_normalization_refuses_what_it_cannot_use() {
        let mut cli = args("http://127.0.0.1:3000");
        for (list, says) in [
            (
                vec!["rfc3986", "dedupe"],
                "\"dedupe\" is not a normalisation",
            ),
            (vec!["none", "rfc3986"], "cannot be given with other items"),
            (vec![""], "the list is empty"),
        ] {
            cli.path_normalization = Some(list.iter().map(|s| s.to_string()).collect());
            let err = GatewayConfig::merge(&cli, FileConfig::default()).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("path_normalization") && text.contains(says),
                "{list:?}: {text}"
            );
        }
        let file: FileConfig = toml::from_str("path_normalization = []").unwrap();
        let err = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap_err();
        assert!(err.to_string().contains("the list is empty"), "{err}");
    }

    #[test]
    fn missing_upstream_is_an_error_that_says_how() {
        let err = GatewayConfig::merge(&ServeArgs::default(), FileConfig::default()).unwrap_err();
        assert!(err.to_string().contains("--upstream"), "{err}");
    }

    #[test]
    fn command_line_wins_over_file() {
        let file: FileConfig = toml::from_str(
            r#"
            upstream = "http://127.0.0.1:1"
            ttl = "1h"
            lease = "5s"
            body_limit = "64KiB"
            response_limit = 2097152
            keyed_methods = ["POST"]
            "#,
        )
        .unwrap();
        let mut a = args("http://127.0.0.1:2/api/");
        a.ttl = Some(Duration::from_secs(60));
        let c = GatewayConfig::merge(&a, file).unwrap();
        assert_eq!(c.upstream.authority.as_str(), "127.0.0.1:2");
        assert_eq!(c.upstream.base_path, "/api");
        assert_eq!(c.ttl, Duration::from_secs(60));
        assert_eq!(c.lease, Duration::from_secs(5));
        assert_eq!(c.body_limit, 64 * 1024);
        assert_eq!(c.response_limit, 2 * 1024 * 1024);
        assert_eq!(c.keyed_methods, vec![Method::POST]);
    }

    #[test]
    fn file_routes_are_checked() {
        let file: FileConfig = toml::from_str(
            r#"
            upstream = "http://127.0.0.1:1"
            [[route]]
            method = "post"
            path = "/v1/orders/{id}/capture"
            require_key = true
            ttl = "1h"
            ignore = ["/client_sent_at"]
            store_headers = ["X-Order-Id"]
            "#,
        )
        .unwrap();
        let c = GatewayConfig::merge(&ServeArgs::default(), file).unwrap();
        let r = &c.routes[0];
        assert_eq!(r.method, Some(Method::POST));
        assert_eq!(r.require_key, Some(true));
        assert_eq!(r.ttl, Some(Duration::from_secs(3600)));
        assert_eq!(r.store_headers, vec![HeaderName::from_static("x-order-id")]);
        assert!(r.matches(&Method::POST, "/v1/orders/9/capture"));

        let bad: FileConfig = toml::from_str(
            r#"
            upstream = "http://127.0.0.1:1"
            [[route]]
            path = "/x"
            ignore = ["no-slash"]
            "#,
        )
        .unwrap();
        assert!(GatewayConfig::merge(&ServeArgs::default(), bad).is_err());
    }

    #[test]
    fn unknown_file_keys_are_rejected() {
        assert!(toml::from_str::<FileConfig>("upstreem = \"x\"").is_err());
    }

    #[test]
    fn upstream_must_be_plain_http() {
        assert!(Upstream::parse("https://example.test").is_err());
        assert!(Upstream::parse("127.0.0.1:3000").is_err());
        let incoming: Uri = "/v1/x?a=1".parse().unwrap();
        let u = Upstream::parse("http://127.0.0.1:3000").unwrap();
        assert_eq!(
            u.uri_for(&incoming).unwrap().to_string(),
            "http://127.0.0.1:3000/v1/x?a=1"
        );
        let u = Upstream::parse("http://127.0.0.1:3000/api/").unwrap();
        assert_eq!(
            u.uri_for(&incoming).unwrap().to_string(),
            "http://127.0.0.1:3000/api/v1/x?a=1"
        );
        let absolute: Uri = "http://elsewhere.test/v1/y".parse().unwrap();
        assert_eq!(
            u.uri_for(&absolute).unwrap().to_string(),
            "http://127.0.0.1:3000/api/v1/y"
        );
    }

    #[test]
    fn admin_bare_port_binds_loopback() {
        assert_eq!(
            parse_admin_addr("9091").unwrap(),
            "127.0.0.1:9091".parse().unwrap()
        );
        assert_eq!(
            parse_admin_addr("[::1]:9091").unwrap(),
            "[::1]:9091".parse().unwrap()
        );
    }

    fn with_token_file(contents: &str) -> (tempfile::TempDir, ServeArgs) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-token");
        std::fs::write(&path, contents).unwrap();
        let a = ServeArgs {
            admin_token_file: Some(path),
            ..args("http://127.0.0.1:1")
        };
        (dir, a)
    }

    #[test]
    fn admin_token_file_is_read_without_its_line_end() {
        for contents in ["s3cret\n", "s3cret\r\n", "s3cret"] {
            let (_dir, a) = with_token_file(contents);
            let c = GatewayConfig::merge(&a, FileConfig::default()).unwrap();
            assert_eq!(c.admin_token.as_deref(), Some("s3cret"), "{contents:?}");
        }
        // The TOML key names the file too.
        let (dir, _) = with_token_file("from-toml\n");
        let path = dir.path().join("admin-token");
        let file: FileConfig = toml::from_str(&format!(
            "admin_token_file = {:?}",
            path.display().to_string()
        ))
        .unwrap();
        let c = GatewayConfig::merge(&args("http://127.0.0.1:1"), file).unwrap();
        assert_eq!(c.admin_token.as_deref(), Some("from-toml"));
    }

    #[test]
    fn admin_token_and_token_file_together_are_refused() {
        let (_dir, a) = with_token_file("one\n");
        let a = ServeArgs {
            admin_token: Some("two".into()),
            ..a
        };
        let e = GatewayConfig::merge(&a, FileConfig::default()).unwrap_err();
        assert!(e.to_string().contains("admin_token_file"), "{e}");
        // Wherever each comes from.
        let (_dir, a) = with_token_file("one\n");
        let file: FileConfig = toml::from_str("admin_token = \"two\"").unwrap();
        let e = GatewayConfig::merge(&a, file).unwrap_err();
        assert!(e.to_string().contains("admin_token_file"), "{e}");
    }

    #[test]
    fn empty_admin_token_is_refused() {
        for token in ["", "   ", "\t"] {
            let a = ServeArgs {
                admin_token: Some(token.into()),
                ..args("http://127.0.0.1:1")
            };
            let e = GatewayConfig::merge(&a, FileConfig::default()).unwrap_err();
            assert!(e.to_string().contains("empty"), "{token:?}: {e}");
        }
        for contents in ["", "\n", "  \n\n", "\r\n"] {
            let (_dir, a) = with_token_file(contents);
            let e = GatewayConfig::merge(&a, FileConfig::default()).unwrap_err();
            assert!(e.to_string().contains("empty"), "{contents:?}: {e}");
        }
        // A token a bearer header cannot carry as it is would lock every caller out.
        for token in [" s3cret", "s3cret ", "s3c\u{7f}ret", "sécret"] {
            let a = ServeArgs {
                admin_token: Some(token.into()),
                ..args("http://127.0.0.1:1")
            };
            assert!(
                GatewayConfig::merge(&a, FileConfig::default()).is_err(),
                "{token:?}"
            );
        }
    }

    #[test]
    fn unreadable_admin_token_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = ServeArgs {
            admin_token_file: Some(dir.path().join("missing")),
            ..args("http://127.0.0.1:1")
        };
        let e = GatewayConfig::merge(&a, FileConfig::default()).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!(parse_byte_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_byte_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_byte_size("65536"), Ok(65536));
        assert_eq!(parse_byte_size("2MB"), Ok(2_000_000));
        assert!(parse_byte_size("lots").is_err());
        assert!(parse_byte_size("1PiB").is_err());
    }
}
