//! [`Idempotency`]: the middleware service, and the five stages of SPEC S5 at the HTTP
//! level.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{Fuse, FusedFuture};
use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{
    Endpoint, Fingerprint, FingerprintOptions, Key, Lease, Reservation, ReserveRequest, Scope,
    Store, StoreError, StoredResponse, Tenant, TenantKey,
};
use tower::{Layer, Service};

use crate::config::{Config, References, ReleaseStatuses, RouteConfig};
use crate::context::IdempotencyContext;
use crate::drain::{drain_body, drain_in_background};
use crate::execution::{Execution, panic_message};
use crate::future::ResponseFuture;
use crate::in_flight::InFlightGuard;
use crate::layer::{IdempotencyLayer, Shared};
use crate::policy::{Disposition, Observer, Outcome, ResourceReference};
use crate::problem::{Problem, ProblemKind};
use crate::spelling::{SentMethod, decided_method, look_alike, restore_sent_method, same_method};
use crate::{BoxError, IdempotencyBody};

/// The header that marks a replayed answer.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How often, and with what pauses, recording or releasing a key is tried before the
/// client gets its answer; [`settle_later`] goes on from there.
const WRITE_BACKOFF: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(400),
];

/// Idempotency-Key handling around an inner service; made by [`IdempotencyLayer`].
pub struct Idempotency<S, St> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<St>>,
}

impl<S, St: Store> Idempotency<S, St> {
    /// Wraps `inner` with the default settings, keeping records in `store`.
    pub fn new(inner: S, store: St) -> Idempotency<S, St> {
        IdempotencyLayer::new(store).layer(inner)
    }

    /// A layer to configure (same as [`IdempotencyLayer::new`]).
    pub fn layer(store: St) -> IdempotencyLayer<St> {
        IdempotencyLayer::new(store)
    }
}

impl<S, St> Idempotency<S, St> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// A handle on the executions started by this service (and its layer's others) and
    /// not yet recorded.
    pub fn in_flight(&self) -> crate::InFlight {
        self.shared.in_flight.clone()
    }
}

impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for Idempotency<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, St, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S, St>
where
    S: Service<Request<IdempotencyBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    St: Store,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<IdempotencyBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The instance that was driven ready is the one to call; keep a fresh clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let config = &shared.config;
        let (mut parts, body) = request.into_parts();

        // Decided on the method the upstream will act on (SPEC S14): a method-override
        // header's, where it must be; forwarded as sent.
        match decided_method(
            &config.keyed_methods,
            &config.method_override_headers,
            &parts,
        ) {
            Ok(None) => {}
            Ok(Some(method)) => {
                let sent = std::mem::replace(&mut parts.method, method);
                parts.extensions.insert(SentMethod(sent));
            }
            Err(detail) => {
                let detail = format!("{detail}; nothing was reserved or forwarded");
                return reject(
                    &*config.observer,
                    Problem::new(ProblemKind::InvalidMethodOverride, detail),
                    &parts,
                    body,
                );
            }
        }

        let route = config
            .route_config
            .as_ref()
            .and_then(|f| f(&parts))
            .unwrap_or_default();
        let keyed = route.keyed.unwrap_or_else(|| {
            config
                .keyed_methods
                .iter()
                .any(|m| same_method(m, &parts.method))
        });
        if !keyed {
            return pass_through(&mut inner, &*config.observer, parts, body);
        }
        let mut watched: Vec<&HeaderName> = Vec::with_capacity(4);
        watched.push(&config.header_name);
        if config.tenant_from.is_none() {
            watched.extend(config.tenant_headers.names());
        }
        if let Some((sent, meant)) = look_alike(&parts.headers, &watched) {
            let detail = format!(
                "the header {sent} is {meant} spelt with '_' for '-', which some upstream \
                 servers read as {meant}; send {meant} as it is spelt; nothing was reserved \
                 or forwarded"
            );
            return reject(
                &*config.observer,
                Problem::new(ProblemKind::AmbiguousHeader, detail),
                &parts,
                body,
            );
        }

        let fields = parts.headers.get_all(&config.header_name);
        let key = match Key::from_fields(fields.iter().map(HeaderValue::as_bytes)) {
            Ok(Some(key)) => key,
            Ok(None) => {
                let required = route
                    .require_key
                    .unwrap_or_else(|| (config.require_key)(&parts));
                if !required {
                    return pass_through(&mut inner, &*config.observer, parts, body);
                }
                let detail = format!(
                    "{} {} requires an {} header; generate one key per operation and \
                     send it with every retry",
                    parts.method,
                    parts.uri.path(),
                    config.header_name
                );
                return reject(
                    &*config.observer,
                    Problem::new(ProblemKind::MissingKey, detail),
                    &parts,
                    body,
                );
            }
            Err(e) => {
                return reject(
                    &*config.observer,
                    Problem::new(ProblemKind::InvalidKey, e.to_string()),
                    &parts,
                    body,
                );
            }
        };

        // A caller's extractor names the tenant now; the headers are hashed once the
        // key they are hashed under is in hand (it may have to come from the store).
        let tenant = config.tenant_from.as_ref().map(|f| f(&parts));
        if config.require_tenant {
            let named = match &tenant {
                Some(t) => t.as_str() != Tenant::ANONYMOUS,
                None => config.tenant_headers.carried_by(&parts.headers),
            };
            if !named {
                let wanted = match tenant {
                    Some(_) => "an authenticated tenant".to_owned(),
                    None => format!("one of the headers {}", config.tenant_headers.listed()),
                };
                let detail = format!(
                    "{} {} is keyed, and a keyed request must name its tenant: send {wanted}; \
                     nothing was reserved",
                    parts.method,
                    parts.uri.path()
                );
                return reject(
                    &*config.observer,
                    Problem::new(ProblemKind::MissingTenant, detail),
                    &parts,
                    body,
                );
            }
        }
        let plan = Plan::new(config, route, &parts, key, tenant);
        ResponseFuture::new(handle_keyed(shared, inner, parts, body, plan))
    }
}

