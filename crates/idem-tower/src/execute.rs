//! Stage 2 of a keyed request (SPEC S5, S6, S7, S15), in steps over its [`Keyed`]
//! context: the key reserved (again under the rules a record was made by, or after a
//! wait: `wait_for`), the answer to a reservation that did not acquire it, the tenant's
//! rate of new keys, and the handler run while its lease is renewed, its answer read as
//! its route says. Stages 3 and 4 follow in `conclude.rs`.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{Ambiguity, Lease, Reservation, ReserveRequest, Scope, Store};
use tokio::time::Instant;

use crate::bounds::{Inner, ReadBody};
use crate::config::{Config, ReleaseStatuses};
use crate::context::IdempotencyContext;
use crate::disposition::{Disposition, Proxied, ResourceReference, UpstreamFailure};
use crate::earlier::reserve_again;
use crate::forward::forward_error;
use crate::grpc::GrpcReleaseCodes;
use crate::handled::Handled;
use crate::heartbeat::with_heartbeat;
use crate::in_flight::InFlightGuard;
use crate::keyed::Keyed;
use crate::observer::timed;
use crate::operation_state::OperationState;
use crate::plan::AnswerRules;
use crate::problem::Problem;
use crate::replay::refuse;
use crate::tenant_limit::{Refusal, refuse_new_key, take_token};
use crate::wait::{Observed, PREFERENCE_APPLIED, hand_back};
use crate::{BoxError, IdempotencyBody};

/// SPEC S5's stage 2 for one keyed request whose body is in hand, then stages 3 and 4;
/// counted in flight until `guard` drops with it.
///
/// A function returning an `async` block rather than an `async fn`: the block keeps its
/// captures in place, where an `async fn` would hold its arguments twice, and this
/// future is boxed, and so copied, once per request.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice in its state"
)]
pub(crate) fn execute<S, St, ReqBody, ResBody>(
    ctx: Keyed<St>,
    inner: S,
    parts: Parts,
    bytes: Bytes,
    mut request: ReserveRequest,
    guard: InFlightGuard,
) -> impl Future<Output = Response<IdempotencyBody<ResBody>>> + Send + 'static
where
    S: Inner<ReqBody, ResBody>,
    St: Store,
    ReqBody: Send + 'static,
    ResBody: ReadBody,
{
    async move {
        // The lease starts when the store commits, after this: a reply that comes late
        // leaves less of it than it says (see `late.rs`).
        let sent = Instant::now();
        let (reserved, kept) = ctx.reserve(&mut request, &parts, bytes).await;
        let (lease, bytes) = match reserved {
            Ok(Reservation::Replay(stored)) if stored.reference().is_some() => {
                // Boxed: a rare path, kept out of every keyed request's future.
                let mut response = Box::pin(ctx.rendered(inner, parts, stored)).await;
                Handled::scoped(&mut response, &request.scope);
                return response;
            }
            reserved => match ctx.acquired(reserved, kept, &request.scope).await {
                Ok(acquired) => acquired,
                Err(answer) => return answer,
            },
        };
        if let Some(elapsed) = crate::late::overdue(sent, request.lease) {
            // Boxed: a rare path, kept out of every keyed request's future.
            return Box::pin(ctx.refuse_late(lease, elapsed)).await;
        }
        if lease.recovered() {
            // An earlier attempt may have acted before its lease lapsed.
            let (observer, digest) = (ctx.observer(), lease.scope.digest());
            observer.ambiguous_outcome(Ambiguity::Takeover, &digest);
        }
        let ReserveRequest {
            scope, fingerprint, ..
        } = request;
        let releases = ctx.answers.release_statuses.clone();
        let context = IdempotencyContext::new(scope, lease.clone(), fingerprint, releases);
        let mut req = Request::from_parts(parts, IdempotencyBody::buffered(bytes));
        req.extensions_mut().insert(context);
        let ran = {
            let handler = pin!(run(inner, req, &ctx.answers, ctx.config()));
            let (store, observer) = (ctx.store(), ctx.observer());
            with_heartbeat(store, observer, &lease, ctx.lease_for, sent, handler).await
        };
        ctx.conclude(lease, ran, guard).await
    }
}

/// The first pause between polls of a store whose watch cannot fire; it doubles up to
/// [`MAX_POLL`].
const FIRST_POLL: Duration = Duration::from_millis(20);
const MAX_POLL: Duration = Duration::from_millis(500);

