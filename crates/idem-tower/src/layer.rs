//! [`IdempotencyLayer`]: the builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use idem_core::{FingerprintOptions, ScopeMode, Store, Tenant};
use tower::Layer;

use crate::config::{Config, References, ReleaseStatuses, RouteConfig, is_storable_header};
use crate::in_flight::InFlight;
use crate::observer::Observer;
use crate::service::Idempotency;
use crate::shared::Shared;

/// How many earlier layers' fingerprint rules a layer keeps (see
/// [`IdempotencyLayer::take_over_from`]).
const MAX_EARLIER_RULES: usize = 8;

/// Applies [`Idempotency`] to a service: Idempotency-Key handling over any
/// [`Store`].
///
/// Every builder method has a default that follows SPEC; see the [crate docs](crate).
pub struct IdempotencyLayer<St> {
    pub(crate) shared: Arc<Shared<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<St> fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .field("in_flight", &self.shared.in_flight.count())
            .finish_non_exhaustive()
    }
}

impl<St: Store> IdempotencyLayer<St> {
    /// A layer keeping its records in `store` (any [`Store`], `Arc<dyn Store>` too).
    pub fn new(store: St) -> IdempotencyLayer<St> {
        IdempotencyLayer::from_arc(Arc::new(store))
    }

    /// A layer keeping its records in a store shared with other code (a sweeper, an
    /// operator endpoint).
    pub fn from_arc(store: Arc<St>) -> IdempotencyLayer<St> {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                config: Config::default(),
                in_flight: InFlight::default(),
                store,
            }),
        }
    }
}

impl<St> IdempotencyLayer<St> {
    fn config(&mut self) -> &mut Config {
        // Builders run before the layer is shared; cloning here is the rare case of a
        // layer reconfigured after use, which keeps the earlier services unchanged.
        &mut Arc::make_mut(&mut self.shared).config
    }

    /// The store.
    pub fn store(&self) -> &Arc<St> {
        &self.shared.store
    }

    /// A handle on the executions this layer's services have started and not yet
    /// recorded, for graceful shutdown.
    pub fn in_flight(&self) -> InFlight {
        self.shared.in_flight.clone()
    }