/// What a keyed request will be reserved and recorded as. The layer's settings stay in
/// [`Config`]; a plan carries only what this request adds to them.
struct Plan {
    /// The tenant, when a caller's extractor named it; else the headers name it.
    tenant: Option<Tenant>,
    endpoint: Endpoint,
    key: Key,
    ttl: Duration,
    lease: Duration,
    /// The route's fingerprint options, which replace the layer's.
    fingerprint: Option<FingerprintOptions>,
    /// How the answer is recorded or released.
    answers: AnswerRules,
}

/// What a request's route says about its answer.
struct AnswerRules {
    /// Headers the route stores on top of the layer's allow-list.
    extra_headers: Vec<HeaderName>,
    /// The statuses that release the key: the route's, or the layer's.
    release_statuses: ReleaseStatuses,
}

impl Plan {
    fn new(
        config: &Config,
        route: RouteConfig,
        parts: &Parts,
        key: Key,
        tenant: Option<Tenant>,
    ) -> Plan {
        let template = route
            .endpoint
            .as_deref()
            .or_else(|| matched_path(parts))
            .unwrap_or_else(|| parts.uri.path());
        Plan {
            tenant,
            endpoint: endpoint(&parts.method, template),
            key,
            ttl: route.ttl.unwrap_or(config.ttl),
            lease: route.lease.unwrap_or(config.lease),
            fingerprint: route.fingerprint,
            answers: AnswerRules {
                extra_headers: route.stored_headers,
                release_statuses: route
                    .release_statuses
                    .unwrap_or_else(|| config.release_statuses.clone()),
            },
        }
    }
}

/// `Endpoint::new(method, template)` in one allocation instead of two.
fn endpoint(method: &Method, template: &str) -> Endpoint {
    let method = method.as_str();
    let mut raw = String::with_capacity(method.len() + 1 + template.len());
    raw.push_str(method);
    raw.make_ascii_uppercase();
    raw.push(' ');
    raw.push_str(template);
    Endpoint::from_raw(raw)
}

/// The request's fingerprint (SPEC S4) over `METHOD request-target`: the concrete path
/// and query, so that a key reused on `/orders/2/capture` is a mismatch, never order 1's
/// replay. The method is upper-cased, as in the endpoint, so that `post` after `POST`
/// replays rather than being a 422 (SPEC S14). A compressed body is fingerprinted by its
/// content, up to `limit` bytes of it (see [`coding`](crate::coding)).
pub(crate) fn fingerprint(
    parts: &Parts,
    body: &[u8],
    limit: usize,
    options: &FingerprintOptions,
) -> Fingerprint {
    let method = parts.method.as_str();
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    let mut request_target = String::with_capacity(method.len() + 1 + target.len());
    request_target.push_str(method);
    request_target.make_ascii_uppercase();
    request_target.push(' ');
    request_target.push_str(target);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let content = crate::coding::decoded(&parts.headers, body, limit);
    let body = content.as_deref().unwrap_or(body);
    let method = &request_target[..method.len()];
    Fingerprint::compute(method, &request_target, content_type, body, options)
}

