//! [`ResponseFuture`]: what [`Idempotency`](crate::Idempotency) returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use crate::IdempotencyBody;

type BoxFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<IdempotencyBody<B>>, E>> + Send + 'static>>;

/// The response future of [`Idempotency`](crate::Idempotency).
///
/// A boxed future: the keyed path awaits the body, then the store and the handler in
/// sequence, and one allocation per request is small next to the store round trip. If it
/// is dropped once a keyed request's execution has started, the execution goes on in a
/// task of its own (SPEC S7).
pub struct ResponseFuture<B, E> {
    inner: BoxFuture<B, E>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new<F>(future: F) -> ResponseFuture<B, E>
    where
        F: Future<Output = Result<Response<IdempotencyBody<B>>, E>> + Send + 'static,
    {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<IdempotencyBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
