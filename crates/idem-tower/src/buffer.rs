//! Stage 1 of a keyed request (SPEC S3, S4): its scope, its body read up to the limit,
//! and its fingerprint.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, header};
use http_body::Body;
use http_body_util::BodyExt;
use idem_core::{ReserveRequest, Scope, Store, TenantKey};
use tower::Service;

use crate::body_key::{Incoming, Resolved};
use crate::bounds::{Inner, ReadBody};
use crate::detach::Execution;
use crate::drain::{drain_body, drain_in_background};
use crate::execute::execute;
use crate::fingerprint::fingerprint;
use crate::handled::Handled;
use crate::observer::Outcome;
use crate::plan::{Plan, PlanKey};
use crate::problem::{Problem, ProblemKind};
use crate::profile::Dialect;
use crate::replay::refuse;
use crate::shared::Shared;
use crate::sources::Applying;
use crate::{BoxError, IdempotencyBody};

/// Stage 1 of a keyed request: names its tenant, buffers its body and fingerprints it,
/// then runs the rest as an [`Execution`] ([`execute`]): once the body is read, a client
/// that goes away can no longer cancel anything.
///
/// A function returning an `async` block rather than an `async fn`: the block keeps its
/// captures in place, where an `async fn` would hold its arguments twice, and this future
/// is boxed, and so copied, once per request (around axum's router: 648 bytes instead of
/// 1080).
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice in its state"
)]
pub(crate) fn keyed<S, St, ReqBody, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    parts: Parts,
    body: ReqBody,
    plan: Plan,
) -> impl Future<Output = Result<Response<IdempotencyBody<ResBody>>, S::Error>> + Send + 'static
where
    S: Inner<ReqBody, ResBody>,
    St: Store,
    ReqBody: ReadBody,
    ResBody: ReadBody,
{
    async move {
        // ACP's profile echoes the key on every answer to a keyed request.
        let sent = match &plan.key {
            PlanKey::Known(key) => Some(key),
            PlanKey::Pending(pending) => pending.header_key.as_ref(),
        };
        let echo = sent
            .filter(|_| crate::profile::Speaks::echoes_key(plan.answers.profile))
            .and_then(|key| http::HeaderValue::from_str(&key.to_sf_string()).ok());
        let mut answered = run_keyed(shared, inner, parts, body, plan).await;
        if let (Some(echo), Ok(response)) = (echo, &mut answered) {
            response.headers_mut().insert(ECHOED_KEY, echo);
        }
        answered
    }
}

/// The header ACP's profile echoes the key in.
const ECHOED_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// [`keyed`] without the key's echo.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice in its state"
)]
fn run_keyed<S, St, ReqBody, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    parts: Parts,
    body: ReqBody,
    plan: Plan,
) -> impl Future<Output = Result<Response<IdempotencyBody<ResBody>>, S::Error>> + Send + 'static
where
    S: Inner<ReqBody, ResBody>,
    St: Store,
    ReqBody: ReadBody,
    ResBody: ReadBody,
{
    async move {
        let config = &shared.config;
        let observer = &*config.observer;
        let dialect = plan.answers.dialect();
        let grpc = dialect.grpc;
        // The method it is decided on, as the endpoint names it (its scope may not).
        let method = http::Method::from_bytes(plan.endpoint.method().as_bytes())
            .unwrap_or_else(|_| parts.method.clone());
        let (key, incoming) = match plan.key {
            PlanKey::Known(key) => (key, Incoming::Stream(body)),
            PlanKey::Pending(pending) => {
                // The key, if any, is in the body: read it first.
                let bytes = match buffer(&parts, body, config.body_limit, config.body_timeout).await
                {
                    Ok(bytes) => bytes,
                    Err(problem) => return Ok(rejected(observer, &problem, dialect)),
                };
                match pending.resolve(&parts.headers, &bytes) {
                    Resolved::Key(key) => (key, Incoming::Read(bytes)),
                    Resolved::Refused(problem) => return Ok(rejected(observer, &problem, dialect)),
                    Resolved::Unkeyed => {
                        // Answered as any unkeyed request is, in the layer's profile.
                        let dialect = Dialect {
                            grpc,
                            profile: config.profile,
                        };
                        return pass_through_read(inner, parts, bytes, dialect, observer).await;
                    }
                }
            }
        };
        let tenant = match plan.tenant {
            Some(tenant) => tenant,
            None => {
                let key = config
                    .tenant_key
                    .get_or_try_init(|| TenantKey::from_store(&*shared.store))
                    .await;
                let sources = plan.sources.as_deref().or(config.sources.as_ref());
                match key {
                    Ok(key) if let Some(sources) = sources => {
                        match sources_tenant(config, sources, key, &method, &parts).await {
                            Ok(tenant) => tenant,
                            Err(problem) => {
                                incoming.drain(&parts.headers);
                                return Ok(rejected(observer, &problem, dialect));
                            }
                        }
                    }
                    Ok(key) => config.tenant_headers.tenant(key, &parts.headers),
                    // Nothing is scoped without the secret: fail closed, as for any
                    // store outage.
                    Err(e) => {
                        let hints = plan.answers.retry_hints;
                        return Ok(refuse(observer, Err(e), dialect, hints));
                    }
                }
            }
        };
        observer.tenant_keyed(&tenant);
        let slot = match config.tenant_limits.try_enter(&tenant) {
            Ok(slot) => slot,
            Err(max) => {
                observer.tenant_limited(&tenant, "in_flight");
                incoming.drain(&parts.headers);
                let detail = format!(
                    "this tenant has {max} keyed requests in progress, its most at once; \
                     nothing was reserved: retry once one of them has its answer"
                );
                let problem = Problem::new(ProblemKind::TooManyInFlight, detail)
                    .retry_after(Duration::from_secs(1));
                return Ok(rejected(observer, &problem, dialect));
            }
        };
        let scope = Scope::new(config.scope_mode, tenant, plan.endpoint, key);
        let read = match incoming {
            Incoming::Read(bytes) => Ok(bytes),
            Incoming::Stream(body) => {
                buffer(&parts, body, config.body_limit, config.body_timeout).await
            }
        };
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(problem) => {
                observer.outcome(Outcome::Rejected);
                let mut response = problem.answer(dialect).map(IdempotencyBody::buffered);
                Handled::keyed(&mut response, Outcome::Rejected, &scope, None);
                return Ok(response);
            }
        };
        if grpc && !crate::grpc::is_one_message(&bytes) {
            observer.outcome(Outcome::Rejected);
            let mut response = crate::grpc::not_unary().map(IdempotencyBody::buffered);
            Handled::keyed(&mut response, Outcome::Rejected, &scope, None);
            return Ok(response);
        }
        let options = plan.fingerprint.as_ref().unwrap_or(&config.fingerprint);
        let fingerprint = if grpc {
            crate::grpc::fingerprint(&parts, &bytes, options)
        } else {
            let path = plan.fingerprint_path.as_deref();
            let read = fingerprint(
                &parts,
                method.as_str(),
                path,
                &bytes,
                config.body_limit,
                options,
            );
            match read {
                Ok(fingerprint) => fingerprint,
                Err(repeated) => {
                    observer.outcome(Outcome::Rejected);
                    let problem = Problem::duplicate_member(repeated.name());
                    let mut response = problem.answer(dialect).map(IdempotencyBody::buffered);
                    Handled::keyed(&mut response, Outcome::Rejected, &scope, None);
                    return Ok(response);
                }
            }
        };
        let request = ReserveRequest::new(scope, fingerprint)
            .ttl(plan.ttl)
            .lease(plan.lease)
            .tombstone(plan.tombstone);

        // Counted from before the reservation until the answer is recorded, wherever the
        // execution ends up running.
        let guard = shared.in_flight.enter(slot);
        let parked = Arc::new(AtomicBool::new(false));
        let execution = Execution::new(
            execute(
                shared,
                inner,
                method,
                parts,
                bytes,
                request,
                plan.answers,
                guard,
                parked.clone(),
            ),
            parked,
            dialect,
        );
        Ok(execution.await)
    }
}