/// The route template axum matched, when the layer runs inside a `Router`.
fn matched_path(parts: &Parts) -> Option<&str> {
    #[cfg(feature = "axum")]
    if let Some(path) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return Some(path.as_str());
    }
    let _ = parts;
    None
}

fn pass_through<S, ReqBody, ResBody>(
    inner: &mut S,
    observer: &dyn Observer,
    mut parts: Parts,
    body: ReqBody,
) -> ResponseFuture<ResBody, S::Error>
where
    S: Service<Request<IdempotencyBody<ReqBody>>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    observer.outcome(Outcome::PassedThrough);
    restore_sent_method(&mut parts);
    let future = inner.call(Request::from_parts(parts, IdempotencyBody::stream(body)));
    ResponseFuture::new(async move { Ok(future.await?.map(IdempotencyBody::stream)) })
}

/// Answers `problem` from the request's head alone; the unread body is read away
/// (see [`drain_body`]).
fn reject<B, E, ReqBody>(
    observer: &dyn Observer,
    problem: Problem,
    parts: &Parts,
    body: ReqBody,
) -> ResponseFuture<B, E>
where
    B: Send + 'static,
    E: Send + 'static,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
{
    drain_body(&parts.headers, body);
    observer.outcome(Outcome::Rejected);
    let response = problem.to_response().map(IdempotencyBody::buffered);
    ResponseFuture::new(std::future::ready(Ok(response)))
}

/// Buffers the body, then runs the rest as an [`Execution`]: once the body is read, a
/// client that goes away can no longer cancel anything.
///
/// A function returning an `async` block rather than an `async fn`: the block keeps its
/// captures in place, where an `async fn` would hold its arguments twice, and this future
/// is boxed, and so copied, once per request (around axum's router: 648 bytes instead of
/// 1080).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice in its state"
)]
fn handle_keyed<S, St, ReqBody, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    parts: Parts,
    body: ReqBody,
    plan: Plan,
) -> impl Future<Output = Result<Response<IdempotencyBody<ResBody>>, S::Error>> + Send + 'static
where
    S: Service<Request<IdempotencyBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    St: Store,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async move {
        let config = &shared.config;
        let tenant = match plan.tenant {
            Some(tenant) => tenant,
            None => {
                let key = config
                    .tenant_key
                    .get_or_try_init(|| TenantKey::from_store(&*shared.store))
                    .await;
                match key {
                    Ok(key) => config.tenant_headers.tenant(key, &parts.headers),
                    // Nothing is scoped without the secret: fail closed, as for any
                    // store outage.
                    Err(e) => {
                        let response = refuse(&*config.observer, Err(e));
                        return Ok(response.map(IdempotencyBody::buffered));
                    }
                }
            }
        };
        let scope = Scope::new(config.scope_mode, tenant, plan.endpoint, plan.key);
        let bytes = match buffer(&parts, body, config.body_limit, config.body_timeout).await {
            Ok(bytes) => bytes,
            Err(problem) => {
                config.observer.outcome(Outcome::Rejected);
                return Ok(problem.to_response().map(IdempotencyBody::buffered));
            }
        };
        let options = plan.fingerprint.as_ref().unwrap_or(&config.fingerprint);
        let fingerprint = fingerprint(&parts, &bytes, config.body_limit, options);
        let request = ReserveRequest::new(scope, fingerprint)
            .ttl(plan.ttl)
            .lease(plan.lease);

        // Counted from before the reservation until the answer is recorded, wherever the
        // execution ends up running.
        let guard = shared.in_flight.enter();
        let execution = Execution::new(answer(
            shared,
            inner,
            parts,
            bytes,
            request,
            plan.answers,
            guard,
        ));
        Ok(execution.await)
    }
}

