//! The bounds every stage of a keyed request puts on the service the layer wraps and on
//! the bodies it passes, written once: trait aliases, each implemented for every type
//! that meets its bounds. [`Idempotency`](crate::Idempotency)'s own `Service`
//! implementation spells them out, for its documentation.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::Service;

use crate::{BoxError, IdempotencyBody};

/// A body the layer reads (a keyed request's, an answer it records) or passes on.
pub(crate) trait ReadBody:
    Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

impl<B> ReadBody for B where B: Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

/// The service the layer wraps, called with requests whose body is `ReqBody` and
/// answering with bodies of `ResBody`, its calls run inside the layer's own future.
pub(crate) trait Inner<ReqBody, ResBody>:
    Service<
        Request<IdempotencyBody<ReqBody>>,
        Response = Response<ResBody>,
        Future: Send + 'static,
        Error: Into<BoxError> + Send + 'static,
    > + Send
    + 'static
{
}

impl<S, ReqBody, ResBody> Inner<ReqBody, ResBody> for S where
    S: Service<
            Request<IdempotencyBody<ReqBody>>,
            Response = Response<ResBody>,
            Future: Send + 'static,
            Error: Into<BoxError> + Send + 'static,
        > + Send
        + 'static
{
}
