//! What the layer is configured with: the builder's settings and per-route overrides.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use idem_core::{
    DEFAULT_BODY_LIMIT, DEFAULT_LEASE, DEFAULT_TTL, FingerprintOptions, PointerError, ScopeMode,
    Tenant, TenantKey,
};

use crate::grpc::GrpcReleaseCodes;
use crate::observer::{NoopObserver, Observer};
use crate::tenant::TenantHeaders;

/// The header that carries the key unless configured otherwise.
pub const DEFAULT_HEADER_NAME: HeaderName = HeaderName::from_static("idempotency-key");

/// The largest answer recorded, in bytes, unless configured otherwise: 8 MiB. Every
/// keyed answer is held whole to be recorded; a larger one is replaced by a recorded
/// `response-too-large` problem.
pub const DEFAULT_RESPONSE_LIMIT: usize = 8 * 1024 * 1024;

/// Response statuses that release the key by default (SPEC S6): the request did not
/// start executing, so a corrected retry with the same key may run.
pub const DEFAULT_RELEASE_STATUSES: [u16; 12] =
    [400, 401, 403, 404, 405, 408, 409, 413, 415, 422, 429, 503];

impl crate::OperationState {
    /// The state after the upstream's answer with `status` released the key: not
    /// started only where the status is one SPEC S6 defines as "did not start" and no
    /// earlier attempt may have acted (`recovered` is false).
    pub fn of_released(status: StatusCode, recovered: bool) -> crate::OperationState {
        if !recovered && DEFAULT_RELEASE_STATUSES.contains(&status.as_u16()) {
            crate::OperationState::NotStarted
        } else {
            crate::OperationState::Unknown
        }
    }
}

/// The response statuses that release the key instead of recording the answer (SPEC
/// S6); by default [`DEFAULT_RELEASE_STATUSES`]. Cheap to clone: the set is shared.
///
/// The layer decides with it, and hands the set of the request's route to the inner
/// service in [`IdempotencyContext::releases`](crate::IdempotencyContext::releases), so
/// a service that treats released answers differently decides as the layer will.
///
/// ```
/// use http::StatusCode;
/// use idem_tower::ReleaseStatuses;
///
/// let set = ReleaseStatuses::new([StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE]);
/// assert!(set.contains(StatusCode::CONFLICT));
/// assert!(!set.contains(StatusCode::INTERNAL_SERVER_ERROR));
/// assert!(ReleaseStatuses::default().contains(StatusCode::TOO_MANY_REQUESTS));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ReleaseStatuses(Arc<[u16]>);

impl ReleaseStatuses {
    /// The set of `statuses`; repeats are ignored.
    pub fn new<I: IntoIterator<Item = StatusCode>>(statuses: I) -> ReleaseStatuses {
        let mut codes: Vec<u16> = statuses.into_iter().map(|s| s.as_u16()).collect();
        codes.sort_unstable();
        codes.dedup();
        ReleaseStatuses(codes.into())
    }

    /// Whether an answer with `status` releases the key.
    pub fn contains(&self, status: StatusCode) -> bool {
        self.0.binary_search(&status.as_u16()).is_ok()
    }

    /// The statuses, ascending.
    pub fn iter(&self) -> impl Iterator<Item = StatusCode> + '_ {
        self.0
            .iter()
            .map(|&c| StatusCode::from_u16(c).expect("built from status codes"))
    }

    /// Whether the set is empty: every answer is recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Default for ReleaseStatuses {
    fn default() -> Self {
        ReleaseStatuses::new(
            DEFAULT_RELEASE_STATUSES.map(|c| StatusCode::from_u16(c).expect("status codes")),
        )
    }
}

impl fmt::Debug for ReleaseStatuses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.iter()).finish()
    }
}

/// Response headers stored and replayed by default (SPEC S6). `content-encoding` is
/// among them because the body is recorded as sent: a compressed body replayed without
/// it could not be read. So are the CORS headers of an answer to a browser's
/// cross-origin request: without them the page could not read the replay, and its
/// retries would never see the answer. They are replayed as first sent, for the origin
/// of the first request.
pub const DEFAULT_STORED_HEADERS: [&str; 6] = [
    "content-type",
    "content-encoding",
    "location",
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "access-control-expose-headers",
];

