//! Stages 2 to 4 of a keyed request (SPEC S5, S6, S7): the reservation, the handler
//! run while its lease is renewed, and what its answer means for the key.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::request::Parts;
use http::{HeaderMap, HeaderName, Method, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{Ambiguity, Lease, Reservation, ReserveRequest, Store};

use crate::bounds::{Inner, ReadBody};
use crate::config::ReleaseStatuses;
use crate::context::IdempotencyContext;
use crate::detach::panic_message;
use crate::disposition::{Disposition, Proxied, ResourceReference, UpstreamFailure};
use crate::forward::forward_error;
use crate::grpc::GrpcReleaseCodes;
use crate::handled::Handled;
use crate::heartbeat::with_heartbeat;
use crate::in_flight::InFlightGuard;
use crate::observer::{Outcome, timed};
use crate::plan::AnswerRules;
use crate::problem::{Problem, ProblemKind};
use crate::profile::Dialect;
use crate::replay::{refuse, rendered, superseded};
use crate::settle::{KeyWrite, Settled, settle, stored_response};
use crate::shared::Shared;
use crate::wait::{Observed, PREFERENCE_APPLIED, hand_back, wait_for};
use crate::{BoxError, IdempotencyBody};

/// SPEC S5's stages 2 to 4 for one keyed request whose body is in hand; counted in
/// flight until `guard` drops with it.
///
/// A function returning an `async` block rather than an `async fn`: the block keeps its
/// captures in place, where an `async fn` would hold its arguments twice, and this
/// future is boxed, and so copied, once per request.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice in its state"
)]
#[allow(
    clippy::too_many_arguments,
    reason = "each is moved into the future once; a struct of them would only be unpacked again"
)]
pub(crate) fn execute<S, St, ReqBody, ResBody>(
    shared: Arc<Shared<St>>,
    inner: S,
    method: Method,
    parts: Parts,
    bytes: Bytes,
    mut request: ReserveRequest,
    answers: AnswerRules,
    guard: InFlightGuard,
    parked: Arc<AtomicBool>,
) -> impl Future<Output = Response<IdempotencyBody<ResBody>>> + Send + 'static
where
    S: Inner<ReqBody, ResBody>,
    St: Store,
    ReqBody: Send + 'static,
    ResBody: ReadBody,
{
    async move {
        let config = &shared.config;
        let observer = &*config.observer;
        let store = &*shared.store;
        // Made before the reserve, so that a completion right after it is heard.
        let watch = answers.wait.map(|_| store.watch(&request.scope));
        let mut reserved = timed(observer, "reserve", store.reserve(&request)).await;
        if matches!(reserved, Ok(Reservation::Mismatch))
            && !config.earlier.is_empty()
            && answers.grpc.is_none()
        {
            let again =
                crate::earlier::reserve_again(store, config, &method, &parts, &bytes, &mut request);
            if let Some(again) = Box::pin(again).await {
                reserved = again;
            }
        }
        let mut applied = None;
        let mut bytes = Some(bytes);
        if let (Some(wait), Some(watch), Ok(Reservation::InProgress { .. })) =
            (answers.wait, watch, &reserved)
            && let Some(slot) = config.waiters.enter()
        {
            // A waiter needs its body's fingerprint, which the request holds, not its
            // body: without it, what waiting duplicates hold does not grow with the
            // body limit. One whose wait ends with the key to itself hands it back.
            bytes = None;
            let observed = Observed::start(observer);
            // Boxed: a rare path, kept out of every keyed request's future.
            reserved = Box::pin(wait_for(
                store,
                observer,
                &request,
                wait.within,
                watch,
                reserved,
                &parked,
            ))
            .await;
            observed.ended(&reserved);
            drop(slot);
            applied = wait.applied();
        }
        let (lease, bytes) = match (reserved, bytes) {
            (Ok(Reservation::Acquired(lease)), Some(bytes)) => {
                let limits = &config.tenant_limits;
                if !lease.recovered()
                    && let Some(rate) = limits.key_rate(lease.scope.tenant())
                    && !crate::tenant_limit::take_token(store, limits, lease.scope.tenant(), &rate)
                        .await
                {
                    let dialect = answers.dialect();
                    let refused =
                        crate::tenant_limit::refuse_new_key(store, observer, lease, rate, dialect);
                    return Box::pin(refused).await;
                }
                (lease, bytes)
            }
            (Ok(Reservation::Acquired(lease)), None) => {
                let (dialect, hints) = (answers.dialect(), answers.retry_hints);
                return hand_back(store, observer, lease, dialect, hints).await;
            }
            (Ok(Reservation::Replay(stored)), _) if stored.reference().is_some() => {
                // Boxed: a rare path, kept out of every keyed request's future.
                let rendered = rendered(inner, parts, stored, config, answers.dialect());
                let mut response = Box::pin(rendered).await;
                Handled::scoped(&mut response, &request.scope);
                return response;
            }
            (other, _) => {
                let replay = matches!(other, Ok(Reservation::Replay(_)));
                let mut response = refuse(observer, other, answers.dialect(), answers.retry_hints);
                Handled::scoped(&mut response, &request.scope);
                if let (true, Some(applied)) = (replay, applied) {
                    response.headers_mut().insert(PREFERENCE_APPLIED, applied);
                }
                return response;
            }
        };

        if lease.recovered() {
            // An earlier attempt may have acted before its lease lapsed.
            observer.ambiguous_outcome(Ambiguity::Takeover, &lease.scope.digest());
        }

        // Stage 2: the handler runs while the lease is renewed.
        let ReserveRequest {
            scope,
            fingerprint,
            lease: lease_for,
            ..
        } = request;
        let dialect = answers.dialect();
        let hints = answers.retry_hints;
        let AnswerRules {
            extra_headers,
            release_statuses,
            grpc,
            ..
        } = answers;
        let context =
            IdempotencyContext::new(scope, lease.clone(), fingerprint, release_statuses.clone());
        let mut req = Request::from_parts(parts, IdempotencyBody::buffered(bytes));
        req.extensions_mut().insert(context);
        let reading = Reading {
            release_statuses,
            grpc,
            limit: config.response_limit,
            references: config.references.honoured(),
        };
        let ran = {
            let handler = pin!(run(inner, req, reading));
            with_heartbeat(store, observer, &lease, lease_for, handler).await
        };
        // Stages 3–4.
        let answer = Answer {
            extra_headers: &extra_headers,
            dialect,
            hints,
        };
        conclude(&shared, lease, lease_for, answer, ran, guard).await
    }
}