/// The answer `problem` to a request refused before anything was reserved.
pub(crate) fn rejected<B>(
    observer: &dyn crate::Observer,
    problem: &Problem,
    dialect: crate::profile::Dialect,
) -> Response<IdempotencyBody<B>> {
    observer.outcome(Outcome::Rejected);
    let mut response = problem.answer(dialect).map(IdempotencyBody::buffered);
    Handled::mark(&mut response, Outcome::Rejected);
    response
}

/// A request read to find its key in the body, which names none on a route that does
/// not require one: to the inner service untouched, its body as read; a proxy's failure
/// answered in `dialect`.
async fn pass_through_read<S, ReqBody, ResBody>(
    mut inner: S,
    parts: Parts,
    bytes: Bytes,
    dialect: Dialect,
    observer: &dyn crate::Observer,
) -> Result<Response<IdempotencyBody<ResBody>>, S::Error>
where
    S: Service<Request<IdempotencyBody<ReqBody>>, Response = Response<ResBody>>,
    S::Error: 'static,
{
    observer.outcome(Outcome::PassedThrough);
    let request = Request::from_parts(parts, IdempotencyBody::buffered(bytes));
    crate::forward::passed_through(inner.call(request).await, dialect, observer)
}

/// The tenant of a keyed request under a layer with [`TenantSources`]: the first
/// source that applies names it; a bearer token that does not verify is the 401
/// `invalid-credential`.
///
/// [`TenantSources`]: crate::TenantSources
async fn sources_tenant(
    config: &crate::config::Config,
    sources: &crate::TenantSources,
    key: &TenantKey,
    method: &http::Method,
    parts: &Parts,
) -> Result<idem_core::Tenant, Problem> {
    match sources.applying(parts, &config.tenant_headers) {
        Some(Applying::Credential(credential, found)) => match credential.principal(found).await {
            Ok(principal) => Ok(principal.tenant(key)),
            Err(e) => {
                let detail = format!(
                    "{} {} is keyed, and its bearer token was not accepted: {e}; nothing \
                     was reserved or forwarded",
                    method,
                    parts.uri.path()
                );
                Err(Problem::new(ProblemKind::InvalidCredential, detail))
            }
        },
        Some(Applying::Principal(principal)) => Ok(principal.tenant(key)),
        Some(Applying::Headers) => Ok(config.tenant_headers.tenant(key, &parts.headers)),
        None => Ok(idem_core::Tenant::anonymous()),
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
    // A body that says its length (`Content-Length`) is joined in one allocation of
    // that size, rather than in a buffer that doubles (and so, for a moment, is held
    // twice) as it grows.
    let expected = body
        .size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= limit);
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
                let mut joined = bytes::BytesMut::with_capacity(expected.unwrap_or(len).max(len));
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
                rest = Some(joined);
            }
            Some(joined) => joined.extend_from_slice(&data),
        }
    }
    Ok(rest.map_or(first, bytes::BytesMut::freeze))
}
