//! Stage 1 of a keyed request (SPEC S3, S4), in steps over its [`Keyed`] context: its
//! key (from its body, on a route that takes it from there), its tenant and the
//! tenant's limit on requests in progress, its scope, its body read up to the limit,
//! and its fingerprint; then stages 2 to 4 run as an [`Execution`] ([`execute`]): once
//! the body is read, a client that goes away can no longer cancel anything.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Method, Request, Response, header};
use http_body::Body;
use http_body_util::BodyExt;
use idem_core::{Fingerprint, Key, ReserveRequest, Scope, Store, Tenant, TenantKey};

use crate::body_key::{Incoming, Resolved};
use crate::bounds::{Inner, ReadBody};
use crate::detach::Execution;
use crate::drain::{drain_body, drain_in_background};
use crate::execute::execute;
use crate::keyed::Keyed;
use crate::mcp::reply::stamp;
use crate::mcp::{self, Call, RequestId};
use crate::observer::Outcome;
use crate::plan::{Plan, PlanKey};
use crate::problem::{Problem, ProblemKind};
use crate::profile::Dialect;
use crate::publish::{Published, echo};
use crate::replay::refuse;
use crate::shared::Shared;
use crate::sources::{Applying, CredentialError, TenantSources};
use crate::tenant_limit::TenantSlot;
use crate::{BoxError, IdempotencyBody};

/// A keyed request, admitted with its `plan`: stage 1's steps, each of which gives the
/// next what it needs or the answer, then its execution. Every answer once its key is
/// known carries what the request's profile and settings publish ([`Published`]): the
/// key echoed as sent, the record's lifetime, the replay marker.
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
        let (config, answers) = (&shared.config, &plan.answers);
        let published = Published::new(
            answers.profile,
            plan.ttl,
            &answers.retention,
            config.replay_header.as_ref(),
        );
        // How the key's header spelt it; the echo is set once the request's key is known.
        let (quoted, mut known) = (plan.quoted, None);
        let response_limit = config.response_limit;
        // A JSON-RPC call's request id, once read: its answers carry it (SPEC S24).
        let mut call_id: Option<RequestId> = None;
        let mut ctx = Keyed {
            // As the endpoint names it: its scope may not.
            method: Method::from_bytes(plan.endpoint.method().as_bytes())
                .unwrap_or_else(|_| parts.method.clone()),
            shared,
            lease_for: plan.lease,
            answers: plan.answers,
            parked: Arc::new(AtomicBool::new(false)),
            unverified: false,
        };
        let mut answered = 'steps: {
            let (key, incoming, document) = match ctx.key(&parts, plan.key, body).await {
                Found::Key(key, incoming) => {
                    // A body's key is the header's when both carry one.
                    known = Some(echo(&key, quoted));
                    (key, incoming, None)
                }
                Found::Call(call, bytes) => {
                    // The mcp profile echoes no key; the rest it publishes still holds.
                    known = Some(None);
                    call_id = Some(call.id);
                    (call.key, Incoming::Read(bytes), Some(call.document))
                }
                Found::Unkeyed(bytes) => break 'steps ctx.pass_through(inner, parts, bytes).await,
                Found::Refused(answer, id) => {
                    call_id = id;
                    break 'steps Ok(answer);
                }
            };
            let let_in = ctx.let_in(&parts, plan.tenant, plan.sources, incoming);
            let (tenant, slot, incoming, verified) = match let_in.await {
                Ok(let_in) => let_in,
                Err(answer) => break 'steps Ok(answer),
            };
            ctx.unverified = !verified;
            let scope = Scope::new(ctx.config().scope_mode, tenant, plan.endpoint, key);
            let options = plan.fingerprint.as_ref();
            let options = options.unwrap_or(&ctx.config().fingerprint);
            let path = plan.fingerprint_path.as_deref();
            let read = ctx.read(&parts, &scope, incoming, options, path, document);
            let (bytes, fingerprint) = match read.await {
                Ok(read) => read,
                Err(answer) => break 'steps Ok(answer),
            };
            let request = ReserveRequest::new(scope, fingerprint)
                .ttl(plan.ttl)
                .lease(plan.lease)
                .tombstone(plan.tombstone);
            // Counted from before the reservation until the answer is recorded, wherever
            // the execution ends up running.
            let guard = ctx.shared.in_flight.enter(slot);
            let (parked, dialect) = (ctx.parked.clone(), ctx.dialect());
            let execution = execute(ctx, inner, parts, bytes, request, guard);
            Ok(Execution::new(execution, parked, dialect).await)
        };
        if let (Some(echo), Ok(response)) = (known, &mut answered) {
            published.apply(response, echo);
        }
        match (answered, call_id) {
            (Ok(response), Some(id)) => Ok(stamp(response, &id, response_limit).await),
            (answered, _) => answered,
        }
    }
}