/// What the handler's answer is read by.
struct Reading {
    /// The statuses that release the key on this request's route.
    release_statuses: ReleaseStatuses,
    /// For a gRPC call, the gRPC statuses that release the key.
    grpc: Option<GrpcReleaseCodes>,
    /// The response limit.
    limit: usize,
    /// Whether a [`ResourceReference`] is honoured.
    references: bool,
}

/// How the handler answered: read whole, to be recorded (or kept in progress), or a head
/// whose answer is released, or recorded as a reference, and streams on unread.
enum Answered<B> {
    Whole(http::response::Parts, Bytes, Option<HeaderMap>, Disposition),
    Released(http::response::Parts, B),
    Referenced(http::response::Parts, B, ResourceReference),
}

/// Why the handler gave no answer that can be recorded as it is.
enum Failed {
    /// The handler failed after it started (its call, or its body, returned an error).
    Handler(BoxError),
    /// The handler's answer is over the response limit.
    TooLarge,
    /// The upstream failed: the proxy inside the layer said so with a
    /// [`ForwardError`], or its [`Proxied`] answer failed while it was read. Answered
    /// with its problem.
    Upstream(UpstreamFailure, Problem),
}

impl Failed {
    /// The failure of the handler's call: the upstream's, where a proxy says so.
    fn from_inner(error: impl Into<BoxError>) -> Failed {
        let error = error.into();
        match forward_error(&error).map(|e| (e.upstream_failure(), e.problem())) {
            Some((Some(failure), problem)) => Failed::Upstream(failure, problem),
            // The client's body broke off, the proxy says; but the layer had it whole.
            _ => Failed::Handler(error),
        }
    }