/// Reads a keyed request's body up to `limit` bytes (SPEC S4), within `timeout` when
/// one is set. When it answers early (over the limit, too slow), what is left of the
/// body is read away in the background (see [`drain_body`]).
async fn buffer<B>(
    parts: &Parts,
    body: B,
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Bytes, Problem>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let too_large = || {
        Problem::new(
            ProblemKind::BodyTooLarge,
            format!("the request body is over the {limit}-byte limit for keyed requests"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        drain_body(&parts.headers, body);
        return Err(too_large());
    }
    // Boxed, so that what is left of it can be handed on after an early answer.
    let mut body = Box::pin(body);
    let collect = read_up_to(body.as_mut(), limit);
    let collected = match timeout {
        // The timer is only armed if the body is not all there at the first poll.
        Some(t) => match tokio::time::timeout(t, collect).await {
            Ok(collected) => collected,
            Err(_) => {
                drain_in_background(body);
                return Err(Problem::new(
                    ProblemKind::BodyTimeout,
                    format!(
                        "the request body did not arrive within {} ms; nothing was reserved",
                        t.as_millis()
                    ),
                ));
            }
        },
        None => collect.await,
    };
    match collected {
        Ok(bytes) => Ok(bytes),
        Err(None) => {
            drain_in_background(body);
            Err(too_large())
        }
        Err(Some(e)) => Err(Problem::new(
            ProblemKind::BodyUnreadable,
            format!("the request body could not be read: {e}"),
        )),
    }
}

/// Reads `body` whole, unless it is over `limit` bytes (`Err(None)`) or fails.
async fn read_up_to<B>(mut body: Pin<&mut B>, limit: usize) -> Result<Bytes, Option<BoxError>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut first = Bytes::new();
    let mut rest: Option<bytes::BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.as_mut().frame().await {
        let Ok(data) = frame.map_err(|e| Some(e.into()))?.into_data() else {
            continue;
        };
        len += data.len();
        if len > limit {
            return Err(None);
        }
        // One chunk, the usual case, is handed on without a copy.
        match &mut rest {
            None if first.is_empty() => first = data,
            None => {
                let mut joined = bytes::BytesMut::with_capacity(len);
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
                rest = Some(joined);
            }
            Some(joined) => joined.extend_from_slice(&data),
        }
    }
    Ok(rest.map_or(first, bytes::BytesMut::freeze))
}

/// SPEC S5's stages for one keyed request whose body is in hand; counted in flight
/// until `guard` drops with it.
///
/// One `async` block with small helpers rather than nested `async fn`s: each `async fn`
/// level keeps its arguments in its own state besides its caller's, and this future is
/// boxed, and so copied, once per request (around axum's router: 2.3 KB instead of
/// 3.8 KB).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice in its state"
)]
fn answer<S, St, ReqBody, ResBody>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    parts: Parts,
    bytes: Bytes,
    request: ReserveRequest,
    answers: AnswerRules,
    guard: InFlightGuard,
) -> impl Future<Output = Response<IdempotencyBody<ResBody>>> + Send + 'static
where
    S: Service<Request<IdempotencyBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    St: Store,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async move {
        let config = &shared.config;
        let observer = &*config.observer;
        let store = &*shared.store;
        let reserved = timed(observer, "reserve", store.reserve(&request)).await;
        let lease = match reserved {
            Ok(Reservation::Acquired(lease)) => lease,
            Ok(Reservation::Replay(stored)) if stored.reference().is_some() => {
                if !config.references.honoured() {
                    // Recorded where references are rendered (another instance, or this
                    // one before a change of settings): an empty body would be a lie.
                    observer.outcome(Outcome::ReplayUnavailable);
                    let reference = stored.reference().unwrap_or_default();
                    return replay_unavailable(reference, "this layer does not render references");
                }
                // Boxed: a rare path, kept out of every keyed request's future.
                let rendered = render(inner, parts, stored, config);
                let response = Box::pin(rendered).await;
                observer.outcome(if response.status().is_success() {
                    Outcome::Replayed
                } else {
                    Outcome::ReplayUnavailable
                });
                return response;
            }
            other => return refuse(observer, other).map(IdempotencyBody::buffered),
        };

        // Stage 2: the handler runs while the lease is renewed. A panic in it (or in
        // `call`) may follow effects: it is caught and recorded as a failure rather than
        // unwinding through the layer.
        let ReserveRequest {
            scope,
            fingerprint,
            lease: lease_for,
            ..
        } = request;
        let AnswerRules {
            extra_headers,
            release_statuses,
        } = answers;
        let context =
            IdempotencyContext::new(scope, lease.clone(), fingerprint, release_statuses.clone());
        let mut parts = parts;
        restore_sent_method(&mut parts);
        let mut req = Request::from_parts(parts, IdempotencyBody::buffered(bytes));
        req.extensions_mut().insert(context);
        let response_limit = config.response_limit;
        let render_references = config.references.honoured();
        // The disposition is known from the head. An answer to release is not recorded,
        // so it is passed on as it streams, whatever its size; the rest is read whole
        // (up to the limit) to be recorded.
        let handler = AssertUnwindSafe(async move {
            let response = inner.call(req).await.map_err(Into::into)?;
            let (mut head, body) = response.into_parts();
            let disposition = head.extensions.remove::<Disposition>().unwrap_or_else(|| {
                if release_statuses.contains(head.status) {
                    Disposition::Release
                } else {
                    Disposition::Record
                }
            });
            if matches!(disposition, Disposition::Release) {
                return Ok(Answered::Released(head, body));
            }
            if matches!(disposition, Disposition::Record)
                && let Some(reference) = head.extensions.remove::<ResourceReference>()
            {
                if render_references {
                    return Ok(Answered::Referenced(head, body, reference));
                }
                tracing::warn!(
                    reference = reference.as_str(),
                    "a ResourceReference is ignored unless the layer renders references; \
                     recording the answer whole"
                );
            }
            let bytes = Limited::new(body, response_limit)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, BoxError>(Answered::Whole(head, bytes, disposition))
        })
        .catch_unwind();
        let mut handler = pin!(handler);
        let result = with_heartbeat(store, observer, &lease, lease_for, handler.as_mut()).await;

        // Stages 3–4.
        let (mut head, body, disposition) = match result {
            Ok(Ok(Answered::Whole(head, body, disposition))) => (head, body, disposition),
            Ok(Ok(Answered::Released(mut head, body))) => {
                observer.outcome(Outcome::Released);
                settle(&shared, lease, lease_for, KeyWrite::Release, guard).await;
                head.extensions.clear();
                return Response::from_parts(head, IdempotencyBody::stream(body));
            }
            Ok(Ok(Answered::Referenced(mut head, body, reference))) => {
                let stored = stored_response(config, &extra_headers, &head, &Bytes::new())
                    .with_reference(reference.as_str());
                observer.outcome(Outcome::Executed);
                settle(&shared, lease, lease_for, KeyWrite::Complete(stored), guard).await;
                head.extensions.clear();
                return Response::from_parts(head, IdempotencyBody::stream(body));
            }
            Ok(Err(e)) if e.is::<LengthLimitError>() => {
                tracing::error!(
                    limit = config.response_limit,
                    "the handler's answer is over the response limit; recording a 500 in its place"
                );
                too_large_response(config.response_limit)
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "handler failed after it started; recording a 500");
                failed_response()
            }
            Err(panic) => {
                tracing::error!(
                    panic = panic_message(&*panic),
                    "handler panicked; recording a 500"
                );
                failed_response()
            }
        };
        match disposition {
            Disposition::Record => {
                let stored = stored_response(config, &extra_headers, &head, &body);
                observer.outcome(Outcome::Executed);
                settle(&shared, lease, lease_for, KeyWrite::Complete(stored), guard).await;
            }
            // Released answers left the handler early, streaming; none of the recorded
            // problems releases. Kept total all the same.
            Disposition::Release => {
                observer.outcome(Outcome::Released);
                settle(&shared, lease, lease_for, KeyWrite::Release, guard).await;
            }
            Disposition::KeepInProgress => {
                observer.outcome(Outcome::KeptInProgress);
                drop(guard);
            }
        }
        head.extensions.clear();
        Response::from_parts(head, IdempotencyBody::buffered(body))
    }
}