/// How long a waiter trusts a watch that can fire before it reserves again anyway: a
/// lost notification costs at most this. A watch that
/// [misses nothing](idem_core::Watch::misses_nothing) is trusted to the end of the wait.
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// What a request keeps once its key is reserved: its body, unless it waited for an
/// attempt in progress (SPEC S15), when it let its body go and its replay carries the
/// `Preference-Applied` it is given.
enum Kept {
    Body(Bytes),
    Waited(Option<HeaderValue>),
}

impl<St: Store> Keyed<St> {
    /// Reserves the request's key (SPEC S5): again by the fingerprint rules a record was
    /// made under, where a reload changed them and the record does not match; and for a
    /// duplicate of an attempt in progress that may wait, again as that attempt ends.
    async fn reserve(
        &self,
        request: &mut ReserveRequest,
        parts: &Parts,
        bytes: Bytes,
    ) -> (idem_core::Result<Reservation>, Kept) {
        let (config, observer, store) = (self.config(), self.observer(), self.store());
        // Made before the reserve, so that a completion right after it is heard.
        let watch = self.answers.wait.map(|_| store.watch(&request.scope));
        let mut result = timed(observer, "reserve", store.reserve(request)).await;
        if matches!(result, Ok(Reservation::Mismatch))
            && !config.earlier.is_empty()
            && self.answers.grpc.is_none()
        {
            let again = reserve_again(store, config, &self.method, parts, &bytes, request);
            if let Some(again) = Box::pin(again).await {
                result = again;
            }
        }
        let waiter = match (self.answers.wait, watch, &result) {
            (Some(wait), Some(watch), Ok(Reservation::InProgress { .. })) => {
                config.waiters.enter().map(|slot| (wait, watch, slot))
            }
            _ => None,
        };
        let Some((wait, watch, slot)) = waiter else {
            return (result, Kept::Body(bytes));
        };
        // A waiter needs its body's fingerprint, which the request holds, not its body:
        // without it, what waiting duplicates hold does not grow with the body limit.
        // One whose wait ends with the key to itself hands it back.
        drop(bytes);
        let observed = Observed::start(observer);
        // Boxed: a rare path, kept out of every keyed request's future.
        let result = Box::pin(self.wait_for(request, wait.within, watch, result)).await;
        observed.ended(&result);
        drop(slot);
        (result, Kept::Waited(wait.applied()))
    }

    /// Waits up to `within` for the attempt holding `request`'s key to end, reserving again
    /// after each wake or poll, and returns the first reservation that is not in progress
    /// (or the last one, in progress, when the time is up). `watch` was made before the
    /// reserve that answered in progress. While it waits between reserves, the request's
    /// `parked` is set: its future may then be dropped (its client hung up) without leaving
    /// anything reserved.
    async fn wait_for(
        &self,
        request: &ReserveRequest,
        within: Duration,
        mut watch: idem_core::Watch,
        mut last: idem_core::Result<Reservation>,
    ) -> idem_core::Result<Reservation> {
        let (store, observer, parked) = (self.store(), self.observer(), &*self.parked);
        let deadline = Instant::now() + within;
        let mut poll = FIRST_POLL;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return last;
            }
            let pause = if watch.misses_nothing() {
                within
            } else if watch.notifies() {
                FALLBACK_POLL
            } else {
                let pause = poll;
                poll = (poll * 2).min(MAX_POLL);
                pause
            };
            let until = deadline.min(now + pause);
            parked.store(true, Ordering::Release);
            tokio::select! {
                () = &mut watch => {}
                () = tokio::time::sleep_until(until) => {}
            }
            parked.store(false, Ordering::Release);
            watch = store.watch(&request.scope);
            last = timed(observer, "reserve", store.reserve(request)).await;
            if !matches!(last, Ok(Reservation::InProgress { .. })) {
                return last;
            }
        }
    }

    /// The lease the handler runs under, and its body; or the answer to a reservation
    /// that did not acquire the key (a replay, a refusal: SPEC S5), a waiter's key
    /// handed back, or a new key over its tenant's rate.
    async fn acquired<B>(
        &self,
        reserved: idem_core::Result<Reservation>,
        kept: Kept,
        scope: &Scope,
    ) -> Result<(Lease, Bytes), Response<IdempotencyBody<B>>> {
        let (observer, dialect, hints) =
            (self.observer(), self.dialect(), self.answers.retry_hints);
        match (reserved, kept) {
            (Ok(Reservation::Acquired(lease)), Kept::Body(bytes)) => {
                Ok((self.within_key_rate(lease).await?, bytes))
            }
            (Ok(Reservation::Acquired(lease)), Kept::Waited(_)) => {
                Err(hand_back(self.store(), observer, lease, dialect, hints).await)
            }
            (other, kept) => {
                let replay = matches!(other, Ok(Reservation::Replay(_)));
                let reused = match &other {
                    Ok(Reservation::Mismatch) => self.held(scope).await,
                    _ => None,
                };
                let mut response = refuse(observer, other, dialect, hints, reused);
                Handled::scoped(&mut response, scope);
                if let (true, Kept::Waited(Some(applied))) = (replay, kept) {
                    response.headers_mut().insert(PREFERENCE_APPLIED, applied);
                }
                Err(response)
            }
        }
    }

    /// Where the operation a reused key holds stands (SPEC S23): its
    /// record read again, for the 422 alone; `None` (unknown) when it cannot be read or is gone.
    async fn held(&self, scope: &Scope) -> Option<OperationState> {
        let now = idem_core::Clock::now(&idem_core::SystemClock);
        match self.store().get(scope).await {
            Ok(Some(record)) => Some(OperationState::of_record(&record.state, now)),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "reading the record of a reused key failed");
                None
            }
        }
    }

    /// `lease`, a new key's, if its tenant's rate of new keys lets it start, and, for
    /// an unverified tenant, the rate of every unverified tenant's new keys together;
    /// else the 429 `key-rate-exceeded`, the key released. A recovered attempt's key is
    /// not new.
    async fn within_key_rate<B>(
        &self,
        lease: Lease,
    ) -> Result<Lease, Response<IdempotencyBody<B>>> {
        if lease.recovered() {
            return Ok(lease);
        }
        let (store, limits) = (self.store(), &self.config().tenant_limits);
        let tenant = lease.scope.tenant();
        // The shared bucket first: a key it refuses takes no place in the table of
        // tenants' buckets, so made-up tenants fill it no faster than it allows.
        let refused = if self.unverified
            && let Some(rate) = limits.unverified_key_rate()
            && !limits.take_unverified(&rate, idem_core::Clock::now(&idem_core::SystemClock))
        {
            Refusal::Unverified(rate)
        } else if let Some(rate) = limits.key_rate(tenant)
            && !take_token(store, limits, tenant, &rate).await
        {
            Refusal::Tenant(rate)
        } else {
            return Ok(lease);
        };
        let refused = refuse_new_key(store, self.observer(), lease, refused, self.dialect());
        // Boxed: a rare path, kept out of every keyed request's future.
        Err(Box::pin(refused).await)
    }
}