/// Response headers that are never stored, whatever the allow-list says: they describe
/// one transmission (date, framing, connection), carry a client's session
/// (`set-cookie`), or identify one request's trace, so replaying them would lie.
pub const NEVER_STORED_HEADERS: [&str; 20] = [
    "date",
    "set-cookie",
    "set-cookie2",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "trailer",
    "upgrade",
    "proxy-authenticate",
    "traceparent",
    "tracestate",
    "b3",
    "request-id",
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "x-amzn-trace-id",
    "x-cloud-trace-context",
    "uber-trace-id",
];

/// Whether a response header may be stored (see [`NEVER_STORED_HEADERS`]; `x-b3-*`
/// trace headers are refused too).
pub fn is_storable_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    !NEVER_STORED_HEADERS.contains(&name) && !name.starts_with("x-b3-")
}

pub(crate) type PartsPredicate = Arc<dyn Fn(&Method, &Parts) -> bool + Send + Sync>;
pub(crate) type TenantExtractor = Arc<dyn Fn(&Parts) -> Tenant + Send + Sync>;
pub(crate) type RouteConfigFn = Arc<dyn Fn(&Method, &Parts) -> Option<RouteConfig> + Send + Sync>;
/// Renders a [`crate::ResourceReference`] again: `GET <reference>` in, the resource out.
pub(crate) type Renderer = Arc<
    dyn Fn(
            http::Request<()>,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<
                        Output = Result<http::Response<bytes::Bytes>, crate::BoxError>,
                    > + Send,
            >,
        > + Send
        + Sync,
>;

/// What the layer does with a [`crate::ResourceReference`] (see
/// `IdempotencyLayer::render_references` and `render_references_with`).
#[derive(Clone)]
pub(crate) enum References {
    /// Ignored: the answer is recorded whole.
    Ignored,
    /// Recorded, and rendered by the wrapped service.
    ThroughService,
    /// Recorded, and rendered by this renderer.
    With(Renderer),
}

impl References {
    pub(crate) fn honoured(&self) -> bool {
        !matches!(self, References::Ignored)
    }
}

impl fmt::Debug for References {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            References::Ignored => "Ignored",
            References::ThroughService => "ThroughService",
            References::With(_) => "With(renderer)",
        })
    }
}