/// What a request's key is, once found.
enum Found<B, A> {
    /// The key, and the body: read already where the key was in it.
    Key(Key, Incoming<B>),
    /// A keyed JSON-RPC call (SPEC S24), and its body, read.
    Call(Call, Bytes),
    /// No key where its route does not require one: the body, read, passes through.
    Unkeyed(Bytes),
    /// The answer: a key that cannot be, or none where one is required; and the
    /// request id of the JSON-RPC call refused, where one was read.
    Refused(Response<IdempotencyBody<A>>, Option<RequestId>),
}

impl<St: Store> Keyed<St> {
    /// The request's key: its header's, or on a route that takes it from the body, the
    /// body's, read first.
    async fn key<B: ReadBody, A>(&self, parts: &Parts, key: PlanKey, body: B) -> Found<B, A> {
        if let PlanKey::Known(key) = key {
            return Found::Key(key, Incoming::Stream(body));
        }
        let config = self.config();
        let bytes = match read_body(parts, body, config.body_limit, config.body_timeout).await {
            Ok(bytes) => bytes,
            Err(problem) => return Found::Refused(self.rejected(&problem), None),
        };
        // Read as the fingerprint reads it: a compressed body by its content.
        let content = crate::coding::decoded(&parts.headers, &bytes, config.body_limit);
        let content = content.as_deref().unwrap_or(&bytes);
        match key {
            PlanKey::Known(_) => unreachable!("answered above"),
            PlanKey::Pending(pending) => match pending.resolve(&parts.headers, content) {
                Resolved::Key(key) => Found::Key(key, Incoming::Read(bytes)),
                Resolved::Refused(problem) => Found::Refused(self.rejected(&problem), None),
                Resolved::Unkeyed => Found::Unkeyed(bytes),
            },
            PlanKey::Call(call) => match call.read(content) {
                mcp::Read::Call(call) => Found::Call(call, bytes),
                mcp::Read::Refused(problem, id) => Found::Refused(self.rejected(&problem), id),
                mcp::Read::Unkeyed => Found::Unkeyed(bytes),
            },
        }
    }

    /// A request read to find its key in the body, which names none on a route that
    /// does not require one: to the inner service untouched, its body as read, and
    /// answered as any unkeyed request is (a proxy's failure in the layer's profile).
    async fn pass_through<S, ReqBody, ResBody>(
        &self,
        mut inner: S,
        parts: Parts,
        bytes: Bytes,
    ) -> Result<Response<IdempotencyBody<ResBody>>, S::Error>
    where
        S: Inner<ReqBody, ResBody>,
    {
        let observer = self.observer();
        observer.outcome(Outcome::PassedThrough);
        let dialect = Dialect {
            grpc: self.answers.grpc.is_some(),
            profile: self.config().profile,
        };
        let request = Request::from_parts(parts, IdempotencyBody::buffered(bytes));
        crate::forward::passed_through(inner.call(request).await, dialect, observer)
    }

    /// The request's tenant, named by the caller's extractor, else by the sources or the
    /// headers under the layer's tenant key, let in under its limit on requests in
    /// progress, and whether a verified source named it (the caller's extractor, a
    /// credential, a principal, or headers the layer was told are verified). A refusal
    /// is the answer, the body read away, but for a store that cannot give the tenant
    /// key: then nothing is scoped, as for any store outage.
    async fn let_in<B: ReadBody, A>(
        &self,
        parts: &Parts,
        named: Option<Tenant>,
        sources: Option<Arc<TenantSources>>,
        incoming: Incoming<B>,
    ) -> Result<(Tenant, Option<TenantSlot>, Incoming<B>, bool), Response<IdempotencyBody<A>>> {
        let (config, observer) = (self.config(), self.observer());
        let headers_verified = config.tenant_limits.headers_verified();
        let (tenant, verified) = match named {
            Some(tenant) => (tenant, true),
            None => {
                let key = config
                    .tenant_key
                    .get_or_try_init(|| TenantKey::from_store(&*self.shared.store))
                    .await;
                let key = match key {
                    Ok(key) => key,
                    Err(e) => {
                        let hints = self.answers.retry_hints;
                        return Err(refuse(observer, Err(e), self.dialect(), hints, None));
                    }
                };
                match sources.as_deref().or(config.sources.as_ref()) {
                    Some(sources) => match self.sources_tenant(sources, key, parts).await {
                        Ok(tenant) => tenant,
                        Err(problem) => {
                            incoming.drain(&parts.headers);
                            return Err(self.rejected(&problem));
                        }
                    },
                    None => {
                        let headers = &config.tenant_headers;
                        let verified = headers_verified && headers.carried_by(&parts.headers);
                        (headers.tenant(key, &parts.headers), verified)
                    }
                }
            }
        };
        observer.tenant_keyed(&tenant);
        match config.tenant_limits.try_enter(&tenant) {
            Ok(slot) => Ok((tenant, slot, incoming, verified)),
            Err(max) => {
                observer.tenant_limited(&tenant, "in_flight");
                incoming.drain(&parts.headers);
                let detail = format!(
                    "this tenant has {max} keyed requests in progress, its most at once; \
                     nothing was reserved: retry once one of them has its answer"
                );
                let problem = Problem::new(ProblemKind::TooManyInFlight, detail)
                    .retry_after(Duration::from_secs(1));
                Err(self.rejected(&problem))
            }
        }
    }

