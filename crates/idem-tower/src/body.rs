//! The body type the layer hands on: bytes it buffered, or the original stream.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

pin_project! {
    /// A request or response body that is either fully buffered or the untouched stream.
    ///
    /// Keyed requests reach the inner service with the bytes the layer buffered to
    /// fingerprint them; their responses reach the client from the bytes it recorded.
    /// Everything else streams through as [`IdempotencyBody::stream`].
    #[derive(Debug)]
    pub struct IdempotencyBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    #[derive(Debug)]
    enum Inner<B> {
        Buffered { #[pin] body: Full<Bytes>, trailers: Option<HeaderMap> },
        Stream { #[pin] body: B },
    }
}

impl<B> IdempotencyBody<B> {
    /// A body of `bytes`.
    pub fn buffered(bytes: impl Into<Bytes>) -> IdempotencyBody<B> {
        IdempotencyBody {
            inner: Inner::Buffered {
                body: Full::new(bytes.into()),
                trailers: None,
            },
        }
    }

    /// A body of `bytes` followed by `trailers` (a gRPC answer's `grpc-status`, say);
    /// none when `trailers` is `None`.
    pub fn buffered_with_trailers(
        bytes: impl Into<Bytes>,
        trailers: Option<HeaderMap>,
    ) -> IdempotencyBody<B> {
        IdempotencyBody {
            inner: Inner::Buffered {
                body: Full::new(bytes.into()),
                trailers,
            },
        }
    }

    /// The original body, streamed untouched.
    pub fn stream(body: B) -> IdempotencyBody<B> {
        IdempotencyBody {
            inner: Inner::Stream { body },
        }
    }

    /// Whether the body was buffered by the layer.
    pub fn is_buffered(&self) -> bool {
        matches!(self.inner, Inner::Buffered { .. })
    }
}

impl<B> Body for IdempotencyBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().inner.project() {
            InnerProj::Buffered { body, trailers } => match body.poll_frame(cx) {
                Poll::Ready(Some(frame)) => {
                    Poll::Ready(Some(frame.map_err(|never| match never {})))
                }
                Poll::Ready(None) => Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t)))),
                Poll::Pending => Poll::Pending,
            },
            InnerProj::Stream { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Buffered { body, trailers } => body.is_end_stream() && trailers.is_none(),
            Inner::Stream { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Buffered { body, .. } => body.size_hint(),
            Inner::Stream { body } => body.size_hint(),
        }
    }
}