/// How the handler answered: read whole, to be recorded (or kept in progress), or a head
/// whose answer is released, or recorded as a reference, and streams on unread.
pub(crate) enum Answered<B> {
    Whole(http::response::Parts, Bytes, Option<HeaderMap>, Disposition),
    Released(http::response::Parts, B),
    Referenced(http::response::Parts, B, ResourceReference),
}

/// Why the handler gave no answer that can be recorded as it is.
pub(crate) enum Failed {
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
pub(crate) type Ran<B> = Result<Result<Answered<B>, Failed>, Box<dyn Any + Send>>;

/// Calls the handler and reads its answer as its route's rules (`answers`) and the
/// layer's response limit and references say. A panic in it (or in `call`) may follow
/// effects: it is caught and recorded as a failure rather than unwinding through the
/// layer.
///
/// The disposition is known from the head. An answer to release is not recorded, so it
/// is passed on as it streams, whatever its size; the rest is read whole (up to the
/// limit) to be recorded.
fn run<'a, S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<IdempotencyBody<ReqBody>>,
    answers: &'a AnswerRules,
    config: &'a Config,
) -> impl Future<Output = Ran<ResBody>> + Send + 'a
where
    S: Inner<ReqBody, ResBody>,
    ReqBody: Send + 'static,
    ResBody: ReadBody,
{
    AssertUnwindSafe(async move {
        let response = inner.call(req).await.map_err(Failed::from_inner)?;
        let (mut head, body) = response.into_parts();
        let decided = disposition(&mut head, &answers.release_statuses, answers.grpc.as_ref());
        // A gRPC answer's status may come in its trailers, read with its body.
        let disposition = decided.unwrap_or(Disposition::Record);
        if matches!(disposition, Disposition::Release) {
            return Ok(Answered::Released(head, body));
        }
        if matches!(disposition, Disposition::Record)
            && let Some(reference) = head.extensions.remove::<ResourceReference>()
        {
            if config.references.honoured() {
                return Ok(Answered::Referenced(head, body, reference));
            }
            tracing::warn!(
                reference = reference.as_str(),
                "a ResourceReference is ignored unless the layer renders references; \
                 recording the answer whole"
            );
        }
        let proxied = head.extensions.remove::<Proxied>();
        let (bytes, trailers) = read_whole(body, config.response_limit, proxied).await?;
        let disposition = match (decided, &answers.grpc) {
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