/// The layer's settings, shared by every service it makes.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) header_name: HeaderName,
    pub(crate) keyed_methods: Vec<Method>,
    /// The method-override headers read to decide a request's method (SPEC S14).
    pub(crate) method_override_headers: Vec<HeaderName>,
    pub(crate) require_key: PartsPredicate,
    pub(crate) scope_mode: ScopeMode,
    /// The headers that name the tenant, unless `tenant_from` names it.
    pub(crate) tenant_headers: TenantHeaders,
    /// The key those headers are hashed under: set by the builder, or fetched from the
    /// store before the first keyed request is scoped. Shared by every clone.
    pub(crate) tenant_key: Arc<tokio::sync::OnceCell<TenantKey>>,
    /// A caller's own extractor, which replaces the headers.
    pub(crate) tenant_from: Option<TenantExtractor>,
    /// Whether a keyed request must name a tenant (401 `missing-tenant` otherwise).
    pub(crate) require_tenant: bool,
    /// The sources that name the tenant in place of the headers alone, when set.
    pub(crate) sources: Option<crate::sources::TenantSources>,
    pub(crate) fingerprint: FingerprintOptions,
    pub(crate) body_limit: usize,
    pub(crate) body_timeout: Option<Duration>,
    pub(crate) response_limit: usize,
    /// Whether a [`crate::ResourceReference`] is honoured, and how it is rendered.
    pub(crate) references: References,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    /// How long a tombstone outlives a completed record (SPEC S16); zero for none.
    pub(crate) tombstone: Duration,
    pub(crate) stored_headers: Vec<HeaderName>,
    /// The layer's own set; `None` for the profile's ([`ReleaseStatuses::of_profile`]).
    pub(crate) release_statuses: Option<ReleaseStatuses>,
    /// The gRPC statuses that release a gRPC call's key (SPEC S18).
    pub(crate) grpc_release_codes: GrpcReleaseCodes,
    pub(crate) route_config: Option<RouteConfigFn>,
    pub(crate) observer: Arc<dyn Observer>,
    /// Whether the layer's own answers carry retry hints (see
    /// [`IdempotencyLayer::retry_hints`](crate::IdempotencyLayer::retry_hints)).
    pub(crate) retry_hints: bool,
    /// The dialect of the layer's own answers (see
    /// [`IdempotencyLayer::profile`](crate::IdempotencyLayer::profile)).
    pub(crate) profile: crate::Profile,
    /// Where a record's lifetime is published (SPEC S23).
    pub(crate) retention_header: crate::HeaderChoice,
    /// The replay marker's name; `None`: the profile's.
    pub(crate) replay_header: Option<HeaderName>,
    /// How long a duplicate of an in-progress attempt waits without `Prefer: wait`
    /// (SPEC S15); zero answers 409 at once.
    pub(crate) conflict_wait: Duration,
    /// The longest wait granted, whatever was asked.
    pub(crate) max_wait: Duration,
    /// The cap on duplicates waiting at once, shared by every clone.
    pub(crate) waiters: crate::wait::Waiters,
    /// The limits per tenant, and what is counted under them (shared by every clone).
    pub(crate) tenant_limits: crate::tenant_limit::TenantLimits,
    /// The fingerprint rules of the layers this one took over from, newest first,
    /// each with when it stopped being used: a record reserved under one of them is
    /// compared by its rules, so that a reload never turns a replay into a 422.
    pub(crate) earlier: Vec<Earlier>,
}

/// The fingerprint rules a layer used before another took over from it
/// ([`IdempotencyLayer::take_over_from`](crate::IdempotencyLayer::take_over_from)).
#[derive(Clone)]
pub(crate) struct Earlier {
    /// When the layer after it took over: only records created before then were
    /// reserved under these rules.
    pub(crate) until: idem_core::Timestamp,
    /// The layer's fingerprint options.
    pub(crate) fingerprint: FingerprintOptions,
    /// Its per-route overrides.
    pub(crate) route_config: Option<RouteConfigFn>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            header_name: DEFAULT_HEADER_NAME,
            keyed_methods: vec![Method::POST, Method::PATCH],
            method_override_headers: crate::method_override::DEFAULT_METHOD_OVERRIDE_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            require_key: Arc::new(|_, _| false),
            scope_mode: ScopeMode::Public,
            tenant_headers: TenantHeaders::default(),
            tenant_key: Arc::default(),
            tenant_from: None,
            require_tenant: false,
            sources: None,
            fingerprint: FingerprintOptions::default(),
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: None,
            response_limit: DEFAULT_RESPONSE_LIMIT,
            references: References::Ignored,
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            tombstone: Duration::ZERO,
            stored_headers: DEFAULT_STORED_HEADERS
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            release_statuses: None,
            grpc_release_codes: GrpcReleaseCodes::default(),
            route_config: None,
            observer: Arc::new(NoopObserver),
            retry_hints: false,
            profile: crate::Profile::Ietf,
            retention_header: crate::HeaderChoice::Profile,
            replay_header: None,
            conflict_wait: Duration::ZERO,
            max_wait: crate::wait::DEFAULT_MAX_WAIT,
            waiters: crate::wait::Waiters::new(crate::wait::DEFAULT_MAX_WAITERS),
            tenant_limits: Default::default(),
            earlier: Vec::new(),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("header_name", &self.header_name)
            .field("keyed_methods", &self.keyed_methods)
            .field("method_override_headers", &self.method_override_headers)
            .field("scope_mode", &self.scope_mode)
            .field("tenant_headers", &self.tenant_headers)
            .field("tenant_from", &self.tenant_from.is_some())
            .field("require_tenant", &self.require_tenant)
            .field("fingerprint", &self.fingerprint)
            .field("body_limit", &self.body_limit)
            .field("body_timeout", &self.body_timeout)
            .field("response_limit", &self.response_limit)
            .field("references", &self.references)
            .field("ttl", &self.ttl)
            .field("tombstone", &self.tombstone)
            .field("lease", &self.lease)
            .field("stored_headers", &self.stored_headers)
            .field("release_statuses", &self.release_statuses)
            .field("grpc_release_codes", &self.grpc_release_codes)
            .field("route_config", &self.route_config.is_some())
            .field("retry_hints", &self.retry_hints)
            .field("profile", &self.profile)
            .field("retention_header", &self.retention_header)
            .field("replay_header", &self.replay_header)
            .field("conflict_wait", &self.conflict_wait)
            .field("max_wait", &self.max_wait)
            .field("waiters", &self.waiters)
            .field("tenant_limits", &self.tenant_limits)
            .field("earlier", &self.earlier.len())
            .finish_non_exhaustive()
    }
}