/// How the handler answered: read whole, to be recorded (or kept in progress), or a head
/// whose answer is released, or recorded as a reference, and streams on unread.
enum Answered<B> {
    Whole(http::response::Parts, Bytes, Disposition),
    Released(http::response::Parts, B),
    Referenced(http::response::Parts, B, ResourceReference),
}

/// The write that settles a key once its handler answered (SPEC S5 stages 3–4, S6).
enum KeyWrite {
    /// Record the answer and complete the record.
    Complete(StoredResponse),
    /// Delete the record, so that the key executes again.
    Release,
}

impl KeyWrite {
    fn op(&self) -> &'static str {
        match self {
            KeyWrite::Complete(_) => "complete",
            KeyWrite::Release => "release",
        }
    }

    async fn run<St: Store>(&self, store: &St, lease: &Lease) -> idem_core::Result<()> {
        match self {
            KeyWrite::Complete(stored) => store.complete(lease, stored).await,
            KeyWrite::Release => store.release(lease).await,
        }
    }
}

/// Settles the key: `write` is tried as [`WRITE_BACKOFF`] says before the caller gets
/// its answer. If the store failed every time (it is down, say), the caller gets the
/// answer anyway and [`settle_later`] goes on in the background, the request counted in
/// flight (`guard`) until it is done.
async fn settle<St: Store>(
    shared: &Arc<Shared<St>>,
    lease: Lease,
    lease_for: Duration,
    write: KeyWrite,
    guard: InFlightGuard,
) {
    let observer = &*shared.config.observer;
    for pause in WRITE_BACKOFF {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        match timed(observer, write.op(), write.run(&*shared.store, &lease)).await {
            Ok(()) => return,
            Err(StoreError::Fenced) => return fenced(&lease, &write),
            Err(e) => tracing::warn!(error = %e, op = write.op(), "settling the key failed"),
        }
    }
    observer.write_deferred(write.op());
    let shared = shared.clone();
    tokio::spawn(async move {
        let settled = settle_later(&shared, &lease, lease_for, &write).await;
        shared
            .config
            .observer
            .deferred_write_ended(write.op(), settled);
        drop(guard);
    });
}

