//! Every setting of `idem serve`, declared once: its flag, `IDEM_*` variable (both read
//! by clap), key in the `--config` TOML file (read by serde), type and help text; what
//! it resolves to and how, its line in `check-config`'s output, and whether a reload
//! applies it (see [`super::declare`] for the form of a declaration).
//!
//! The file takes each setting under its flag's name with `_` for `-`, and some in a
//! second form: a byte count as a number or a string with a unit (`"1MiB"`), a list as
//! an array or one comma-separated string (`tenant_header`, `path_normalization`), the
//! release statuses as numbers (`[409, 503]`, `[]` for none). Values are parsed here,
//! by the parsers of [`super::values`]; what they mean together is checked when they
//! are resolved, by the resolvers named here ([`super::resolve`] and the modules of
//! each concern). The settings are declared in the order `check-config` prints them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use http::{HeaderName, Method};
use idem_core::{DEFAULT_BODY_LIMIT, DEFAULT_LEASE, DEFAULT_TTL, RecordKeys, ScopeMode, TenantKey};
use idem_tower::{DEFAULT_RESPONSE_LIMIT, GrpcReleaseCodes, HeaderChoice, ReleaseStatuses};
use serde::Deserialize;

use super::declare::settings;
use super::jwt::{self, JwtSettings, TenantSource};
use super::print::{duration, grpc_codes, list_of, path, quoted, shown, statuses, strings};
use super::resolve::{self, positive};
use super::rules::{RouteRule, TenantRule};
use super::secrets::{TenantSecret, admin_token, record_keys, tenant_key};
use super::tenants::{self, TenantLimits};
use super::upstream::{self, Upstream, UpstreamProtocol};
use super::values::{parse_byte_size, parse_duration};
use super::{DEFAULT_STORE, DEFAULT_SWEEP_INTERVAL, DEFAULT_UPSTREAM_TIMEOUT};
use super::{choices, listeners, print, publish, routes, toml_form, values};
use crate::listener::{CertName, Http2Limits, TlsFiles};
use crate::path::PathNormalization;
use crate::route::{Route, RouteMatching};
use crate::store::StoreOptions;