/// Per-route overrides, returned by the closure given to
/// [`IdempotencyLayer::route_config`](crate::IdempotencyLayer::route_config).
///
/// Every setting left unset falls back to the layer's.
///
/// ```
/// use std::time::Duration;
/// use idem_tower::RouteConfig;
///
/// let capture = RouteConfig::new()
///     .endpoint("/v1/orders/{id}/capture")
///     .require_key(true)
///     .ttl(Duration::from_secs(3600))
///     .ignore_pointer("/client_sent_at")
///     .unwrap();
/// # let _ = capture;
/// ```
#[derive(Clone, Debug, Default)]
pub struct RouteConfig {
    pub(crate) endpoint: Option<String>,
    pub(crate) keyed: Option<bool>,
    pub(crate) require_key: Option<bool>,
    pub(crate) require_tenant: Option<bool>,
    pub(crate) tenant_sources: Option<Arc<crate::sources::TenantSources>>,
    pub(crate) key_headers: Option<Vec<HeaderName>>,
    pub(crate) key_pointer: Option<Arc<str>>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    pub(crate) tombstone: Option<Duration>,
    pub(crate) fingerprint: Option<FingerprintOptions>,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) release_statuses: Option<ReleaseStatuses>,
    pub(crate) grpc_release_codes: Option<GrpcReleaseCodes>,
    pub(crate) retry_hints: Option<bool>,
    pub(crate) profile: Option<crate::Profile>,
    pub(crate) retention_header: Option<crate::HeaderChoice>,
    pub(crate) conflict_wait: Option<Duration>,
    pub(crate) fingerprint_path: Option<String>,
    pub(crate) rpc_methods: Option<Arc<[Box<str>]>>,
}

impl RouteConfig {
    /// No overrides.
    pub fn new() -> RouteConfig {
        RouteConfig::default()
    }

    /// The route template that names the endpoint in the scope (SPEC S3), e.g.
    /// `/v1/orders/{id}/capture`; the method is prefixed by the layer.
    pub fn endpoint(mut self, template: impl Into<String>) -> RouteConfig {
        self.endpoint = Some(template.into());
        self
    }

    /// Whether requests to this route are keyed at all, whatever their method.
    pub fn keyed(mut self, keyed: bool) -> RouteConfig {
        self.keyed = Some(keyed);
        self
    }

    /// Whether a keyed request to this route must carry a key (missing → 400).
    pub fn require_key(mut self, required: bool) -> RouteConfig {
        self.require_key = Some(required);
        self
    }

    /// How long records of this route live (SPEC S8), counted from the first request;
    /// see [`IdempotencyLayer::ttl`](crate::IdempotencyLayer::ttl).
    pub fn ttl(mut self, ttl: Duration) -> RouteConfig {
        self.ttl = Some(ttl);
        self
    }