fn fenced(lease: &Lease, write: &KeyWrite) {
    match write {
        KeyWrite::Complete(_) => tracing::warn!(
            scope = %lease.scope.digest(),
            attempt = lease.attempt,
            "the record was taken over before this attempt finished; its answer is not recorded"
        ),
        // Taken over or expired since: nothing of this attempt is left to release.
        KeyWrite::Release => {}
    }
}

/// The pauses between the tries of [`settle_later`]: growing to a few seconds.
const LATER_BACKOFF: [Duration; 5] = [
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
    Duration::from_millis(1600),
    Duration::from_secs(3),
];

/// A key write the first tries could not make (the store is down, say), tried again
/// after growing pauses for as long again as the lease. Until it is made, retries of
/// the key get 409; once the lease lapses one takes over, and after an unrecorded
/// answer the handler runs again (SPEC S7). So a store outage shorter than the lease
/// costs no second execution, and no retry waits out the lease after a release. A
/// takeover fences this attempt's token: a late write never touches a newer attempt's
/// record. `false` when it gave up.
async fn settle_later<St: Store>(
    shared: &Shared<St>,
    lease: &Lease,
    lease_for: Duration,
    write: &KeyWrite,
) -> bool {
    let observer = &*shared.config.observer;
    let deadline = tokio::time::Instant::now() + lease_for;
    let mut pauses = LATER_BACKOFF
        .iter()
        .chain(std::iter::repeat(&LATER_BACKOFF[4]));
    tracing::warn!(
        scope = %lease.scope.digest(),
        op = write.op(),
        "the key could not be settled yet; trying again while the client has its answer"
    );
    loop {
        let pause = *pauses.next().expect("an endless iterator");
        if tokio::time::Instant::now() + pause > deadline {
            tracing::error!(
                scope = %lease.scope.digest(),
                op = write.op(),
                "the key could not be settled; it stays in progress until its lease \
                 lapses, and then a retry executes again"
            );
            return false;
        }
        tokio::time::sleep(pause).await;
        match timed(observer, write.op(), write.run(&*shared.store, lease)).await {
            Ok(()) => {
                tracing::info!(
                    scope = %lease.scope.digest(),
                    op = write.op(),
                    "the key is settled after all"
                );
                return true;
            }
            Err(StoreError::Fenced) => {
                fenced(lease, write);
                return true;
            }
            Err(e) => tracing::debug!(error = %e, op = write.op(), "settling the key failed again"),
        }
    }
}