    /// The upstream's `failure`, found while its answer was read.
    fn upstream(failure: UpstreamFailure) -> Failed {
        Failed::Upstream(failure, Problem::upstream(failure))
    }
}

/// What the handler's run ended with: its answer, or why there is none, or the panic it
/// raised.
type Ran<B> = Result<Result<Answered<B>, Failed>, Box<dyn Any + Send>>;

/// Calls the handler and reads its answer as `reading` says. A panic in it (or in
/// `call`) may follow effects: it is caught and recorded as a failure rather than
/// unwinding through the layer.
///
/// The disposition is known from the head. An answer to release is not recorded, so it
/// is passed on as it streams, whatever its size; the rest is read whole (up to the
/// limit) to be recorded.
fn run<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<IdempotencyBody<ReqBody>>,
    reading: Reading,
) -> impl Future<Output = Ran<ResBody>> + Send
where
    S: Inner<ReqBody, ResBody>,
    ReqBody: Send + 'static,
    ResBody: ReadBody,
{
    AssertUnwindSafe(async move {
        let response = inner.call(req).await.map_err(Failed::from_inner)?;
        let (mut head, body) = response.into_parts();
        let decided = disposition(&mut head, &reading.release_statuses, reading.grpc.as_ref());
        // A gRPC answer's status may come in its trailers, read with its body.
        let disposition = decided.unwrap_or(Disposition::Record);
        if matches!(disposition, Disposition::Release) {
            return Ok(Answered::Released(head, body));
        }
        if matches!(disposition, Disposition::Record)
            && let Some(reference) = head.extensions.remove::<ResourceReference>()
        {
            if reading.references {
                return Ok(Answered::Referenced(head, body, reference));
            }
            tracing::warn!(
                reference = reference.as_str(),
                "a ResourceReference is ignored unless the layer renders references; \
                 recording the answer whole"
            );
        }
        let proxied = head.extensions.remove::<Proxied>();
        let (bytes, trailers) = read_whole(body, reading.limit, proxied).await?;
        let disposition = match (decided, &reading.grpc) {
            (None, Some(codes)) => {
                let code = trailers.as_ref().and_then(crate::grpc::status_in);
                if code.is_some_and(|c| codes.contains(c)) {
                    Disposition::Release
                } else {
                    Disposition::Record
                }
            }
            _ => disposition,
        };
        Ok(Answered::Whole(head, bytes, trailers, disposition))
    })
    .catch_unwind()
}

/// What the answer with head `head` means for the key (SPEC S6, S18): the inner
/// service's own [`Disposition`], else for a gRPC call's HTTP 200 a
/// release when its gRPC status is one of `grpc` (`None`, to be decided by the
/// trailers, when the head carries none), else a release when its HTTP status is one
/// of `release_statuses`, else a record.
fn disposition(
    head: &mut http::response::Parts,
    release_statuses: &ReleaseStatuses,
    grpc: Option<&GrpcReleaseCodes>,
) -> Option<Disposition> {
    if let Some(disposition) = head.extensions.remove::<Disposition>() {
        return Some(disposition);
    }
    let released = match grpc {
        Some(codes) if head.status == http::StatusCode::OK => {
            codes.contains(crate::grpc::status_in(&head.headers)?)
        }
        _ => release_statuses.contains(head.status),
    };
    Some(if released {
        Disposition::Release
    } else {
        Disposition::Record
    })
}