    /// The header that carries the key (default `Idempotency-Key`).
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.config().header_name = name;
        self
    }

    /// The methods whose requests are keyed (default POST and PATCH). Other methods pass
    /// through untouched, key or not. A request's method is compared ignoring ASCII case
    /// and keyed as the method it matches (`post` as `POST`: in its scope and its
    /// fingerprint), while the inner service gets it as sent: most frameworks run `post`
    /// as `POST`, so a spelling must not sidestep the key.
    pub fn keyed_methods<I: IntoIterator<Item = Method>>(mut self, methods: I) -> Self {
        self.config().keyed_methods = methods.into_iter().collect();
        self
    }

    /// The method-override headers read to decide a request's method (default
    /// [`DEFAULT_METHOD_OVERRIDE_HEADERS`](crate::DEFAULT_METHOD_OVERRIDE_HEADERS):
    /// `X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`), since many
    /// frameworks run a request as the method such a header names. A request is keyed
    /// when its method or the one its override names is keyed, and decided on (in
    /// the route's settings, the scope and the fingerprint) as the keyed one of them:
    /// a `GET` overridden to `POST` is keyed as `POST`, a `POST` overridden to `GET`
    /// stays keyed as `POST`. Override values that do not name one method (two
    /// different ones, a value that is no method) are answered 400
    /// `invalid-method-override`. The inner service gets the request as sent,
    /// override headers included. No names: the method line alone decides, for a
    /// service that ignores such headers.
    pub fn method_override_headers<I: IntoIterator<Item = HeaderName>>(mut self, names: I) -> Self {
        self.config().method_override_headers = names.into_iter().collect();
        self
    }

    /// Whether every keyed request must carry a key (default `false`: requests without
    /// one pass through). A missing key on a required route is answered 400.
    pub fn require_key(mut self, required: bool) -> Self {
        self.config().require_key = Arc::new(move |_, _| required);
        self
    }

    /// Requires a key on the keyed requests for which `predicate` holds. It is given
    /// the method the request is decided on (a method-override header's, where it must
    /// be; see [`method_override_headers`](Self::method_override_headers)) and the head
    /// as sent.
    pub fn require_key_if<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&Method, &Parts) -> bool + Send + Sync + 'static,
    {
        self.config().require_key = Arc::new(predicate);
        self
    }

    /// Whether the endpoint is part of the scope (default [`ScopeMode::Public`]).
    pub fn scope_mode(mut self, mode: ScopeMode) -> Self {
        self.config().scope_mode = mode;
        self
    }

    /// The headers that name a request's tenant together, in order (default
    /// `Authorization` alone; see [`TenantHeaders`](crate::TenantHeaders) for how
    /// they are hashed). Replaces an extractor set with
    /// [`tenant_from`](Self::tenant_from).
    ///
    /// The tenant must stay the same across a client's retries of one operation. The
    /// default suits long-lived API keys; behind access tokens that are refreshed, a
    /// retry after a refresh would be a new tenant and execute again. There, name a
    /// header that carries the authenticated principal, or use
    /// [`tenant_from`](Self::tenant_from).
    pub fn tenant_headers<I: IntoIterator<Item = HeaderName>>(mut self, names: I) -> Self {
        let config = self.config();
        config.tenant_headers = crate::TenantHeaders::new(names);
        config.tenant_from = None;
        self
    }

    /// The key the tenant headers are hashed under (SPEC S3). Every instance in front
    /// of one store must use the same one.
    ///
    /// Without it, the layer uses the store's own secret: before it scopes its first
    /// keyed request it calls [`TenantKey::from_store`](idem_core::TenantKey::from_store),
    /// which reads the secret the store keeps, or generates and stores one on the
    /// store's first use, so every instance sharing the store and every restart agree.
    /// Until the store answers, keyed requests get the 503 `store-unavailable` that a
    /// store outage gives, and the handler is not called. (A [`MemoryStore`] keeps its
    /// secret in the process, like its records.)
    ///
    /// [`MemoryStore`]: idem_core::MemoryStore
    pub fn tenant_key(mut self, key: idem_core::TenantKey) -> Self {
        self.config().tenant_key = Arc::new(tokio::sync::OnceCell::new_with(Some(key)));
        self
    }

    /// Whether a keyed request must name a tenant (default `false`: one that does not
    /// is `anonymous`). A keyed request that carries none of the tenant headers (or,
    /// with [`tenant_from`](Self::tenant_from), whose tenant is `anonymous`) is then
    /// answered 401 `missing-tenant` with `WWW-Authenticate: Bearer`; nothing is
    /// reserved and the handler is not called. Unkeyed requests are not affected.
    pub fn require_tenant(mut self, required: bool) -> Self {
        self.config().require_tenant = required;
        self
    }

    /// Names a keyed request's tenant from `sources`, in their order (see
    /// [`TenantSources`](crate::TenantSources)): a verified bearer token (a
    /// [`Credential`](crate::Credential), such as the `idem-jwt` crate's verifier of
    /// JWTs; a refreshed token for the same principal names the same tenant, so a
    /// retry after a refresh replays instead of executing again), a
    /// [`Principal`](crate::Principal) your authentication middleware put in the
    /// extensions, the tenant headers. A keyed request whose bearer token does not
    /// verify is answered 401 `invalid-credential`
    /// (`WWW-Authenticate: Bearer error="invalid_token"`); nothing is reserved and the
    /// handler is not called. Unkeyed requests are not looked at. Replaces an extractor
    /// set with [`tenant_from`](Self::tenant_from).
    pub fn tenant_sources(mut self, sources: crate::TenantSources) -> Self {
        let config = self.config();
        config.sources = Some(sources);
        config.tenant_from = None;
        self
    }

    /// Names a request's tenant with `extractor` instead of the tenant headers: an
    /// account id your authentication layer put in the request's extensions, say,
    /// never an unverified claim. The name is stored as returned, so it must not be a
    /// credential; hash one with an [`idem_core::TenantKey`].
    pub fn tenant_from<F>(mut self, extractor: F) -> Self
    where
        F: Fn(&Parts) -> Tenant + Send + Sync + 'static,
    {
        let config = self.config();
        config.tenant_from = Some(Arc::new(extractor));
        config.sources = None;
        self
    }

    /// How bodies are fingerprinted (JSON pointers to leave out).
    pub fn fingerprint_options(mut self, options: FingerprintOptions) -> Self {
        self.config().fingerprint = options;
        self
    }

    /// The largest keyed request body buffered, in bytes (default 1 MiB). Larger bodies
    /// are answered 413 and nothing is reserved.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.config().body_limit = limit;
        self
    }

    /// The longest a keyed request's body may take to arrive whole (default: no limit).
    /// A slower one is answered 408 `body-timeout` and nothing is reserved, so a client
    /// that trickles its body holds neither a connection's buffer nor a key for long.
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.config().body_timeout = Some(timeout);
        self
    }

    /// The largest answer recorded, in bytes (default [`DEFAULT_RESPONSE_LIMIT`], 8 MiB).
    /// Answers are held whole to be recorded; when the handler's answer is larger, it
    /// has run, so its answer is replaced by a 500 `response-too-large` problem (a
    /// [`Proxied`](crate::Proxied) answer by a 502 `upstream-answer-too-large`), which
    /// is recorded and replayed: the operation never runs twice, and memory stays
    /// bounded. An answer that is released rather than recorded (a release status, or
    /// [`Disposition::Release`](crate::Disposition::Release)) is not held: it streams to
    /// the client unread, whatever its size.
    ///
    /// [`DEFAULT_RESPONSE_LIMIT`]: crate::DEFAULT_RESPONSE_LIMIT
    pub fn response_limit(mut self, limit: usize) -> Self {
        self.config().response_limit = limit;
        self
    }

    /// Honours [`ResourceReference`](crate::ResourceReference) response extensions
    /// (SPEC S6): such an answer is recorded as its head and the reference, and a
    /// replay renders it again by calling the wrapped service with `GET <reference>`.
    /// Off by default, when the extension is ignored and the answer recorded whole (and
    /// a record made with references on, by another instance, replays as a 503
    /// `replay-unavailable` rather than with an empty body).
    ///
    /// Turn it on only where the wrapped service routes a `GET` by its path: a whole
    /// router the layer wraps (`layer.layer(router)`), or a proxy (the idem gateway).
    /// **Not** under axum's `Router::layer` or `route_layer`: there the layer wraps
    /// each route's handler for one method, and the `GET` would run the `POST`
    /// handler again; use [`render_references_with`](Self::render_references_with)
    /// there.
    pub fn render_references(mut self, on: bool) -> Self {
        self.config().references = if on {
            References::ThroughService
        } else {
            References::Ignored
        };
        self
    }

    /// Honours [`ResourceReference`](crate::ResourceReference) response extensions, as
    /// [`render_references`](Self::render_references) does, but renders them with `f`
    /// instead of the wrapped service, so it works wherever the layer sits, under
    /// axum's `Router::layer` too. `f` gets `GET <reference>` with the retry's headers
    /// and extensions and no body, and answers the resource whole (a replay holds it in
    /// memory; nothing of it is stored); an error, or a status other than 2xx, is a 503
    /// `replay-unavailable`.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use idem_core::MemoryStore;
    /// use idem_tower::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).render_references_with(
    ///     |get: http::Request<()>| async move {
    ///         // Look the report up by `get.uri()` and serialise it.
    ///         let report = format!("rendered {}", get.uri());
    ///         http::Response::builder()
    ///             .header("content-type", "text/plain")
    ///             .body(Bytes::from(report))
    ///     },
    /// );
    /// # let _ = layer;
    /// ```
    pub fn render_references_with<F, Fut, E>(mut self, f: F) -> Self
    where
        F: Fn(http::Request<()>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<http::Response<bytes::Bytes>, E>> + Send + 'static,
        E: Into<crate::BoxError>,
    {
        self.config().references = References::With(std::sync::Arc::new(move |get| {
            let rendered = f(get);
            Box::pin(async move { rendered.await.map_err(Into::into) })
        }));
        self
    }

    /// How long records live (default 24 h), counted from the first request: a completed
    /// record is replayed until then. A record in progress lives at least until its
    /// lease lapses, even past the TTL; an attempt that outruns the TTL is recorded, but
    /// its answer is not replayed.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config().ttl = ttl;
        self
    }

    /// How long, after a completed record expires, a compact tombstone of it (its
    /// fingerprint, completion time and status; no body, no headers) refuses a retry
    /// with `410 Gone`, problem `key-expired`, instead of executing it again (SPEC S16).
    /// A retry with another payload is still 422. Zero, the default, keeps none: after
    /// the TTL the key executes again, as Stripe's keys do. Tombstones are purged at
    /// their end like records; the store holds about (keyed requests per second) ×
    /// (this TTL) of them.
    pub fn tombstone_ttl(mut self, tombstone: Duration) -> Self {
        self.config().tombstone = tombstone;
        self
    }

    /// How long an attempt's lease lasts (default 60 s); a running handler's lease is
    /// renewed every third of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config().lease = lease.max(Duration::from_millis(3));
        self
    }

    /// Response headers to store and replay besides the
    /// [`DEFAULT_STORED_HEADERS`](crate::DEFAULT_STORED_HEADERS) (`content-type`,
    /// `content-encoding`, `location` and the CORS headers that let a browser read the
    /// answer).
    /// Names in [`NEVER_STORED_HEADERS`](crate::NEVER_STORED_HEADERS) (`date`,
    /// `set-cookie`, trace and request ids, framing) are ignored.
    pub fn store_headers<I: IntoIterator<Item = HeaderName>>(mut self, names: I) -> Self {
        let config = self.config();
        for name in names.into_iter().filter(is_storable_header) {
            if !config.stored_headers.contains(&name) {
                config.stored_headers.push(name);
            }
        }
        self
    }

    /// The response statuses that release the key instead of recording the response
    /// (default the profile's, [`ReleaseStatuses::of_profile`]: SPEC S6's 400 401 403
    /// 404 405 408 409 413 415 422 429 503, and under `acp` every 5xx). Replaces the
    /// set for every profile.
    pub fn release_statuses<I: IntoIterator<Item = StatusCode>>(mut self, statuses: I) -> Self {
        self.config().release_statuses = Some(ReleaseStatuses::new(statuses));
        self
    }

    /// The gRPC statuses that release the key of a gRPC call instead of recording its
    /// answer (SPEC S18; default [`DEFAULT_GRPC_RELEASE_CODES`](crate::DEFAULT_GRPC_RELEASE_CODES)).
    /// Replaces the set.
    pub fn grpc_release_codes(mut self, codes: crate::GrpcReleaseCodes) -> Self {
        self.config().grpc_release_codes = codes;
        self
    }

    /// Whether the layer's answers tell unmodified SDKs whether to retry (default off):
    /// a replayed 5xx carries `Stripe-Should-Retry: false` and `X-Should-Retry: false`
    /// (retrying cannot change a recorded answer), and a 409 `request-in-progress` and a
    /// 503 `store-unavailable` carry `true`. The Stripe SDKs and the SDKs Stainless
    /// generates obey these headers over their own rules. A route may say otherwise
    /// ([`RouteConfig::retry_hints`]).
    pub fn retry_hints(mut self, hints: bool) -> Self {
        self.config().retry_hints = hints;
        self
    }

    /// The dialect of the layer's own answers (default [`Profile::Ietf`](crate::Profile::Ietf): RFC 9457
    /// problem details): a key reused with another payload is 422 under `ietf`, a 400
    /// `idempotency_error` in Stripe's error envelope under `stripe`, and so on (the
    /// table at [`Profile`]). It changes how answers are written, never what becomes of
    /// a key. A route may say otherwise ([`RouteConfig::profile`]).
    ///
    /// [`Profile`]: crate::Profile
    pub fn profile(mut self, profile: crate::Profile) -> Self {
        self.config().profile = profile;
        self
    }

    /// Where every answer to a keyed request publishes its record's lifetime, in whole
    /// seconds (SPEC S23): by default where the request's profile says (`acp`, in
    /// [`RETENTION_HEADER`](crate::RETENTION_HEADER)), else nowhere. A route may say
    /// otherwise ([`RouteConfig::retention_header`]).
    pub fn retention_header(mut self, choice: crate::HeaderChoice) -> Self {
        self.config().retention_header = choice;
        self
    }

    /// The name of the header that marks a replay (default: the profile's,
    /// [`IDEMPOTENT_REPLAYED`](crate::IDEMPOTENT_REPLAYED) under every profile). Not one
    /// of [`LAYER_HEADERS`](crate::LAYER_HEADERS), which the layer writes for other ends.
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.config().replay_header = Some(name);
        self
    }

    /// How long a duplicate that finds its key's first attempt in progress waits for
    /// that attempt's answer when it sends no `Prefer: wait=N` (default zero: 409 at
    /// once). A route may say otherwise ([`RouteConfig::conflict_wait`]). See
    /// [`max_wait`](Self::max_wait) for the bounds of any wait (SPEC S15).
    pub fn conflict_wait(mut self, wait: Duration) -> Self {
        self.config().conflict_wait = wait;
        self
    }

    /// The longest a duplicate waits for an in-progress attempt (default 30 s),
    /// whatever its `Prefer: wait=N` asks; a wait is also never longer than the route's
    /// lease. A waiter that hears (through the store's [`Store::watch`](idem_core::Store::watch),
    /// or by polling) that the attempt completed gets its replay, with
    /// `Preference-Applied: wait=N` when it asked; one whose attempt released the key
    /// executes as the next attempt; one still waiting at the end gets 409 with
    /// `Retry-After`. Zero turns waiting off.
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.config().max_wait = max;
        self
    }

    /// The most duplicates that wait at once, across every service this layer makes
    /// (default 1024); beyond it, a duplicate gets 409 at once. A waiter whose client
    /// hangs up frees its slot.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.config().waiters = crate::wait::Waiters::new(max);
        self
    }

    /// At most `max` keyed requests of one tenant in progress at once through this
    /// layer (and its clones); `0` for no cap (the default). A keyed request over the
    /// cap is answered 429 `too-many-in-flight` with `Retry-After: 1` before its body
    /// is read: nothing is reserved, the handler is not called, and its retry is free
    /// to run once the tenant's other requests end. A request counts from when its
    /// tenant is named until its answer is recorded, replayed or refused, a detached
    /// execution whose client went away included.
    ///
    /// Requests without a tenant share the `anonymous` tenant, and so its cap: pair
    /// this with [`require_tenant`](Self::require_tenant) where every client has one.
    pub fn tenant_max_in_flight(mut self, max: usize) -> Self {
        self.config().tenant_limits.set_max_in_flight(max);
        self
    }

    /// At most `rate` new keys per tenant (`None`, the default: no limit). A keyed
    /// request that would execute a key for the first time, once its tenant's bucket is
    /// empty, is answered 429 `key-rate-exceeded` with `Retry-After`; its reservation
    /// is released and the handler is not called. Replays, conflicts and takeovers of a
    /// lapsed attempt take no token.
    ///
    /// Where the store keeps buckets for every instance
    /// ([`Store::take_rate_token`](idem_core::Store::take_rate_token) answers `Some`:
    /// PostgreSQL and Redis), the rate is shared by every instance on that store, at
    /// the cost of one more store call per new key; elsewhere (memory, SQLite) each
    /// layer keeps its own buckets. A store that fails that call lets the key through
    /// (the limit protects, it never decides an outcome) and is logged.
    pub fn tenant_key_rate(mut self, rate: Option<idem_core::KeyRate>) -> Self {
        self.config().tenant_limits.set_key_rate(rate);
        self
    }

    /// At most `rate` new keys, all together, of the tenants no verified source named
    /// (`None`, the default: no such limit), on this layer and its clones. A tenant
    /// named by the tenant headers is whatever a client sends: a client that makes up
    /// a tenant per request is under every limit per tenant, and only this bounds it.
    /// Unverified are the tenants named by the tenant headers (unless
    /// [`tenant_headers_verified`](Self::tenant_headers_verified)) and `anonymous`;
    /// verified, those named by a [`Credential`](crate::Credential), a
    /// [`Principal`](crate::Principal) or the caller's
    /// [`tenant_from`](Self::tenant_from). A new key over it is answered as one over
    /// its tenant's own rate (429 `key-rate-exceeded`, the key released); the bucket
    /// is this process's, whatever the store, and carried over by
    /// [`take_over_from`](Self::take_over_from).
    pub fn unverified_key_rate(mut self, rate: Option<idem_core::KeyRate>) -> Self {
        self.config().tenant_limits.set_unverified_key_rate(rate);
        self
    }

    /// Whether the tenant headers name verified tenants (`false`, the default): say
    /// `true` where only an ingress in front of the layer can set them (it removes
    /// them from every other client's requests), so that the tenants they name are
    /// not counted under [`unverified_key_rate`](Self::unverified_key_rate).
    pub fn tenant_headers_verified(mut self, verified: bool) -> Self {
        self.config().tenant_limits.set_headers_verified(verified);
        self
    }

    /// One tenant's limits in place of the layer's
    /// ([`tenant_max_in_flight`](Self::tenant_max_in_flight),
    /// [`tenant_key_rate`](Self::tenant_key_rate)). `tenant` is the tenant as stored
    /// (`hmac-sha256:…`, as `idem keys list` shows it), at least its first
    /// [`MIN_TENANT_PREFIX`](crate::MIN_TENANT_PREFIX) hex digits (the form the
    /// gateway's per-tenant metrics label it with), or `anonymous`; where several
    /// match, the longest wins. A name of no such form is refused
    /// ([`check_tenant_name`](crate::check_tenant_name)).
    pub fn tenant_override(
        mut self,
        tenant: impl Into<String>,
        limits: crate::TenantOverride,
    ) -> Result<Self, crate::TenantNameError> {
        let tenant = tenant.into();
        crate::tenant_limit::check_tenant_name(&tenant)?;
        self.config().tenant_limits.set_override(tenant, limits);
        Ok(self)
    }

    /// Makes this layer the successor of `earlier`, a layer over the same store whose
    /// settings it replaces (a configuration reloaded while serving): the executions
    /// `earlier` has in flight count as this layer's (for [`in_flight`](Self::in_flight)
    /// and graceful shutdown), and so do its waiting duplicates and its tenants'
    /// requests and rate buckets under this layer's limits; the store's tenant secret,
    /// once read, is not read again. A record reserved under `earlier`'s fingerprint
    /// rules (or those of the layers before it, up to eight) is compared by them: a
    /// retry of it replays, where this layer's rules alone would answer 422. Call it
    /// last, after every other setting.
    pub fn take_over_from(mut self, earlier: &IdempotencyLayer<St>) -> Self {
        let now = idem_core::Clock::now(&idem_core::SystemClock);
        let before = &earlier.shared.config;
        let shared = Arc::make_mut(&mut self.shared);
        shared.in_flight = earlier.shared.in_flight.clone();
        let config = &mut shared.config;
        if config.tenant_key.get().is_none() {
            config.tenant_key = before.tenant_key.clone();
        }
        config.waiters = config.waiters.counted_with(&before.waiters);
        config.tenant_limits = config
            .tenant_limits
            .clone()
            .counted_with(&before.tenant_limits);
        let mut earlier_rules = vec![crate::config::Earlier {
            until: now,
            fingerprint: before.fingerprint.clone(),
            route_config: before.route_config.clone(),
        }];
        earlier_rules.extend(before.earlier.iter().cloned());
        earlier_rules.truncate(MAX_EARLIER_RULES);
        config.earlier = earlier_rules;
        self
    }

    /// Per-route overrides: called once per request with the method it is decided on
    /// (a method-override header's, where it must be; see
    /// [`method_override_headers`](Self::method_override_headers)) and its head as sent;
    /// `None` keeps the layer's settings. Match routes on that method, not on
    /// `parts.method`, so that an override cannot pick another route's rules.
    pub fn route_config<F>(mut self, f: F) -> Self
    where
        F: Fn(&Method, &Parts) -> Option<RouteConfig> + Send + Sync + 'static,
    {
        self.config().route_config = Some(Arc::new(f));
        self
    }

    /// Hooks for metrics and logs.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.config().observer = observer;
        self
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency {
            inner,
            shared: self.shared.clone(),
        }
    }
}