/// The answer to a reservation that did not acquire the key: stage 5's replay, or a
/// problem.
fn refuse(observer: &dyn Observer, reserved: idem_core::Result<Reservation>) -> Response<Bytes> {
    match reserved {
        Err(e) => {
            tracing::warn!(error = %e, "idempotency store failed; answering 503 without calling the handler");
            observer.outcome(Outcome::StoreUnavailable);
            Problem::new(
                ProblemKind::StoreUnavailable,
                "the idempotency store cannot be reached, so the request was not executed; retry with the same key",
            )
            .to_response()
        }
        Ok(Reservation::Replay(stored)) => {
            observer.outcome(Outcome::Replayed);
            replay(stored)
        }
        Ok(Reservation::InProgress { retry_after }) => {
            observer.outcome(Outcome::Conflict);
            Problem::new(
                ProblemKind::RequestInProgress,
                "a request with this key is still being processed; retry after the indicated time",
            )
            .retry_after(retry_after)
            .to_response()
        }
        Ok(Reservation::Mismatch) => {
            observer.outcome(Outcome::Mismatch);
            Problem::new(
                ProblemKind::KeyReused,
                "this key was already used for a request with a different method, path or body; \
                 use a new key for a new operation",
            )
            .to_response()
        }
        Ok(Reservation::Acquired(_)) => unreachable!("an acquired key is executed, not refused"),
    }
}

/// What is recorded of a response (SPEC S6): its status, the allow-listed headers and
/// the body.
fn stored_response(
    config: &Config,
    extra_headers: &[HeaderName],
    head: &http::response::Parts,
    body: &Bytes,
) -> StoredResponse {
    StoredResponse {
        status: head.status.as_u16(),
        headers: head
            .headers
            .iter()
            .filter(|(name, _)| {
                config.stored_headers.contains(name) || extra_headers.contains(name)
            })
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    Bytes::copy_from_slice(value.as_bytes()),
                )
            })
            .collect(),
        // A compact copy: `body` is often a slice of the connection's read buffer, which
        // a store that keeps the value (the memory store) would pin whole for the
        // record's lifetime, making the connection allocate a new buffer for every
        // response.
        body: Bytes::copy_from_slice(body),
    }
}

/// Awaits `handler` while renewing `lease` every third of its length (SPEC S7), so that
/// only a dead worker's lease ever expires. A renewal runs alongside the handler and
/// never holds it up; once the lease is lost, renewing stops.
async fn with_heartbeat<St: Store, T>(
    store: &St,
    observer: &dyn Observer,
    lease: &Lease,
    lease_for: Duration,
    mut handler: Pin<&mut impl Future<Output = T>>,
) -> T {
    let beat = (lease_for / 3).max(Duration::from_millis(1));
    // Registered with the timer only if the handler is still running after its first
    // poll.
    let mut sleep = pin!(tokio::time::sleep(beat));
    let mut renewal = pin!(Fuse::terminated());
    let mut renewing = true;
    loop {
        tokio::select! {
            biased;
            output = &mut handler => return output,
            () = &mut sleep, if renewing && renewal.is_terminated() => {
                renewal.set(timed(observer, "renew", store.renew(lease, lease_for)).fuse());
            }
            renewed = &mut renewal, if !renewal.is_terminated() => {
                match renewed {
                    Ok(()) => {}
                    Err(StoreError::Fenced) => {
                        tracing::warn!(
                            scope = %lease.scope.digest(),
                            attempt = lease.attempt,
                            "lease lost while the handler runs; its answer will not be recorded"
                        );
                        renewing = false;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease renewal failed; retrying at the next beat")
                    }
                }
                sleep.as_mut().reset(tokio::time::Instant::now() + beat);
            }
        }
    }
}

/// A problem answer that stands for an execution that ran, recorded and replayed.
fn recorded_problem(
    kind: ProblemKind,
    detail: String,
) -> (http::response::Parts, Bytes, Disposition) {
    let (head, body) = Problem::new(kind, detail).to_response().into_parts();
    (head, body, Disposition::Record)
}

fn failed_response() -> (http::response::Parts, Bytes, Disposition) {
    recorded_problem(
        ProblemKind::HandlerFailed,
        "the request failed while it was being processed and may have had effects; \
         this answer is final for this key"
            .into(),
    )
}

fn too_large_response(limit: usize) -> (http::response::Parts, Bytes, Disposition) {
    recorded_problem(
        ProblemKind::ResponseTooLarge,
        format!(
            "the request was executed, but its answer is over the {limit}-byte limit for \
             recorded answers and cannot be kept; this answer is final for this key"
        ),
    )
}

