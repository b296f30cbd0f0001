//! The `[[route]]` and `[[tenant]]` tables of the `--config` file, as written; compiled
//! into [`Route`](crate::route::Route)s and [`TenantLimits`](super::TenantLimits) when
//! the settings are resolved.

use std::time::Duration;

use serde::Deserialize;

use super::toml_form;

/// A `[[tenant]]` table as written: one tenant's limits in place of the global ones.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRule {
    /// The tenant as stored (`hmac-sha256:` and 64 hex digits), at least its first 16
    /// hex digits (as the per-tenant metrics label it), or `anonymous`.
    pub id: String,
    /// Its most keyed requests in progress at once; `0` for no cap.
    pub max_in_flight: Option<u64>,
    /// Its rate of new keys (`RATE/UNIT[,BURST]`), or `"none"` for no limit.
    pub key_rate: Option<String>,
}

/// A `[[route]]` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    /// The method; any method when left out.
    pub method: Option<String>,
    /// The path template, e.g. `/v1/orders/{id}/capture`.
    pub path: String,
    /// Whether the key is required on this route.
    pub require_key: Option<bool>,
    /// The headers the key may come in on this route, in order (`Idempotency-Key`,
    /// `X-Idempotency-Key`, `PayPal-Request-Id`); a list or one comma-separated string.
    #[serde(default, deserialize_with = "toml_form::list")]
    pub key_header: Option<Vec<String>>,
    /// A JSON pointer into the body the key may come in on this route
    /// (`/idempotency_key`), when no key header carries one.
    pub key_pointer: Option<String>,
    /// Record lifetime on this route.
    #[serde(default, deserialize_with = "toml_form::duration")]
    pub ttl: Option<Duration>,
    /// How long a tombstone outlives this route's completed records; `0s` keeps none.
    #[serde(default, deserialize_with = "toml_form::duration")]
    pub tombstone_ttl: Option<Duration>,
    /// JSON pointers left out of the fingerprint.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// Extra response headers stored and replayed.
    #[serde(default)]
    pub store_headers: Vec<String>,
    /// The statuses that release the key on this route, replacing the global list.
    pub release_statuses: Option<Vec<u16>>,
    /// The gRPC statuses that release a gRPC call's key on this route, replacing the
    /// global list.
    pub grpc_release_codes: Option<Vec<String>>,
    /// Whether replays and conflicts on this route carry `Stripe-Should-Retry` and
    /// `X-Should-Retry`.
    pub retry_hints: Option<bool>,
    /// `false`: a keyed request on this route may name no tenant (keyed as
    /// `anonymous`) even with `require_tenant`; `true`: this route requires one.
    pub require_tenant: Option<bool>,
    /// Where this route's keyed requests name their tenant, in place of the global
    /// `tenant_from` (`jwt`, `cert`, `headers`, in that order).
    #[serde(default, deserialize_with = "toml_form::list")]
    pub tenant_from: Option<Vec<String>>,
    /// How long a duplicate of an in-progress request on this route waits for its
    /// answer when it sends no `Prefer: wait=N`.
    #[serde(default, deserialize_with = "toml_form::duration")]
    pub conflict_wait: Option<Duration>,
    /// The dialect of this route's answers, in place of the global `profile`.
    pub profile: Option<idem_core::Profile>,
    /// The header this route's answers publish their record's lifetime in, or `off`,
    /// in place of the global `retention_header`.
    pub retention_header: Option<String>,
    /// Under the `mcp` profile, the JSON-RPC methods keyed on this route (default
    /// `tools/call`); a list or one comma-separated string.
    #[serde(default, deserialize_with = "toml_form::list")]
    pub rpc_methods: Option<Vec<String>>,
    /// How this route's JSON bodies are compared: `idem` (every digit of a number
    /// counts) or `jcs` (RFC 8785).
    pub canonical_json: Option<String>,
}

impl RouteRule {
    /// How errors name the rule, the `i`th of the file.
    pub(super) fn name(&self, i: usize) -> String {
        format!("route[{i}] ({})", self.path)
    }
}
