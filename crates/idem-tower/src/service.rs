//! [`Idempotency`]: the middleware service. A request goes through SPEC S5's stages in
//! a file each: `plan.rs` decides from its head whether it is keyed; a keyed one's
//! stages are steps over one context per request (`keyed.rs`, as pingora's phases share
//! one `CTX`): `scope.rs` names its key and tenant, reads its body and fingerprints it,
//! `execute.rs` reserves the key and runs the handler (not under a reservation the
//! store confirmed too late, `late.rs`; its lease renewed by `heartbeat.rs`), `conclude.rs` decides what its answer means for the key, `settle.rs`
//! records the answer or releases the key, and `replay.rs` answers the retries.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use idem_core::Store;
use tower::{Layer, Service};

use crate::bounds::Inner;
use crate::drain::drain_body;
use crate::future::ResponseFuture;
use crate::layer::IdempotencyLayer;
use crate::observer::{Observer, Outcome};
use crate::plan::{Admission, admit};
use crate::problem::Problem;
use crate::scope::keyed;
use crate::shared::Shared;
use crate::{BoxError, IdempotencyBody};

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
        let (parts, body) = request.into_parts();
        match admit(config, &parts) {
            Admission::PassThrough => pass_through(&mut inner, shared, parts, body),
            Admission::Reject(problem, profile) => {
                reject(&*config.observer, problem, profile, &parts, body)
            }
            Admission::Keyed(plan) => ResponseFuture::new(keyed(shared, inner, parts, body, *plan)),
        }
    }
}

/// An unkeyed request, to the inner service untouched; a proxy's failure to forward it
/// answered in the layer's profile (a gRPC error to a gRPC call).
fn pass_through<S, St, ReqBody, ResBody>(
    inner: &mut S,
    shared: Arc<Shared<St>>,
    parts: Parts,
    body: ReqBody,
) -> ResponseFuture<ResBody, S::Error>
where
    S: Inner<ReqBody, ResBody>,
    St: Store,
    ResBody: Send + 'static,
{
    shared.config.observer.outcome(Outcome::PassedThrough);
    let dialect = crate::profile::Dialect {
        grpc: crate::grpc::is_grpc(&parts.headers),
        profile: shared.config.profile,
    };
    let future = inner.call(Request::from_parts(parts, IdempotencyBody::stream(body)));
    ResponseFuture::new(async move {
        crate::forward::passed_through(future.await, dialect, &*shared.config.observer)
    })
}

/// Answers `problem` from the request's head alone; the unread body is read away
/// (see [`drain_body`]).
fn reject<B, E, ReqBody>(
    observer: &dyn Observer,
    problem: Problem,
    profile: crate::Profile,
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
    let dialect = crate::profile::Dialect {
        grpc: crate::grpc::is_grpc(&parts.headers),
        profile,
    };
    let response = crate::keyed::rejected(observer, &problem, dialect);
    ResponseFuture::new(std::future::ready(Ok(response)))
}