/// Stage 5: the recorded answer, marked as a replay.
fn replay(stored: StoredResponse) -> Response<Bytes> {
    let mut response = Response::new(stored.body.clone());
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in stored.http_headers() {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value.clone()),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => tracing::warn!(header = %name, "skipping a stored header that is not valid HTTP"),
        }
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// The 503 for an answer recorded as `reference` that cannot be rendered now, and why.
fn replay_unavailable<B>(reference: &str, why: &str) -> Response<IdempotencyBody<B>> {
    tracing::warn!(reference, "{why}");
    Problem::new(
        ProblemKind::ReplayUnavailable,
        format!(
            "this key's request was executed, and its answer is recorded as {reference}, \
             which could not be rendered now ({why}); retry with the same key, never a new one"
        ),
    )
    .to_response()
    .map(IdempotencyBody::buffered)
}

/// The headers that describe a representation, taken from a rendered answer rather
/// than from the recorded one.
const REPRESENTATION_HEADERS: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::ETAG,
    header::LAST_MODIFIED,
];

/// Stage 5 for an answer recorded as a [`ResourceReference`]: the layer's `renderer`,
/// or else the wrapped service, is asked for `GET <reference>` with the retry's headers,
/// and a 2xx answer is replayed under the recorded status and headers; anything else is
/// a 503 `replay-unavailable`.
async fn render<S, ReqBody, ResBody>(
    mut inner: S,
    parts: Parts,
    stored: StoredResponse,
    config: &Config,
) -> Response<IdempotencyBody<ResBody>>
where
    S: Service<Request<IdempotencyBody<ReqBody>>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
{
    let reference = stored.reference().unwrap_or_default().to_owned();
    let unavailable = |why: String| replay_unavailable(&reference, &why);
    let mut uri = http::Uri::builder();
    if let (Some(scheme), Some(authority)) = (parts.uri.scheme(), parts.uri.authority()) {
        uri = uri.scheme(scheme.clone()).authority(authority.clone());
    }
    let uri = match uri.path_and_query(reference.as_str()).build() {
        Ok(uri) => uri,
        Err(e) => return unavailable(format!("not a path: {e}")),
    };
    let mut headers = parts.headers;
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::TRANSFER_ENCODING,
        header::EXPECT,
    ] {
        headers.remove(name);
    }
    headers.remove(&config.header_name);
    let mut get = Request::new(());
    *get.method_mut() = Method::GET;
    *get.uri_mut() = uri;
    *get.version_mut() = parts.version;
    *get.headers_mut() = headers;
    *get.extensions_mut() = parts.extensions;
    let rendered = match &config.references {
        References::With(render) => render(get)
            .await
            .map(|rendered| rendered.map(IdempotencyBody::buffered)),
        References::ThroughService | References::Ignored => inner
            .call(get.map(|()| IdempotencyBody::buffered(Bytes::new())))
            .await
            .map(|rendered| rendered.map(IdempotencyBody::stream))
            .map_err(Into::into),
    };
    let rendered = match rendered {
        Ok(rendered) => rendered,
        Err(e) => return unavailable(format!("rendering failed: {e}")),
    };
    if !rendered.status().is_success() {
        return unavailable(format!("GET answered {}", rendered.status()));
    }
    let (head, body) = rendered.into_parts();
    let mut response = replay(stored).map(|_| body);
    let headers = response.headers_mut();
    for name in REPRESENTATION_HEADERS {
        headers.remove(&name);
        for value in head.headers.get_all(&name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(location) = HeaderValue::from_str(&reference) {
        headers.insert(header::CONTENT_LOCATION, location);
    }
    response
}

async fn timed<T>(
    observer: &dyn Observer,
    op: &'static str,
    call: impl Future<Output = idem_core::Result<T>>,
) -> idem_core::Result<T> {
    let started = Instant::now();
    let result = call.await;
    observer.store_call(op, started.elapsed(), result.is_ok());
    if let Err(e) = &result {
        observer.store_error(op, e);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_is_built_as_idem_core_builds_it() {
        let extension = Method::from_bytes(b"charge").unwrap();
        for method in [Method::POST, Method::PATCH, extension] {
            assert_eq!(
                endpoint(&method, "/v1/orders/{id}"),
                Endpoint::new(method.as_str(), "/v1/orders/{id}"),
            );
        }
    }
}