/// Reads an answer to be recorded whole (its body and trailers), up to `limit` bytes,
/// and a proxied one by its deadline.
async fn read_whole<B>(
    body: B,
    limit: usize,
    proxied: Option<Proxied>,
) -> Result<(Bytes, Option<HeaderMap>), Failed>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let collect = Limited::new(body, limit).collect();
    let collected = match proxied {
        Some(proxied) => {
            let deadline = tokio::time::Instant::from_std(proxied.deadline());
            match tokio::time::timeout_at(deadline, collect).await {
                Ok(collected) => collected,
                Err(_) => {
                    tracing::warn!("the upstream's answer did not come whole in time");
                    return Err(Failed::upstream(UpstreamFailure::Timeout));
                }
            }
        }
        None => collect.await,
    };
    match collected {
        Ok(collected) => {
            let trailers = collected.trailers().cloned();
            Ok((collected.to_bytes(), trailers))
        }
        Err(e) if e.is::<LengthLimitError>() => Err(match proxied {
            Some(_) => {
                tracing::error!(
                    limit,
                    "the upstream's answer is over the response limit; recording a 502 in its place"
                );
                Failed::upstream(UpstreamFailure::AnswerTooLarge)
            }
            None => Failed::TooLarge,
        }),
        Err(e) => match proxied {
            Some(_) => {
                tracing::warn!(error = %e, "upstream body broke off");
                Err(Failed::upstream(UpstreamFailure::ConnectionLost))
            }
            None => Err(Failed::Handler(e)),
        },
    }
}

/// Stages 3–4: settles the key as the handler's run says, and makes the answer the
/// client gets.
async fn conclude<St: Store, B>(
    shared: &Arc<Shared<St>>,
    lease: Lease,
    lease_for: Duration,
    answer: Answer<'_>,
    ran: Ran<B>,
    guard: InFlightGuard,
) -> Response<IdempotencyBody<B>> {
    let config = &shared.config;
    let observer = &*config.observer;
    let Answer {
        extra_headers,
        dialect,
        hints,
    } = answer;
    let recorded = |(head, body, disposition)| (head, body, None, disposition);
    // Set when the run's outcome cannot be known: reported, and kept with the answer
    // when one is recorded.
    let ambiguous: Option<Ambiguity>;
    let (mut head, body, trailers, disposition) = match ran {
        Ok(Ok(Answered::Whole(head, body, trailers, disposition))) => {
            ambiguous = None;
            (head, body, trailers, disposition)
        }
        Ok(Ok(Answered::Released(mut head, body))) => {
            observer.outcome(Outcome::Released);
            let handled = Handled::ran(Outcome::Released, &lease);
            settle(shared, lease, lease_for, KeyWrite::Release, guard).await;
            pass_on(&mut head.extensions, Disposition::Release);
            head.extensions.insert(handled);
            return Response::from_parts(head, IdempotencyBody::stream(body));
        }
        Ok(Ok(Answered::Referenced(mut head, body, reference))) => {
            let stored = stored_response(config, extra_headers, &head, &Bytes::new(), None)
                .with_reference(reference.as_str());
            observer.outcome(Outcome::Executed);
            let handled = Handled::ran(Outcome::Executed, &lease);
            settle(shared, lease, lease_for, KeyWrite::Complete(stored), guard).await;
            pass_on(&mut head.extensions, Disposition::Record);
            head.extensions.insert(handled);
            return Response::from_parts(head, IdempotencyBody::stream(body));
        }
        Ok(Err(Failed::TooLarge)) => {
            tracing::error!(
                limit = config.response_limit,
                "the handler's answer is over the response limit; recording a 500 in its place"
            );
            ambiguous = Some(Ambiguity::AnswerTooLarge);
            recorded(too_large_response(config.response_limit, dialect))
        }
        Ok(Err(Failed::Upstream(failure, problem))) => {
            observer.upstream_failed(failure);
            ambiguous = failure.ambiguity();
            let (head, body) = problem.answer(dialect).into_parts();
            (head, body, None, failure.disposition())
        }
        Ok(Err(Failed::Handler(e))) => {
            tracing::error!(error = %e, "handler failed after it started; recording a 500");
            ambiguous = Some(Ambiguity::HandlerFailed);
            recorded(failed_response(dialect))
        }
        Err(panic) => {
            tracing::error!(
                panic = panic_message(&*panic),
                "handler panicked; recording a 500"
            );
            ambiguous = Some(Ambiguity::HandlerFailed);
            recorded(failed_response(dialect))
        }
    };
    if let Some(reason) = ambiguous {
        observer.ambiguous_outcome(reason, &lease.scope.digest());
    }
    let outcome = match disposition {
        Disposition::Record => Outcome::Executed,
        Disposition::Release => Outcome::Released,
        Disposition::KeepInProgress => Outcome::KeptInProgress,
    };
    observer.outcome(outcome);
    let handled = Handled::ran(outcome, &lease);
    match disposition {
        Disposition::Record => {
            let mut stored =
                stored_response(config, extra_headers, &head, &body, trailers.as_ref());
            if let Some(reason) = ambiguous {
                stored = stored.with_ambiguity(reason);
            }
            let scope = lease.scope.clone();
            let settled = settle(shared, lease, lease_for, KeyWrite::Complete(stored), guard).await;
            if settled == Settled::Fenced
                && let Some(superseded) = superseded(shared, &scope, dialect, hints).await
            {
                return superseded;
            }
        }
        // Released answers left the handler early, streaming: here, the problem for an
        // upstream that never got the request.
        Disposition::Release => {
            settle(shared, lease, lease_for, KeyWrite::Release, guard).await;
        }
        Disposition::KeepInProgress => {
            // The upstream may still act: the record keeps why, for the listing.
            if let Some(reason) = ambiguous
                && let Err(e) = shared.store.mark_ambiguous(&lease, reason).await
            {
                tracing::warn!(error = %e, %reason, "keeping the ambiguity reason failed");
            }
            drop(guard);
        }
    }
    pass_on(&mut head.extensions, disposition);
    head.extensions.insert(handled);
    Response::from_parts(
        head,
        IdempotencyBody::buffered_with_trailers(body, trailers),
    )
}