    /// How long a tombstone outlives this route's completed records (SPEC S16); see
    /// [`IdempotencyLayer::tombstone_ttl`](crate::IdempotencyLayer::tombstone_ttl).
    /// Zero keeps none.
    pub fn tombstone_ttl(mut self, tombstone: Duration) -> RouteConfig {
        self.tombstone = Some(tombstone);
        self
    }

    /// How long an attempt's lease lasts on this route (SPEC S7).
    pub fn lease(mut self, lease: Duration) -> RouteConfig {
        self.lease = Some(lease);
        self
    }

    /// The path this request's fingerprint covers in place of its own (the query is
    /// kept): for a router that matches several spellings of one path to this route
    /// (`/V1/Charges/`, `/v1/charges;jsessionid=x`), the route's own spelling, so
    /// that a retry in another spelling replays rather than being a 422.
    pub fn fingerprint_path(mut self, path: impl Into<String>) -> RouteConfig {
        self.fingerprint_path = Some(path.into());
        self
    }

    /// Fingerprint options for this route. They replace the layer's.
    pub fn fingerprint_options(mut self, options: FingerprintOptions) -> RouteConfig {
        self.fingerprint = Some(options);
        self
    }

    /// Leaves a JSON pointer out of this route's fingerprint (SPEC S4). The route's
    /// options start empty and replace the layer's.
    pub fn ignore_pointer(mut self, pointer: &str) -> Result<RouteConfig, PointerError> {
        let options = self.fingerprint.take().unwrap_or_default();
        self.fingerprint = Some(options.ignore_pointer(pointer)?);
        Ok(self)
    }

    /// Response headers stored for this route on top of the layer's allow-list. Names in
    /// [`NEVER_STORED_HEADERS`] are ignored.
    pub fn store_headers<I>(mut self, names: I) -> RouteConfig
    where
        I: IntoIterator<Item = HeaderName>,
    {
        self.stored_headers
            .extend(names.into_iter().filter(is_storable_header));
        self
    }

    /// The response statuses that release the key on this route. They replace the
    /// layer's set, and the route's profile's ([`ReleaseStatuses::of_profile`]). Built once, the set is shared by every request the route sees.
    pub fn release_statuses(mut self, statuses: ReleaseStatuses) -> RouteConfig {
        self.release_statuses = Some(statuses);
        self
    }

    /// The gRPC statuses that release the key of a gRPC call on this route (SPEC S18).
    /// They replace the layer's set.
    pub fn grpc_release_codes(mut self, codes: GrpcReleaseCodes) -> RouteConfig {
        self.grpc_release_codes = Some(codes);
        self
    }

    /// The headers the key may come in on this route, tried in order, in place of the
    /// layer's [`header_name`](crate::IdempotencyLayer::header_name): the dialects of
    /// clients that send `X-Idempotency-Key` or `PayPal-Request-Id`. A request that
    /// carries several of them must carry one key in all (else 400 `invalid-key`), since
    /// the upstream may read any. The key is the same record whichever header it came
    /// in.
    pub fn key_headers<I: IntoIterator<Item = HeaderName>>(mut self, names: I) -> RouteConfig {
        let names: Vec<HeaderName> = names.into_iter().collect();
        self.key_headers = (!names.is_empty()).then_some(names);
        self
    }

    /// Takes the key from a JSON pointer into the request's body (`/idempotency_key`,
    /// RFC 6901) when none of the key headers carries one, for clients that send it
    /// there (Square's, AdCP's). The field is left out of the route's fingerprint, so
    /// the key itself never makes two attempts differ. A header and the body that carry
    /// different keys are 400 `invalid-key`.
    ///
    /// A request on this route that carries no key header is read (up to the body
    /// limit) before the layer knows whether it is keyed; one whose body names no key
    /// then passes through, its body forwarded as read, unless the route requires a key.
    /// A JSON body the layer cannot read ([`idem_core::UnreadableJson`]: not UTF-8, a
    /// lone surrogate escape, nested past [`idem_core::MAX_JSON_DEPTH`]) is 400
    /// `unreadable-json`, key header or not: the upstream's parser might read a key in
    /// it. A compressed body's key is read in its content, and so is the key in a body
    /// of another media type that is JSON (some upstreams parse JSON whatever the type).
    ///
    /// Returns an error when the pointer is not of RFC 6901's form.
    pub fn key_pointer(mut self, pointer: &str) -> Result<RouteConfig, PointerError> {
        FingerprintOptions::default().ignore_pointer(pointer)?;
        self.key_pointer = Some(Arc::from(pointer));
        Ok(self)
    }

