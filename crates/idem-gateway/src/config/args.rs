//! The settings of `idem serve` as given: one declaration for the command line, the
//! `IDEM_*` environment (both read by clap) and the `--config` TOML file (read by serde),
//! so that a setting has one name, one type and one help text in all three.
//!
//! The file takes each setting under its flag's name with `_` for `-`, and some in a
//! second form: a byte count as a number or a string with a unit (`"1MiB"`), a list as
//! an array or one comma-separated string (`tenant_header`, `path_normalization`), the
//! release statuses as numbers (`[409, 503]`, `[]` for none). Values are parsed here,
//! by the parsers of [`super::values`]; what they mean together is checked when they
//! are resolved ([`GatewayConfig`](super::GatewayConfig)).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::choices;
use super::rules::{RouteRule, TenantRule};
use super::secrets::TenantSecret;
use super::toml_form;
use super::upstream::UpstreamProtocol;
use super::values::{parse_byte_size, parse_duration};

/// Declares the settings struct and its layering from one list of fields, so that a
/// new setting is one field: how it layers follows from its type (`Layered`).
macro_rules! settings {
    (
        $(#[$($meta:tt)*])*
        pub struct $name:ident {
            $(
                $(#[$($field_meta:tt)*])*
                pub $field:ident: $ty:ty,
            )*
        }
    ) => {
        $(#[$($meta)*])*
        pub struct $name {
            $(
                $(#[$($field_meta)*])*
                pub $field: $ty,
            )*
        }

        impl $name {
            /// These settings layered over `under`'s, each by its type's rule
            /// (`Layered`): a value given here wins, else the one given there; a switch
            /// (`require_key`, …) is on when either turns it on; routes and tenant
            /// tables, which come from the file alone, replace `under`'s only when there
            /// are any.
            pub fn over(self, under: $name) -> $name {
                $name {
                    $($field: Layered::over(self.$field, under.$field),)*
                }
            }
        }
    };
}

/// How one setting given in a layer (the command line, the environment) stands over
/// the same setting in the layer beneath (the file).
pub trait Layered {
    /// `self` over `under`.
    fn over(self, under: Self) -> Self;
}

/// A value: the upper one when given.
impl<T> Layered for Option<T> {
    fn over(self, under: Self) -> Self {
        self.or(under)
    }
}

/// A switch: on when either layer turns it on (a flag cannot be turned off).
impl Layered for bool {
    fn over(self, under: Self) -> Self {
        self || under
    }
}

/// Tables (`[[route]]`, `[[tenant]]`): the upper layer's when it has any.
impl<T> Layered for Vec<T> {
    fn over(self, under: Self) -> Self {
        if self.is_empty() { under } else { self }
    }
}

settings! {
    /// `idem serve`. Options left out here fall back to `--config`, then to the defaults.
    #[derive(Debug, Clone, Args, Default, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ServeArgs {
        /// TOML file with these settings and per-route rules.
        #[arg(long, env = "IDEM_CONFIG", value_name = "FILE")]
        #[serde(skip)]
        pub config: Option<PathBuf>,

        /// Base URL of the API to protect, e.g. http://127.0.0.1:3000 (required).
        #[arg(long, env = "IDEM_UPSTREAM", value_name = "URL")]
        pub upstream: Option<String>,

        /// Address to listen on [default: 127.0.0.1:8080].
        #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
        pub listen: Option<String>,

        /// Record store: memory:// (memory://?max_entries=N), sqlite://FILE, postgres://…,
        /// redis://… or redis+cluster://… [default: sqlite://idem.db].
        #[arg(long, env = "IDEM_STORE", value_name = "URL", hide_env_values = true)]
        pub store: Option<String>,

        /// Connections in the SQL stores' pool [default: the store's own, 8 for SQLite, 10
        /// for PostgreSQL].
        #[arg(long, env = "IDEM_STORE_POOL", value_name = "N")]
        pub store_pool: Option<u32>,

        /// Where this gateway's records live in a shared store: the SQL table NAME_records,
        /// Redis keys under NAME: [default: idem]. Gateways in front of different APIs on one
        /// store need different names; gateways in front of the same API, the same one.
        #[arg(long, env = "IDEM_STORE_NAMESPACE", value_name = "NAME")]
        pub store_namespace: Option<String>,

        /// Use the store's schema as it is: create no SQLite file or table and run no
        /// migration; a store without this build's schema stops the start (run `idem
        /// migrate` first). In the file: `migrate = false`.
        #[arg(long, env = "IDEM_NO_MIGRATE")]
        #[serde(rename = "migrate", deserialize_with = "toml_form::inverted")]
        pub no_migrate: bool,

        /// Admin listener address (health, readiness, metrics, keys); off unless given. A bare
        /// port binds to 127.0.0.1.
        #[arg(long, env = "IDEM_ADMIN", value_name = "ADDR")]
        pub admin: Option<String>,

        /// Bearer token that the admin listener requires (all but /healthz and /readyz).
        #[arg(
            long,
            env = "IDEM_ADMIN_TOKEN",
            value_name = "TOKEN",
            hide_env_values = true
        )]
        pub admin_token: Option<String>,

        /// A file holding the admin bearer token, so it stays out of the process's arguments
        /// and environment; a trailing line end is dropped. Not with --admin-token.
        #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE", value_name = "PATH")]
        pub admin_token_file: Option<PathBuf>,

        /// Answer 400 to a keyed method that carries no Idempotency-Key.
        #[arg(long, env = "IDEM_REQUIRE_KEY")]
        pub require_key: bool,

        /// How long records live, counted from the first request: a completed record is
        /// replayed until then; one in progress lives at least until its lease lapses
        /// [default: 24h].
        #[arg(long, env = "IDEM_TTL", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub ttl: Option<Duration>,

        /// After a completed record's TTL, how long a compact tombstone of it (no body, no
        /// headers) answers a retry with 410 key-expired instead of executing it again;
        /// 0s keeps none, and a retry after the TTL executes again [default: 0s].
        #[arg(long, env = "IDEM_TOMBSTONE_TTL", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub tombstone_ttl: Option<Duration>,

        /// How long an attempt holds its key without a heartbeat [default: 60s].
        #[arg(long, env = "IDEM_LEASE", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub lease: Option<Duration>,

        /// The longest a duplicate of an in-progress request waits for its answer
        /// (`Prefer: wait=N`, or a route's `conflict_wait`) before it gets 409; never
        /// longer than the lease; 0s turns waiting off [default: 30s].
        #[arg(long, env = "IDEM_MAX_WAIT", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub max_wait: Option<Duration>,

        /// The most duplicates that wait at once; beyond it a duplicate gets 409 at once
        /// [default: 1024].
        #[arg(long, env = "IDEM_MAX_WAITERS", value_name = "N")]
        pub max_waiters: Option<usize>,

        /// How long to wait for the upstream's whole answer [default: 60s].
        #[arg(long, env = "IDEM_UPSTREAM_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub upstream_timeout: Option<Duration>,

        /// HTTP spoken to the upstream: http1; http2 (ALPN h2 over TLS, h2c with prior
        /// knowledge on http://); auto (what ALPN picks over TLS, HTTP/1.1 on http://)
        /// [default: http1].
        #[arg(long, env = "IDEM_UPSTREAM_PROTOCOL", value_enum)]
        pub upstream_protocol: Option<UpstreamProtocol>,

        /// PEM file of the CA certificates that an https:// upstream's certificate must chain
        /// to, in place of the system's roots [default: the system's roots].
        #[arg(long, env = "IDEM_UPSTREAM_CA", value_name = "FILE")]
        pub upstream_ca: Option<PathBuf>,

        /// Largest keyed request body buffered for fingerprinting, e.g. 1MiB, 512KiB, 65536
        /// [default: 1MiB].
        #[arg(long, env = "IDEM_BODY_LIMIT", value_name = "BYTES", value_parser = parse_byte_size)]
        #[serde(deserialize_with = "toml_form::bytes")]
        pub body_limit: Option<usize>,

        /// Largest keyed answer recorded, e.g. 8MiB; a larger answer from the upstream is
        /// replaced by a recorded 502 `upstream-answer-too-large` problem [default: 8MiB].
        #[arg(long, env = "IDEM_RESPONSE_LIMIT", value_name = "BYTES", value_parser = parse_byte_size)]
        #[serde(deserialize_with = "toml_form::bytes")]
        pub response_limit: Option<usize>,

        /// Headers that name the tenant together, in order, e.g.
        /// Authorization,Stripe-Account: the stored tenant is an HMAC-SHA256 of their names
        /// and values under the tenant secret [default: Authorization]. They must stay the
        /// same across a client's retries: behind rotating access tokens, name a header that
        /// carries the authenticated principal.
        #[arg(
            long,
            env = "IDEM_TENANT_HEADER",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub tenant_header: Option<Vec<String>>,

        /// Answer 401 `missing-tenant` to a keyed request that carries none of the tenant
        /// headers, instead of keying it as `anonymous`.
        #[arg(long, env = "IDEM_REQUIRE_TENANT")]
        pub require_tenant: bool,

        /// File holding the tenant secret (at least 32 bytes; surrounding whitespace is
        /// trimmed). IDEM_TENANT_SECRET may hold the secret itself instead [default: the
        /// secret the store keeps, generated on its first use].
        #[arg(long, env = "IDEM_TENANT_SECRET_FILE", value_name = "PATH")]
        pub tenant_secret_file: Option<PathBuf>,

        /// Where a keyed request's tenant comes from, in order: `jwt` (the verified bearer
        /// token's issuer and claims, which a refreshed token keeps), `headers` (a keyed
        /// digest of --tenant-header); `jwt,headers` names a request without a bearer JWT
        /// by its headers [default: headers].
        #[arg(
            long,
            env = "IDEM_TENANT_FROM",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub tenant_from: Option<Vec<String>>,

        /// At most this many keyed requests of one tenant in progress at once on this
        /// instance; the excess is answered 429 `too-many-in-flight` with Retry-After before
        /// anything is read or reserved. Requests without a tenant share `anonymous`'s
        /// [default: 0, no cap].
        #[arg(long, env = "IDEM_TENANT_MAX_IN_FLIGHT", value_name = "N")]
        pub tenant_max_in_flight: Option<u64>,

        /// At most this rate of new keys per tenant, `RATE/UNIT[,BURST]` (`10/s`,
        /// `600/min,50`); a new key beyond it is answered 429 `key-rate-exceeded` with
        /// Retry-After and released. Shared by every instance on a PostgreSQL or Redis store,
        /// per instance on memory and SQLite; replays are not counted [default: none].
        #[arg(long, env = "IDEM_TENANT_KEY_RATE", value_name = "RATE")]
        pub tenant_key_rate: Option<String>,

        /// How many of the busiest tenants `/metrics` counts keyed requests for
        /// (`idem_tenant_keyed_requests_total`); 0 for none [default: 10].
        #[arg(long, env = "IDEM_TENANT_METRICS", value_name = "N")]
        pub tenant_metrics: Option<u64>,

        /// JWKS file of the public keys (RS256, ES256, EdDSA) bearer tokens are signed with;
        /// read again when a token names a key it lacks.
        #[arg(long, env = "IDEM_JWT_JWKS_FILE", value_name = "PATH")]
        pub jwt_jwks_file: Option<PathBuf>,

        /// URL of the issuer's JWKS (https://, or http:// on loopback): fetched at start,
        /// when a token names a key it lacks, and every --jwt-jwks-refresh.
        #[arg(long, env = "IDEM_JWT_JWKS_URL", value_name = "URL")]
        pub jwt_jwks_url: Option<String>,

        /// How often the JWKS URL is fetched again [default: 5m].
        #[arg(long, env = "IDEM_JWT_JWKS_REFRESH", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub jwt_jwks_refresh: Option<Duration>,

        /// File holding the HS256 secret of bearer tokens (at least 32 bytes; surrounding
        /// whitespace trimmed).
        #[arg(long, env = "IDEM_JWT_HS256_SECRET_FILE", value_name = "PATH")]
        pub jwt_hs256_secret_file: Option<PathBuf>,

        /// The `iss` every bearer token must carry [default: any].
        #[arg(long, env = "IDEM_JWT_ISSUER", value_name = "ISSUER")]
        pub jwt_issuer: Option<String>,

        /// Audiences a bearer token's `aud` must name one of [default: any].
        #[arg(
            long,
            env = "IDEM_JWT_AUDIENCE",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub jwt_audience: Option<Vec<String>>,

        /// The claims that name the tenant, in order: names (`sub`, `client_id`) or JSON
        /// pointers (`/org/id`) [default: sub].
        #[arg(
            long,
            env = "IDEM_JWT_CLAIMS",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub jwt_claims: Option<Vec<String>>,

        /// Leeway for a bearer token's `exp` and `nbf` [default: 60s].
        #[arg(long, env = "IDEM_JWT_LEEWAY", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub jwt_leeway: Option<Duration>,

        /// File of the keys recorded answers are sealed with (SPEC S17): one `id:<64 hex
        /// digits>` per line, the first sealing new answers, every one opening its own; not
        /// readable by others than its owner [default: answers are stored in plain text].
        #[arg(long, env = "IDEM_RECORD_KEY_FILE", value_name = "PATH")]
        pub record_key_file: Option<PathBuf>,

        /// With --record-key-file: replay answers the store holds unsealed (recorded before
        /// sealing was turned on) while they age out, instead of refusing them with 500
        /// `replay-unavailable`. A migration setting: anyone who can write the store can
        /// then plant a plain answer in a sealed record.
        #[arg(long, env = "IDEM_READ_UNSEALED_RECORDS")]
        pub read_unsealed_records: bool,

        /// The secret itself, from `IDEM_TENANT_SECRET` only: never a flag, so that it
        /// stays out of process listings.
        #[arg(skip = TenantSecret::from_env())]
        #[serde(skip)]
        pub tenant_secret: Option<TenantSecret>,

        /// Scope of a key: public = (tenant, endpoint, key), internal = (tenant, key)
        /// [default: public].
        #[arg(long, env = "IDEM_SCOPE", value_parser = choices::scope())]
        pub scope: Option<idem_core::ScopeMode>,

        /// The dialect of the gateway's own answers (a key reused with another payload, a
        /// request in progress, a missing key…): ietf (problem details, 422), stripe (400
        /// idempotency_error), acp (422 idempotency_conflict) or ucp (409); a route may
        /// name its own [default: ietf].
        #[arg(long, env = "IDEM_PROFILE", value_parser = choices::profile())]
        pub profile: Option<idem_core::Profile>,

        /// Methods that take an Idempotency-Key [default: POST,PATCH].
        #[arg(
            long,
            env = "IDEM_KEYED_METHODS",
            value_name = "LIST",
            value_delimiter = ','
        )]
        pub keyed_methods: Option<Vec<String>>,

        /// Upstream statuses that release the key (the answer passes through unrecorded and
        /// a retry executes again) instead of being recorded; 4xx and 5xx only, or `none`
        /// [default: 400,401,403,404,405,408,409,413,415,422,429,503].
        #[arg(
            long,
            env = "IDEM_RELEASE_STATUSES",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::statuses")]
        pub release_statuses: Option<Vec<String>>,

        /// gRPC statuses (names or numbers) that release a gRPC call's key instead of being
        /// recorded, or `none`
        /// [default: INVALID_ARGUMENT,PERMISSION_DENIED,RESOURCE_EXHAUSTED,ABORTED,UNAVAILABLE,UNAUTHENTICATED].
        #[arg(
            long,
            env = "IDEM_GRPC_RELEASE_CODES",
            value_name = "LIST",
            value_delimiter = ','
        )]
        pub grpc_release_codes: Option<Vec<String>>,

        /// How request paths are normalised before route matching, scoping and forwarding
        /// (the upstream receives the normalised path): rfc3986 (RFC 3986 §6.2.2: unreserved
        /// escapes decoded, dot segments removed), merge-slashes, reject-ambiguous (refuse
        /// %2F, %5C, %3B, space-padded segments, `..;` and characters NFKC changes), and the
        /// opt-in trailing-slash and lowercase; or none. A path that cannot be normalised is
        /// a 400 `invalid-path` [default: rfc3986,merge-slashes,reject-ambiguous].
        #[arg(
            long,
            env = "IDEM_PATH_NORMALIZATION",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub path_normalization: Option<Vec<String>>,

        /// How `[[route]]` templates match normalised paths: ignore-case (ASCII letters),
        /// ignore-trailing-slash; or exact. `;` path parameters are never matched
        /// [default: ignore-case,ignore-trailing-slash].
        #[arg(
            long,
            env = "IDEM_ROUTE_MATCHING",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub route_matching: Option<Vec<String>>,

        /// How long a client may take to send a request's headers, counted from when its
        /// connection is ready for the next request (so an idle keep-alive connection is
        /// closed after it too), and then a keyed request's body (408 after it, nothing
        /// reserved); a client whose reading stalls that long is disconnected too; 0s turns
        /// all three off [default: 30s].
        #[arg(long, env = "IDEM_CLIENT_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub client_timeout: Option<Duration>,

        /// Most client connections the proxy holds open; at it, it accepts no more until one
        /// closes [default: derived from the open-file limit, which is raised to its hard
        /// value: (limit - store connections - 32 for the admin listener - 64) / 2].
        #[arg(long, env = "IDEM_MAX_CONNECTIONS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        pub max_connections: Option<u32>,

        /// Time between sweeps of expired records [default: 60s].
        #[arg(long, env = "IDEM_SWEEP_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub sweep_interval: Option<Duration>,

        /// Forward everything without Idempotency-Key handling: a plain reverse proxy, for
        /// measuring the layer's cost or as an emergency bypass.
        #[arg(long, env = "IDEM_PASSTHROUGH")]
        #[serde(skip)]
        pub passthrough: bool,

        /// Longest wait at shutdown for in-flight requests to finish and record [default: the
        /// upstream timeout plus 5s].
        #[arg(long, env = "IDEM_SHUTDOWN_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub shutdown_timeout: Option<Duration>,

        /// Export OpenTelemetry traces over OTLP/HTTP to the collector at this base URL,
        /// e.g. http://127.0.0.1:4318 (spans are posted to its /v1/traces): a span per
        /// request, with the store and upstream calls as its children. Given here, in
        /// IDEM_OTLP_ENDPOINT or as `otlp_endpoint`, it wins over OTEL_EXPORTER_OTLP_ENDPOINT,
        /// which is honoured otherwise [default: off].
        #[arg(long, env = "IDEM_OTLP_ENDPOINT", value_name = "URL")]
        pub otlp_endpoint: Option<String>,

        /// One line per request at info level (target `idem::access`): `on`, `off`, or the
        /// fraction of requests to log, at random (`0.1`) [default: on].
        #[arg(long, env = "IDEM_ACCESS_LOG", value_name = "on|off|FRACTION")]
        pub access_log: Option<String>,

        /// The header that carries the request id: taken from the client when well formed,
        /// else made; sent upstream, returned, logged [default: x-request-id].
        #[arg(long, env = "IDEM_REQUEST_ID_HEADER", value_name = "NAME")]
        pub request_id_header: Option<String>,

        /// Networks and addresses of the proxies in front of the gateway, e.g.
        /// 10.0.0.0/8,127.0.0.1: a connection from one of them may name its client in
        /// X-Forwarded-For, which the access log's `client` then shows (the rightmost
        /// untrusted entry) [default: none, the client is the connection's peer].
        #[arg(
            long,
            env = "IDEM_TRUSTED_PROXIES",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub trusted_proxies: Option<Vec<String>>,

        /// Headers only the trusted proxies may set (an identity the ingress asserts, such
        /// as X-User-Id for --tenant-header): removed from the requests of every other peer
        /// before the tenant is named or anything is forwarded. Needs --trusted-proxies
        /// [default: none].
        #[arg(
            long,
            env = "IDEM_TRUSTED_HEADERS",
            value_name = "LIST",
            value_delimiter = ','
        )]
        #[serde(deserialize_with = "toml_form::list")]
        pub trusted_headers: Option<Vec<String>>,

        /// Most streams (requests) one HTTP/2 client connection may have open at once
        /// [default: 100].
        #[arg(long, env = "IDEM_HTTP2_MAX_CONCURRENT_STREAMS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        pub http2_max_concurrent_streams: Option<u32>,

        /// Largest header list an HTTP/2 request may carry (names and values, plus 32 bytes
        /// a field), e.g. 32KiB; a larger one is refused [default: 32KiB].
        #[arg(long, env = "IDEM_HTTP2_MAX_HEADER_LIST_SIZE", value_name = "BYTES", value_parser = parse_byte_size)]
        #[serde(deserialize_with = "toml_form::bytes")]
        pub http2_max_header_list_size: Option<usize>,

        /// How often an HTTP/2 client connection is pinged, so that a peer that vanished is
        /// found out; 0s for never [default: 30s].
        #[arg(long, env = "IDEM_HTTP2_KEEPALIVE_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub http2_keepalive_interval: Option<Duration>,

        /// How long an HTTP/2 ping may go unanswered before the connection is closed
        /// [default: 20s].
        #[arg(long, env = "IDEM_HTTP2_KEEPALIVE_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
        #[serde(deserialize_with = "toml_form::duration")]
        pub http2_keepalive_timeout: Option<Duration>,

        /// Most bytes of buffered answers (replays, recorded answers) one HTTP/2 client
        /// connection may hold while its client has not read them, e.g. 16MiB; an answer
        /// beyond it is a 503 `replay-unavailable` to retry with the same key (a
        /// connection's first answer always fits) [default: 16MiB].
        #[arg(long, env = "IDEM_HTTP2_ANSWER_BUDGET", value_name = "BYTES", value_parser = parse_byte_size)]
        #[serde(deserialize_with = "toml_form::bytes")]
        pub http2_answer_budget: Option<usize>,

        /// PEM file with the proxy listener's TLS certificate chain (its own certificate
        /// first): the listener then speaks HTTPS only, HTTP/2 or HTTP/1.1 by ALPN, TLS 1.2
        /// and 1.3; read again on SIGHUP. With --tls-key [default: plain TCP].
        #[arg(long, env = "IDEM_TLS_CERT", value_name = "FILE", requires = "tls_key")]
        pub tls_cert: Option<PathBuf>,

        /// PEM file with the private key of --tls-cert.
        #[arg(long, env = "IDEM_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
        pub tls_key: Option<PathBuf>,

        /// PEM file of the CA certificates a client certificate must chain to: clients may
        /// then present one (mutual TLS), and `--tenant-from cert` names the tenant by it.
        /// A client without one is still served; one whose certificate does not verify
        /// fails the handshake. With --tls-cert [default: no client certificates].
        #[arg(long, env = "IDEM_TLS_CLIENT_CA", value_name = "FILE")]
        pub tls_client_ca: Option<PathBuf>,

        /// Which name of a verified client certificate names the tenant: uri (the first
        /// URI SAN, a SPIFFE id say), dns, email, or subject (the whole subject name)
        /// [default: uri].
        #[arg(
            long,
            env = "IDEM_TENANT_CERT_NAME",
            value_name = "uri|dns|email|subject"
        )]
        pub tenant_cert_name: Option<String>,

        /// PEM file with the admin listener's TLS certificate chain; read again on SIGHUP.
        /// With --admin-tls-key [default: plain TCP].
        #[arg(
            long,
            env = "IDEM_ADMIN_TLS_CERT",
            value_name = "FILE",
            requires = "admin_tls_key"
        )]
        pub admin_tls_cert: Option<PathBuf>,

        /// PEM file with the private key of --admin-tls-cert.
        #[arg(
            long,
            env = "IDEM_ADMIN_TLS_KEY",
            value_name = "FILE",
            requires = "admin_tls_cert"
        )]
        pub admin_tls_key: Option<PathBuf>,

        /// Per-route rules (`[[route]]` tables, the file only), first match wins.
        #[arg(skip)]
        pub route: Vec<RouteRule>,

        /// Per-tenant limits (`[[tenant]]` tables, the file only).
        #[arg(skip)]
        pub tenant: Vec<TenantRule>,
    }
}