    /// The tenant named by the first of `sources` that applies, and whether that
    /// source is a verified one; a bearer token that does not verify is the 401
    /// `invalid-credential`.
    async fn sources_tenant(
        &self,
        sources: &TenantSources,
        key: &TenantKey,
        parts: &Parts,
    ) -> Result<(Tenant, bool), Problem> {
        let headers = &self.config().tenant_headers;
        let headers_verified = self.config().tenant_limits.headers_verified();
        match sources.applying(parts, headers) {
            Some(Applying::Credential(credential, found)) => {
                match credential.principal(found).await {
                    Ok(principal) => Ok((principal.tenant(key), true)),
                    Err(CredentialError::Unavailable {
                        reason,
                        retry_after,
                    }) => {
                        let detail = format!(
                            "{} {} is keyed, and its bearer token cannot be checked now: \
                             {reason}; nothing was reserved or forwarded: retry the same \
                             request, with the same token and key",
                            self.method,
                            parts.uri.path()
                        );
                        let problem = Problem::new(ProblemKind::CredentialUnavailable, detail);
                        Err(problem.retry_after(retry_after))
                    }
                    Err(e) => {
                        let detail = format!(
                            "{} {} is keyed, and its bearer token was not accepted: {e}; \
                             nothing was reserved or forwarded",
                            self.method,
                            parts.uri.path()
                        );
                        Err(Problem::new(ProblemKind::InvalidCredential, detail))
                    }
                }
            }
            Some(Applying::Principal(principal)) => Ok((principal.tenant(key), true)),
            Some(Applying::Headers) => Ok((headers.tenant(key, &parts.headers), headers_verified)),
            None => Ok((Tenant::anonymous(), false)),
        }
    }

    /// The body, read whole, and its fingerprint (SPEC S4; a gRPC call's, SPEC S18, over
    /// its one message). A refusal is the answer, marked with `scope`.
    async fn read<B: ReadBody, A>(
        &self,
        parts: &Parts,
        scope: &Scope,
        incoming: Incoming<B>,
        options: &idem_core::FingerprintOptions,
        path: Option<&str>,
        document: Option<Bytes>,
    ) -> Result<(Bytes, Fingerprint), Response<IdempotencyBody<A>>> {
        let config = self.config();
        let bytes = match incoming {
            Incoming::Read(bytes) => bytes,
            Incoming::Stream(body) => {
                read_body(parts, body, config.body_limit, config.body_timeout)
                    .await
                    .map_err(|problem| self.refused_in(scope, problem.answer(self.dialect())))?
            }
        };
        if self.answers.grpc.is_some() {
            if !crate::grpc::is_one_message(&bytes) {
                return Err(self.refused_in(scope, crate::grpc::not_unary()));
            }
            let fingerprint = crate::grpc::fingerprint(parts, &bytes, options);
            return Ok((bytes, fingerprint));
        }
        let method = self.method.as_str();
        let limit = config.body_limit;
        let fingerprint = match document {
            Some(doc) => crate::fingerprint::call_fingerprint(parts, method, path, &doc, options),
            None => crate::fingerprint::fingerprint(parts, method, path, &bytes, limit, options),
        };
        match fingerprint {
            Ok(fingerprint) => Ok((bytes, fingerprint)),
            Err(refused) => {
                let problem = Problem::refused_json(&refused);
                Err(self.refused_in(scope, problem.answer(self.dialect())))
            }
        }
    }
}

/// Reads a keyed request's body up to `limit` bytes (SPEC S4), within `timeout` when
/// one is set. When it answers early (over the limit, too slow), what is left of the
/// body is read away in the background (see [`drain_body`]).
async fn read_body<B: ReadBody>(
    parts: &Parts,
    body: B,
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Bytes, Problem> {
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
async fn read_up_to<B: ReadBody>(
    mut body: Pin<&mut B>,
    limit: usize,
) -> Result<Bytes, Option<BoxError>> {
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