    /// The JSON-RPC methods keyed on this route when its profile is
    /// [`Profile::Mcp`](crate::Profile::Mcp) (SPEC S24), in place of
    /// [`DEFAULT_KEYED_METHODS`](crate::mcp::DEFAULT_KEYED_METHODS) (`tools/call`).
    /// Every other message (`initialize`, `tools/list`, notifications, responses)
    /// passes untouched, key or not.
    ///
    /// On such a route the key comes from `params._meta["idempotency-key"]`, the key
    /// header, or [`key_pointer`](RouteConfig::key_pointer) (a pointer into the whole
    /// message, `/params/arguments/idempotency_key`); two that disagree are refused.
    /// The fingerprint covers the document `{"method", "name", "arguments"}` (the
    /// method, `params.name`, `params.arguments`), so [`ignore_pointer`](RouteConfig::ignore_pointer)s
    /// name members of it (`/arguments/sent_at`).
    pub fn rpc_methods<I, M>(mut self, methods: I) -> RouteConfig
    where
        I: IntoIterator<Item = M>,
        M: Into<Box<str>>,
    {
        self.rpc_methods = Some(methods.into_iter().map(Into::into).collect());
        self
    }

    /// Whether a keyed request on this route must name a tenant, in place of the
    /// layer's [`require_tenant`](crate::IdempotencyLayer::require_tenant): `false` makes
    /// the tenant optional here (a public endpoint keyed as `anonymous`), `true`
    /// requires one here only.
    pub fn require_tenant(mut self, required: bool) -> RouteConfig {
        self.require_tenant = Some(required);
        self
    }

    /// Where a keyed request on this route names its tenant, in place of the layer's
    /// [`tenant_sources`](crate::IdempotencyLayer::tenant_sources) (or its tenant
    /// headers): a route that machine clients reach with certificates and people with
    /// tokens can say so. Only sources the layer can verify apply: a route naming a
    /// bearer token needs its [`Credential`](crate::Credential) in its sources.
    pub fn tenant_sources(mut self, sources: crate::sources::TenantSources) -> RouteConfig {
        self.tenant_sources = Some(Arc::new(sources));
        self
    }

    /// Whether this route's replays and conflicts say whether to retry, in the headers
    /// the Stripe SDKs and the SDKs Stainless generates obey; see
    /// [`IdempotencyLayer::retry_hints`](crate::IdempotencyLayer::retry_hints).
    pub fn retry_hints(mut self, hints: bool) -> RouteConfig {
        self.retry_hints = Some(hints);
        self
    }

    /// The dialect this route's own answers are written in, in place of the layer's
    /// ([`IdempotencyLayer::profile`](crate::IdempotencyLayer::profile)).
    pub fn profile(mut self, profile: crate::Profile) -> RouteConfig {
        self.profile = Some(profile);
        self
    }

    /// Where this route's answers publish their record's lifetime, in place of the
    /// layer's ([`IdempotencyLayer::retention_header`](crate::IdempotencyLayer::retention_header)).
    pub fn retention_header(mut self, choice: crate::HeaderChoice) -> RouteConfig {
        self.retention_header = Some(choice);
        self
    }

    /// How long a duplicate of an in-progress attempt on this route waits for its
    /// answer when it sends no `Prefer: wait` (for clients that cannot send it:
    /// browsers, shell scripts); see
    /// [`IdempotencyLayer::conflict_wait`](crate::IdempotencyLayer::conflict_wait).
    pub fn conflict_wait(mut self, wait: Duration) -> RouteConfig {
        self.conflict_wait = Some(wait);
        self
    }
}