settings! {
    /// `idem serve`. Options left out here fall back to `--config`, then to the defaults.
    #[derive(Debug, Clone, Args, Default, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ServeArgs;

    /// Everything `idem serve` runs with: [`ServeArgs`] resolved, checked and completed
    /// with the defaults.
    #[derive(Debug, Clone)]
    pub struct GatewayConfig;

    /// TOML file with these settings and per-route rules.
    #[arg(long, env = "IDEM_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>, start;

    /// Base URL of the API to protect, e.g. http://127.0.0.1:3000 (required).
    #[arg(long, env = "IDEM_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>, live => upstream: Upstream = upstream::resolve,
        print |c, _| shown(&c.upstream);

    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>, restart => listen: SocketAddr = resolve::listen,
        print |c, _| shown(c.listen);

    /// Record store: memory:// (memory://?max_entries=N), sqlite://FILE, postgres://…,
    /// redis://…, redis+cluster://… or mysql://… [default: sqlite://idem.db].
    #[arg(long, env = "IDEM_STORE", value_name = "URL", hide_env_values = true)]
    pub store: Option<String>, restart
        => store: String = |a| Ok(a.store.clone().unwrap_or_else(|| DEFAULT_STORE.to_owned())),
        print |c, _| quoted(&crate::store::redact(&c.store));

    /// Connections in the SQL stores' pool [default: the store's own, 8 for SQLite, 10
    /// for PostgreSQL].
    #[arg(long, env = "IDEM_STORE_POOL", value_name = "N")]
    pub store_pool: Option<u32>, restart => store_options: StoreOptions = resolve::store_options,
        print |c, _| c.store_options.pool.map(|n| n.to_string()).ok_or("the store's own default");

    /// Where this gateway's records live in a shared store: the SQL table NAME_records,
    /// Redis keys under NAME: [default: idem]. Gateways in front of different APIs on one
    /// store need different names; gateways in front of the same API, the same one.
    #[arg(long, env = "IDEM_STORE_NAMESPACE", value_name = "NAME")]
    pub store_namespace: Option<String>, restart => store_options,
        print |c, _| quoted(c.store_options.namespace.clone().unwrap_or_default().as_str());

    /// Use the store's schema as it is: create no SQLite file or table and run no
    /// migration; a store without this build's schema stops the start (run `idem
    /// migrate` first). In the file: `migrate = false`.
    #[arg(long, env = "IDEM_NO_MIGRATE")]
    #[serde(deserialize_with = "toml_form::inverted")]
    pub no_migrate: bool as "migrate", restart => store_options,
        print |c, _| (c.store_options.schema == idem_core::Schema::Migrate).to_string();

    /// Admin listener address (health, readiness, metrics, keys); off unless given. A bare
    /// port binds to 127.0.0.1.
    #[arg(long, env = "IDEM_ADMIN", value_name = "ADDR")]
    pub admin: Option<String>, restart => admin: Option<SocketAddr> = resolve::admin,
        print |c, _| c.admin.map(shown).ok_or("off");

    /// Bearer token that the admin listener requires (all but /healthz and /readyz); a
    /// reload puts a new one in force at once, and the old one is refused from then on.
    #[arg(long, env = "IDEM_ADMIN_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>, live => admin_token: Option<String> = admin_token,
        print print::admin_token;

    /// A file holding the admin bearer token, so it stays out of the process's arguments
    /// and environment; a trailing line end is dropped; read again on a reload. Not with
    /// --admin-token.
    #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>, live => admin_token,
        print |_, a| a.admin_token_file.as_deref().map(path).ok_or("none");

    /// Without an admin token, serve /keys (every tenant's records and recorded answers,
    /// and their deletion) and /reload to anyone who can reach the admin listener,
    /// instead of refusing them with 403 `admin-route-closed`; warned about at start.
    #[arg(long, env = "IDEM_ADMIN_OPEN")]
    pub admin_open: bool, live => admin_open: bool = |a| Ok(a.admin_open),
        print |c, _| c.admin_open.to_string();

    /// Answer 400 to a keyed method that carries no Idempotency-Key.
    #[arg(long, env = "IDEM_REQUIRE_KEY")]
    pub require_key: bool, live => require_key: bool = |a| Ok(a.require_key),
        print |c, _| c.require_key.to_string();

    /// The dialect of the gateway's own answers (a key reused with another payload, a
    /// request in progress, a missing key…): ietf (problem details, 422), stripe (400
    /// idempotency_error), acp (422 idempotency_conflict), ucp (409) or mcp (JSON-RPC
    /// tool calls keyed by the call in the body, answered with JSON-RPC errors); a
    /// route may name its own [default: ietf].
    #[arg(long, env = "IDEM_PROFILE", value_parser = choices::profile())]
    pub profile: Option<idem_core::Profile>, live
        => profile: idem_tower::Profile = |a| Ok(a.profile.unwrap_or_default()),
        print |c, _| quoted(c.profile.as_str());

    /// The header every answer to a keyed request publishes its record's lifetime in
    /// (whole seconds), or `off`; a route may name its own [default: the profile's,
    /// Idempotency-TTL under acp, none under the others].
    #[arg(long, env = "IDEM_RETENTION_HEADER", value_name = "NAME|off")]
    pub retention_header: Option<String>, live
        => retention_header: HeaderChoice = |a| publish::choice(a.retention_header.as_deref(), "retention_header"),
        print |c, _| print::print_choice(&c.retention_header);

    /// The header that marks a replayed answer [default: Idempotent-Replayed].
    #[arg(long, env = "IDEM_REPLAY_HEADER", value_name = "NAME")]
    pub replay_header: Option<String>, live
        => replay_header: Option<HeaderName> = publish::replay_header,
        print |c, _| c.replay_header.as_ref().map(shown).ok_or("the profile's: Idempotent-Replayed");

    /// A path (`/.well-known/idempotency`) where the proxy listener answers GET with a
    /// JSON document of each route's key header, methods, record lifetime and profile
    /// [default: off].
    #[arg(long, env = "IDEM_IDEMPOTENCY_DOCUMENT", value_name = "PATH")]
    pub idempotency_document: Option<String>, live
        => idempotency_document: Option<String> = publish::document_path,
        print |c, _| c.idempotency_document.as_deref().map(quoted).ok_or("off");

    /// How long records live, counted from the first request: a completed record is
    /// replayed until then; one in progress lives at least until its lease lapses
    /// [default: 24h].
    #[arg(long, env = "IDEM_TTL", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub ttl: Option<Duration>, live => ttl: Duration = |a| positive("ttl", a.ttl, DEFAULT_TTL),
        print |c, _| duration(c.ttl);

    /// After a completed record's TTL, how long a compact tombstone of it (no body, no
    /// headers) answers a retry with 410 key-expired instead of executing it again;
    /// 0s keeps none, and a retry after the TTL executes again [default: 0s].
    #[arg(long, env = "IDEM_TOMBSTONE_TTL", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub tombstone_ttl: Option<Duration>, live
        => tombstone_ttl: Duration = |a| Ok(a.tombstone_ttl.unwrap_or(Duration::ZERO)),
        print |c, _| duration(c.tombstone_ttl);

    /// How long an attempt holds its key without a heartbeat [default: 60s].
    #[arg(long, env = "IDEM_LEASE", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub lease: Option<Duration>, live
        => lease: Duration = |a| positive("lease", a.lease, DEFAULT_LEASE),
        print |c, _| duration(c.lease);

    /// The longest a duplicate of an in-progress request waits for its answer
    /// (`Prefer: wait=N`, or a route's `conflict_wait`) before it gets 409; never
    /// longer than the lease; 0s turns waiting off [default: 30s].
    #[arg(long, env = "IDEM_MAX_WAIT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub max_wait: Option<Duration>, live
        => max_wait: Duration = |a| Ok(a.max_wait.unwrap_or(idem_tower::DEFAULT_MAX_WAIT)),
        print |c, _| duration(c.max_wait);

    /// The most duplicates that wait at once; beyond it a duplicate gets 409 at once
    /// [default: 1024].
    #[arg(long, env = "IDEM_MAX_WAITERS", value_name = "N")]
    pub max_waiters: Option<usize>, live
        => max_waiters: usize = |a| Ok(a.max_waiters.unwrap_or(idem_tower::DEFAULT_MAX_WAITERS)),
        print |c, _| c.max_waiters.to_string();

    /// How long to wait for the upstream's whole answer [default: 60s].
    #[arg(long, env = "IDEM_UPSTREAM_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub upstream_timeout: Option<Duration>, live
        // Zero would time out every upstream call at once, leaving each keyed request's
        // record in progress until its lease lapsed.
        => upstream_timeout: Duration
            = |a| positive("upstream_timeout", a.upstream_timeout, DEFAULT_UPSTREAM_TIMEOUT),
        print |c, _| duration(c.upstream_timeout);

    /// HTTP spoken to the upstream: http1; http2 (ALPN h2 over TLS, h2c with prior
    /// knowledge on http://); auto (what ALPN picks over TLS, HTTP/1.1 on http://)
    /// [default: http1].
    #[arg(long, env = "IDEM_UPSTREAM_PROTOCOL", value_enum)]
    pub upstream_protocol: Option<UpstreamProtocol>, live
        => upstream_protocol: UpstreamProtocol = |a| Ok(a.upstream_protocol.unwrap_or_default()),
        print |c, _| quoted(&format!("{:?}", c.upstream_protocol).to_ascii_lowercase());

    /// PEM file of the CA certificates that an https:// upstream's certificate must chain
    /// to, in place of the system's roots [default: the system's roots].
    #[arg(long, env = "IDEM_UPSTREAM_CA", value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>, live
        => upstream_tls: Option<Arc<rustls::ClientConfig>> = upstream::tls,
        print |_, a| a.upstream_ca.as_deref().map(path).ok_or("the system's roots");

    /// Largest keyed request body buffered for fingerprinting, e.g. 1MiB, 512KiB, 65536
    /// [default: 1MiB].
    #[arg(long, env = "IDEM_BODY_LIMIT", value_name = "BYTES", value_parser = parse_byte_size)]
    #[serde(deserialize_with = "toml_form::bytes")]
    pub body_limit: Option<usize>, live
        => body_limit: usize = |a| Ok(a.body_limit.unwrap_or(DEFAULT_BODY_LIMIT)),
        print |c, _| c.body_limit.to_string();

    /// Largest keyed answer recorded, e.g. 8MiB; a larger answer from the upstream is
    /// replaced by a recorded 502 `upstream-answer-too-large` problem [default: 8MiB].
    #[arg(long, env = "IDEM_RESPONSE_LIMIT", value_name = "BYTES", value_parser = parse_byte_size)]
    #[serde(deserialize_with = "toml_form::bytes")]
    pub response_limit: Option<usize>, restart
        => response_limit: usize = |a| Ok(a.response_limit.unwrap_or(DEFAULT_RESPONSE_LIMIT)),
        print |c, _| c.response_limit.to_string();

    /// Headers that name the tenant together, in order, e.g.
    /// Authorization,Stripe-Account: the stored tenant is an HMAC-SHA256 of their names
    /// and values under the tenant secret [default: Authorization]. They must stay the
    /// same across a client's retries: behind rotating access tokens, name a header that
    /// carries the authenticated principal.
    #[arg(long, env = "IDEM_TENANT_HEADER", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub tenant_header: Option<Vec<String>>, live
        => tenant_headers: Vec<HeaderName> = resolve::tenant_headers,
        print |c, _| strings(c.tenant_headers.iter().map(|h| h.as_str()));

    /// Answer 401 `missing-tenant` to a keyed request that carries none of the tenant
    /// headers, instead of keying it as `anonymous`.
    #[arg(long, env = "IDEM_REQUIRE_TENANT")]
    pub require_tenant: bool, live => require_tenant: bool = |a| Ok(a.require_tenant),
        print |c, _| c.require_tenant.to_string();

    /// File holding the tenant secret (at least 32 bytes; surrounding whitespace is
    /// trimmed). IDEM_TENANT_SECRET may hold the secret itself instead [default: the
    /// secret the store keeps, generated on its first use].
    #[arg(long, env = "IDEM_TENANT_SECRET_FILE", value_name = "PATH")]
    pub tenant_secret_file: Option<PathBuf>, restart
        => tenant_key: Option<TenantKey>
            = |a| tenant_key(a.tenant_secret.as_ref(), a.tenant_secret_file.as_deref(), None),
        print print::tenant_secret_file;

    /// The secret itself, from `IDEM_TENANT_SECRET` only: never a flag, so that it
    /// stays out of process listings.
    #[arg(skip = TenantSecret::from_env())]
    #[serde(skip)]
    pub tenant_secret: Option<TenantSecret>, start;

    /// Where a keyed request's tenant comes from, in order: `jwt` (the verified bearer
    /// token's issuer and claims, which a refreshed token keeps), `headers` (a keyed
    /// digest of --tenant-header); `jwt,headers` names a request without a bearer JWT
    /// by its headers [default: headers].
    #[arg(long, env = "IDEM_TENANT_FROM", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub tenant_from: Option<Vec<String>>, live
        => tenant_from: Vec<TenantSource> = |a| jwt::parse_tenant_from(a.tenant_from.as_deref()),
        print |c, _| strings(c.tenant_from.iter().map(|s| s.as_str()));

    /// JWKS file of the public keys (RS256, ES256, EdDSA) bearer tokens are signed with;
    /// read again when a token names a key it lacks.
    #[arg(long, env = "IDEM_JWT_JWKS_FILE", value_name = "PATH")]
    pub jwt_jwks_file: Option<PathBuf>, live => jwt: Option<JwtSettings> = jwt::resolve,
        print print::jwt_jwks_file;

    /// URL of the issuer's JWKS (https://, or http:// on loopback): fetched at start,
    /// when a token names a key it lacks, and every --jwt-jwks-refresh.
    #[arg(long, env = "IDEM_JWT_JWKS_URL", value_name = "URL")]
    pub jwt_jwks_url: Option<String>, live => jwt, print print::jwt_jwks_url;

    /// How often the JWKS URL is fetched again [default: 5m].
    #[arg(long, env = "IDEM_JWT_JWKS_REFRESH", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub jwt_jwks_refresh: Option<Duration>, live => jwt, print print::jwt_jwks_refresh;

    /// The longest a keyed request waits for the JWKS to load when its token names a key
    /// the gateway lacks; past it the token is refused (401), and the load goes on for
    /// those that come after. One load goes on at a time, shared by every such request
    /// [default: 5s].
    #[arg(long, env = "IDEM_JWT_JWKS_WAIT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub jwt_jwks_wait: Option<Duration>, live => jwt, print print::jwt_jwks_wait;

    /// File holding the HS256 secret of bearer tokens (at least 32 bytes; surrounding
    /// whitespace trimmed).
    #[arg(long, env = "IDEM_JWT_HS256_SECRET_FILE", value_name = "PATH")]
    pub jwt_hs256_secret_file: Option<PathBuf>, live => jwt,
        print |c, _| print::jwt(c, |j| {
            j.hs256_secret_file.as_deref().map(path).ok_or("none: HS256 tokens are refused")
        });

    /// The `iss` every bearer token must carry [default: any].
    #[arg(long, env = "IDEM_JWT_ISSUER", value_name = "ISSUER")]
    pub jwt_issuer: Option<String>, live => jwt,
        print |c, _| print::jwt(c, |j| j.issuer.as_deref().map(quoted).ok_or("any"));

    /// Audiences a bearer token's `aud` must name one of [default: any].
    #[arg(long, env = "IDEM_JWT_AUDIENCE", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub jwt_audience: Option<Vec<String>>, live => jwt,
        print |c, _| print::jwt(c, |j| list_of(&j.audiences).ok_or("any"));

    /// The claims that name the tenant, in order: names (`sub`, `client_id`) or JSON
    /// pointers (`/org/id`) [default: sub].
    #[arg(long, env = "IDEM_JWT_CLAIMS", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub jwt_claims: Option<Vec<String>>, live => jwt,
        print |c, _| print::jwt(c, |j| Ok(strings(&j.claims)));

    /// Leeway for a bearer token's `exp` and `nbf` [default: 60s].
    #[arg(long, env = "IDEM_JWT_LEEWAY", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub jwt_leeway: Option<Duration>, live => jwt,
        print |c, _| print::jwt(c, |j| Ok(duration(j.leeway)));

    /// At most this many keyed requests of one tenant in progress at once on this
    /// instance; the excess is answered 429 `too-many-in-flight` with Retry-After before
    /// anything is read or reserved. Requests without a tenant share `anonymous`'s
    /// [default: 0, no cap].
    #[arg(long, env = "IDEM_TENANT_MAX_IN_FLIGHT", value_name = "N")]
    pub tenant_max_in_flight: Option<u64>, live
        => tenant_max_in_flight: usize = |a| Ok(resolve::count(a.tenant_max_in_flight, 0)),
        print |c, _| c.tenant_max_in_flight.to_string();

    /// At most this rate of new keys per tenant, `RATE/UNIT[,BURST]` (`10/s`,
    /// `600/min,50`); a new key beyond it is answered 429 `key-rate-exceeded` with
    /// Retry-After and released. Shared by every instance on a PostgreSQL, MySQL or Redis
    /// store, per instance on memory and SQLite; replays are not counted [default: none].
    #[arg(long, env = "IDEM_TENANT_KEY_RATE", value_name = "RATE")]
    pub tenant_key_rate: Option<String>, live
        => tenant_key_rate: Option<idem_core::KeyRate> = resolve::tenant_key_rate,
        print |c, _| c.tenant_key_rate.map(shown).ok_or("none: new keys are not limited");

    /// At most this rate of new keys, `RATE/UNIT[,BURST]`, of all the tenants no verified
    /// source names, together: those named by --tenant-header (unless only the trusted
    /// proxies may set every one of them, --trusted-headers) and `anonymous`. A client
    /// can make up a tenant per request with headers, so the limits per tenant do not
    /// bound it; this does. A new key beyond it is answered 429 `key-rate-exceeded` and
    /// released. Per instance, whatever the store [default: none].
    #[arg(long, env = "IDEM_UNVERIFIED_KEY_RATE", value_name = "RATE")]
    pub unverified_key_rate: Option<String>, live
        => unverified_key_rate: Option<idem_core::KeyRate> = resolve::unverified_key_rate,
        print |c, _| c.unverified_key_rate.map(shown).ok_or("none: new keys are not limited");

    /// How many of the busiest tenants `/metrics` counts keyed requests for
    /// (`idem_tenant_keyed_requests_total`); 0 for none [default: 10].
    #[arg(long, env = "IDEM_TENANT_METRICS", value_name = "N")]
    pub tenant_metrics: Option<u64>, live
        => tenant_metrics: usize
            = |a| Ok(resolve::count(a.tenant_metrics, crate::metrics::DEFAULT_TENANT_METRICS)),
        print |c, _| c.tenant_metrics.to_string();

    /// File of the keys recorded answers are sealed with (SPEC S17): one `id:<64 hex
    /// digits>` per line, the first sealing new answers, every one opening its own; not
    /// readable by others than its owner [default: answers are stored in plain text].
    #[arg(long, env = "IDEM_RECORD_KEY_FILE", value_name = "PATH")]
    pub record_key_file: Option<PathBuf>, restart
        => record_keys: Option<RecordKeys> = |a| record_keys(a.record_key_file.as_deref()),
        print |_, a| a.record_key_file.as_deref().map(path).ok_or("records are not sealed");

    /// With --record-key-file: replay answers the store holds unsealed (recorded before
    /// sealing was turned on) while they age out, instead of refusing them with 500
    /// `replay-unavailable`. A migration setting: anyone who can write the store can
    /// then plant a plain answer in a sealed record.
    #[arg(long, env = "IDEM_READ_UNSEALED_RECORDS")]
    pub read_unsealed_records: bool, restart
        => read_unsealed_records: bool = |a| Ok(a.read_unsealed_records),
        print |c, _| c.read_unsealed_records.to_string();

    /// Scope of a key: public = (tenant, endpoint, key), internal = (tenant, key)
    /// [default: public].
    #[arg(long, env = "IDEM_SCOPE", value_parser = choices::scope())]
    pub scope: Option<ScopeMode>, restart => scope: ScopeMode = |a| Ok(a.scope.unwrap_or_default()),
        print |c, _| quoted(c.scope.as_str());

    /// Methods that take an Idempotency-Key [default: POST,PATCH].
    #[arg(long, env = "IDEM_KEYED_METHODS", value_name = "LIST", value_delimiter = ',')]
    pub keyed_methods: Option<Vec<String>>, live
        => keyed_methods: Vec<Method> = resolve::keyed_methods,
        print |c, _| strings(c.keyed_methods.iter().map(|m| m.as_str()));

    /// Upstream statuses that release the key (the answer passes through unrecorded and
    /// a retry executes again) instead of being recorded; 4xx and 5xx only, or `none`;
    /// replaces the profile's [default: 400,401,403,404,405,408,409,413,415,422,429,503,
    /// and under the acp profile every 5xx].
    #[arg(long, env = "IDEM_RELEASE_STATUSES", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::statuses")]
    pub release_statuses: Option<Vec<String>>, live
        => release_statuses: Option<ReleaseStatuses> = resolve::release_statuses,
        print |c, _| c.release_statuses.as_ref().map(statuses)
            .ok_or("each route's profile's: S6's list, and every 5xx under acp");

    /// gRPC statuses (names or numbers) that release a gRPC call's key instead of being
    /// recorded, or `none`
    /// [default: INVALID_ARGUMENT,PERMISSION_DENIED,RESOURCE_EXHAUSTED,ABORTED,UNAVAILABLE,UNAUTHENTICATED].
    #[arg(long, env = "IDEM_GRPC_RELEASE_CODES", value_name = "LIST", value_delimiter = ',')]
    pub grpc_release_codes: Option<Vec<String>>, live
        => grpc_release_codes: GrpcReleaseCodes = resolve::grpc_release_codes,
        print |c, _| grpc_codes(&c.grpc_release_codes);

    /// How request paths are normalised before route matching, scoping and forwarding
    /// (the upstream receives the normalised path): rfc3986 (RFC 3986 §6.2.2: unreserved
    /// escapes decoded, dot segments removed), merge-slashes, reject-ambiguous (refuse
    /// %2F, %5C, %3B, space-padded segments, `..;` and characters NFKC changes), and the
    /// opt-in trailing-slash and lowercase; or none. A path that cannot be normalised is
    /// a 400 `invalid-path` [default: rfc3986,merge-slashes,reject-ambiguous].
    #[arg(long, env = "IDEM_PATH_NORMALIZATION", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub path_normalization: Option<Vec<String>>, live
        => path_normalization: PathNormalization = resolve::path_normalization,
        print |c, _| print::display_list(&c.path_normalization);

    /// How `[[route]]` templates match normalised paths: ignore-case (ASCII letters),
    /// ignore-trailing-slash; or exact. `;` path parameters are never matched
    /// [default: ignore-case,ignore-trailing-slash].
    #[arg(long, env = "IDEM_ROUTE_MATCHING", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub route_matching: Option<Vec<String>>, live
        => route_matching: RouteMatching = resolve::route_matching,
        print |c, _| print::display_list(&c.route_matching);

    /// How long a client may take to send a request's headers, counted from when its
    /// connection is ready for the next request (so an idle keep-alive connection is
    /// closed after it too), and then a keyed request's body (408 after it, nothing
    /// reserved); a client whose reading stalls that long is disconnected too; 0s turns
    /// all three off [default: 30s].
    #[arg(long, env = "IDEM_CLIENT_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub client_timeout: Option<Duration>, restart
        => client_timeout: Option<Duration> = resolve::client_timeout,
        print |c, _| duration(c.client_timeout.unwrap_or(Duration::ZERO));

    /// Most client connections the proxy holds open; at it, it accepts no more until one
    /// closes [default: derived from the open-file limit, which is raised to its hard
    /// value: (limit - store connections - 32 for the admin listener - 64) / 2].
    #[arg(long, env = "IDEM_MAX_CONNECTIONS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>, restart
        => max_connections: Option<usize> = resolve::max_connections,
        print |c, _| c.max_connections.map(|n| n.to_string())
            .ok_or("derived from the open-file limit at start");

    /// Time between sweeps of expired records [default: 60s].
    #[arg(long, env = "IDEM_SWEEP_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub sweep_interval: Option<Duration>, restart
        // Zero would leave the store without a sweeper, growing without bound.
        => sweep_interval: Duration
            = |a| positive("sweep_interval", a.sweep_interval, DEFAULT_SWEEP_INTERVAL),
        print |c, _| duration(c.sweep_interval);

    /// Forward everything without Idempotency-Key handling: a plain reverse proxy, for
    /// measuring the layer's cost or as an emergency bypass.
    // A mode rather than a setting of the gateway: see `serve::Mode`.
    #[arg(long, env = "IDEM_PASSTHROUGH")]
    #[serde(skip)]
    pub passthrough: bool, start;

    /// Longest wait at shutdown for in-flight requests to finish and record [default: the
    /// upstream timeout plus 5s].
    #[arg(long, env = "IDEM_SHUTDOWN_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub shutdown_timeout: Option<Duration>, restart
        => shutdown_timeout: Duration = resolve::shutdown_timeout,
        print |c, _| duration(c.shutdown_timeout);

    /// Export OpenTelemetry traces over OTLP/HTTP to the collector at this base URL,
    /// e.g. http://127.0.0.1:4318 (spans are posted to its /v1/traces): a span per
    /// request, with the store and upstream calls as its children. Given here, in
    /// IDEM_OTLP_ENDPOINT or as `otlp_endpoint`, it wins over OTEL_EXPORTER_OTLP_ENDPOINT,
    /// which is honoured otherwise [default: off].
    #[arg(long, env = "IDEM_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>, restart
        => otlp_endpoint: Option<String> = resolve::otlp_endpoint,
        print print::otlp_endpoint;

    /// One line per request at info level (target `idem::access`): `on`, `off`, or the
    /// fraction of requests to log, at random (`0.1`) [default: on].
    #[arg(long, env = "IDEM_ACCESS_LOG", value_name = "on|off|FRACTION")]
    pub access_log: Option<String>, live
        => access_log: crate::access::AccessLog = resolve::access_log,
        print |c, _| shown(c.access_log);

    /// The header that carries the request id: taken from the client when well formed,
    /// else made; sent upstream, returned, logged [default: x-request-id].
    #[arg(long, env = "IDEM_REQUEST_ID_HEADER", value_name = "NAME")]
    pub request_id_header: Option<String>, live
        => request_id_header: HeaderName
            = |a| values::parse_request_id_header(a.request_id_header.as_deref()),
        print |c, _| quoted(c.request_id_header.as_str());

    /// Networks and addresses of the proxies in front of the gateway, e.g.
    /// 10.0.0.0/8,127.0.0.1: a connection from one of them may name its client in
    /// X-Forwarded-For, which the access log's `client` then shows (the rightmost
    /// untrusted entry) [default: none, the client is the connection's peer].
    #[arg(long, env = "IDEM_TRUSTED_PROXIES", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub trusted_proxies: Option<Vec<String>>, live
        => trusted_proxies: crate::trusted::TrustedProxies = resolve::trusted_proxies,
        print |c, _| {
            list_of(c.trusted_proxies.nets()).ok_or("none: the client is the connection's peer")
        };

    /// Headers only the trusted proxies may set (an identity the ingress asserts, such
    /// as X-User-Id for --tenant-header): removed from the requests of every other peer
    /// before the tenant is named or anything is forwarded. Needs --trusted-proxies
    /// [default: none].
    #[arg(long, env = "IDEM_TRUSTED_HEADERS", value_name = "LIST", value_delimiter = ',')]
    #[serde(deserialize_with = "toml_form::list")]
    pub trusted_headers: Option<Vec<String>>, live
        => trusted_headers: Vec<HeaderName> = resolve::trusted_headers,
        print |c, _| list_of(&c.trusted_headers).ok_or("none");

    /// Most streams (requests) one HTTP/2 client connection may have open at once
    /// [default: 100].
    #[arg(long, env = "IDEM_HTTP2_MAX_CONCURRENT_STREAMS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: Option<u32>, restart => http2: Http2Limits = listeners::http2,
        print |c, _| c.http2.max_concurrent_streams.to_string();

    /// Largest header list an HTTP/2 request may carry (names and values, plus 32 bytes
    /// a field), e.g. 32KiB; a larger one is refused [default: 32KiB].
    #[arg(long, env = "IDEM_HTTP2_MAX_HEADER_LIST_SIZE", value_name = "BYTES", value_parser = parse_byte_size)]
    #[serde(deserialize_with = "toml_form::bytes")]
    pub http2_max_header_list_size: Option<usize>, restart => http2,
        print |c, _| c.http2.max_header_list_size.to_string();

    /// How often an HTTP/2 client connection is pinged, so that a peer that vanished is
    /// found out; 0s for never [default: 30s].
    #[arg(long, env = "IDEM_HTTP2_KEEPALIVE_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub http2_keepalive_interval: Option<Duration>, restart => http2,
        print |c, _| duration(c.http2.keepalive_interval.unwrap_or(Duration::ZERO));

    /// How long an HTTP/2 ping may go unanswered before the connection is closed
    /// [default: 20s].
    #[arg(long, env = "IDEM_HTTP2_KEEPALIVE_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    #[serde(deserialize_with = "toml_form::duration")]
    pub http2_keepalive_timeout: Option<Duration>, restart => http2,
        print |c, _| duration(c.http2.keepalive_timeout);

    /// Most bytes of buffered answers (replays, recorded answers) one HTTP/2 client
    /// connection may hold while its client has not read them, e.g. 16MiB; an answer
    /// beyond it is a 503 `replay-unavailable` to retry with the same key (a
    /// connection's first answer always fits) [default: 16MiB].
    #[arg(long, env = "IDEM_HTTP2_ANSWER_BUDGET", value_name = "BYTES", value_parser = parse_byte_size)]
    #[serde(deserialize_with = "toml_form::bytes")]
    pub http2_answer_budget: Option<usize>, restart => http2,
        print |c, _| c.http2.answer_budget.to_string();

    /// PEM file of the CA certificates a client certificate must chain to: clients may
    /// then present one (mutual TLS), and `--tenant-from cert` names the tenant by it.
    /// A client without one is still served; one whose certificate does not verify
    /// fails the handshake. With --tls-cert [default: no client certificates].
    #[arg(long, env = "IDEM_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>, restart => tls: Option<TlsFiles> = listeners::tls,
        print |c, _| c.tls.as_ref().and_then(|f| f.client_ca.as_deref()).map(path)
            .ok_or("no client certificates are asked for");

    /// Which name of a verified client certificate names the tenant: uri (the first
    /// URI SAN, a SPIFFE id say), dns, email, or subject (the whole subject name)
    /// [default: uri].
    #[arg(long, env = "IDEM_TENANT_CERT_NAME", value_name = "uri|dns|email|subject")]
    pub tenant_cert_name: Option<String>, live
        => tenant_cert_name: CertName = resolve::tenant_cert_name,
        print |c, _| quoted(c.tenant_cert_name.as_str());

    /// PEM file with the proxy listener's TLS certificate chain (its own certificate
    /// first): the listener then speaks HTTPS only, HTTP/2 or HTTP/1.1 by ALPN, TLS 1.2
    /// and 1.3; read again on a reload (SIGHUP, POST /reload). With --tls-key [default:
    /// plain TCP].
    #[arg(long, env = "IDEM_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>, restart => tls,
        print |c, _| c.tls.as_ref().map(|f| path(&f.cert)).ok_or("plain TCP");

    /// PEM file with the private key of --tls-cert.
    #[arg(long, env = "IDEM_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>, restart => tls,
        print |c, _| c.tls.as_ref().map(|f| path(&f.key)).ok_or("plain TCP");

    /// PEM file with the admin listener's TLS certificate chain; read again on a reload.
    /// With --admin-tls-key [default: plain TCP].
    #[arg(long, env = "IDEM_ADMIN_TLS_CERT", value_name = "FILE", requires = "admin_tls_key")]
    pub admin_tls_cert: Option<PathBuf>, restart
        => admin_tls: Option<TlsFiles> = listeners::admin_tls,
        print |c, _| c.admin_tls.as_ref().map(|f| path(&f.cert)).ok_or("plain TCP");

    /// PEM file with the private key of --admin-tls-cert.
    #[arg(long, env = "IDEM_ADMIN_TLS_KEY", value_name = "FILE", requires = "admin_tls_cert")]
    pub admin_tls_key: Option<PathBuf>, restart => admin_tls,
        print |c, _| c.admin_tls.as_ref().map(|f| path(&f.key)).ok_or("plain TCP");

    /// Per-route rules (`[[route]]` tables, the file only), first match wins.
    #[arg(skip)]
    pub route: Vec<RouteRule>, live => routes: Vec<Route> = routes::resolve;

    /// Per-tenant limits (`[[tenant]]` tables, the file only).
    #[arg(skip)]
    pub tenant: Vec<TenantRule>, live => tenant_overrides: Vec<TenantLimits> = tenants::resolve;
}