/// What an answer is recorded with: the route's extra headers, and the dialect of the
/// layer's own answers (a gRPC call's problems are gRPC errors, SPEC S18).
struct Answer<'a> {
    extra_headers: &'a [HeaderName],
    dialect: Dialect,
    /// Whether the route's own answers carry retry hints.
    hints: bool,
}

/// Clears the extensions of an answer passed on to the client. A recorded answer keeps
/// none, so that it and its replays look alike; one that is not recorded keeps its
/// [`ProblemKind`], which marks it as no answer of the upstream's to layers outside
/// (the idem gateway makes such answers readable across origins).
fn pass_on(extensions: &mut http::Extensions, disposition: Disposition) {
    let kind = extensions.remove::<ProblemKind>();
    let problem = extensions.remove::<Problem>();
    let profile = extensions.remove::<crate::Profile>();
    extensions.clear();
    if let (Some(kind), Disposition::Release | Disposition::KeepInProgress) = (kind, disposition) {
        extensions.insert(kind);
        if let Some(problem) = problem {
            extensions.insert(problem);
        }
        if let Some(profile) = profile {
            extensions.insert(profile);
        }
    }
}

/// A problem answer that stands for an execution that ran, recorded and replayed.
fn recorded_problem(
    kind: ProblemKind,
    detail: String,
    dialect: Dialect,
) -> (http::response::Parts, Bytes, Disposition) {
    let (head, body) = Problem::new(kind, detail).answer(dialect).into_parts();
    (head, body, Disposition::Record)
}

fn failed_response(dialect: Dialect) -> (http::response::Parts, Bytes, Disposition) {
    recorded_problem(
        ProblemKind::HandlerFailed,
        "the request failed while it was being processed and may have had effects; \
         this answer is final for this key"
            .into(),
        dialect,
    )
}

fn too_large_response(
    limit: usize,
    dialect: Dialect,
) -> (http::response::Parts, Bytes, Disposition) {
    recorded_problem(
        ProblemKind::ResponseTooLarge,
        format!(
            "the request was executed, but its answer is over the {limit}-byte limit for \
             recorded answers and cannot be kept; this answer is final for this key"
        ),
        dialect,
    )
}

#[cfg(test)]
mod tests;
