//! What a proxy inside the layer (the idem gateway) fails with when it has no answer of
//! its upstream's to give: a [`ForwardError`], by the side it went wrong on (as
//! pingora's errors say), and for the upstream's side an [`UpstreamFailure`].
//!
//! The proxy classifies and returns the failure as its error; the layer answers it, once,
//! in the request's dialect (a problem, a profile's envelope, a gRPC status), reports it
//! to its [`Observer`](crate::Observer), and settles a keyed request's record as the
//! failure says ([`UpstreamFailure::disposition`], [`UpstreamFailure::ambiguity`]).

use std::any::Any;
use std::fmt;

use http::Response;

use crate::disposition::UpstreamFailure;
use crate::handled::Handled;
use crate::observer::{Observer, Outcome};
use crate::problem::{Problem, ProblemKind};
use crate::profile::Dialect;
use crate::{BoxError, IdempotencyBody};

/// Why a proxy inside the layer has no answer of its upstream's to give, by the side it
/// went wrong on: what such a proxy returns as its service's error, for the layer to
/// answer in the request's dialect, once.
///
/// ```
/// use idem_tower::{ForwardError, UpstreamFailure};
///
/// let e = ForwardError::Upstream(UpstreamFailure::Timeout);
/// assert_eq!(e.upstream_failure(), Some(UpstreamFailure::Timeout));
/// assert_eq!(e.problem().status(), 504);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardError {
    /// Downstream: the client's request body broke off (a malformed chunk, an upload
    /// abandoned halfway). The client's fault: a 400 `body-unreadable`, which asks for
    /// no retry with the same key, and no upstream failure. The layer reads a keyed
    /// request's body whole before it forwards it, so only an unkeyed one fails so.
    ClientBody,
    /// Upstream: no usable answer.
    Upstream(UpstreamFailure),
    /// Upstream: the TLS handshake failed ([`UpstreamFailure::Tls`]), for the reason
    /// given, which the answer's detail names.
    UpstreamTls(String),
}

impl ForwardError {
    /// The upstream's failure, `None` for the client's.
    pub fn upstream_failure(&self) -> Option<UpstreamFailure> {
        match self {
            ForwardError::ClientBody => None,
            ForwardError::Upstream(failure) => Some(*failure),
            ForwardError::UpstreamTls(_) => Some(UpstreamFailure::Tls),
        }
    }

    /// The problem this failure is answered with: a 400 `body-unreadable` for the
    /// client's, the upstream failure's own otherwise.
    pub fn problem(&self) -> Problem {
        match self {
            ForwardError::ClientBody => Problem::new(
                ProblemKind::BodyUnreadable,
                "the request body could not be read: it broke off or was malformed",
            ),
            ForwardError::Upstream(failure) => Problem::upstream(*failure),
            ForwardError::UpstreamTls(reason) => Problem::new(
                ProblemKind::UpstreamUnreachable,
                format!(
                    "The gateway could not set up TLS with the upstream: {reason}. The \
                     request was not sent, so a retry with the same Idempotency-Key will \
                     execute."
                ),
            ),
        }
    }
}

impl fmt::Display for ForwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.problem())
    }
}

impl std::error::Error for ForwardError {}

impl Problem {
    /// The answer to an upstream's `failure`. Its detail is the same on every
    /// occurrence: what the failure means for the key, and what a client should do.
    pub fn upstream(failure: UpstreamFailure) -> Problem {
        let (kind, detail) = match failure {
            UpstreamFailure::Unreachable => (
                ProblemKind::UpstreamUnreachable,
                "The gateway could not connect to the upstream; the request was not sent, \
                 so a retry with the same Idempotency-Key will execute.",
            ),
            UpstreamFailure::Tls => (
                ProblemKind::UpstreamUnreachable,
                "The gateway could not set up TLS with the upstream. The request was not \
                 sent, so a retry with the same Idempotency-Key will execute.",
            ),
            UpstreamFailure::Timeout => (
                ProblemKind::UpstreamTimeout,
                "The upstream did not answer in time after the request was sent; its \
                 outcome is unknown. Retry with the same Idempotency-Key: it answers 409 \
                 until the attempt's lease lapses, then executes as the next attempt.",
            ),
            UpstreamFailure::ConnectionLost => (
                ProblemKind::UpstreamConnectionLost,
                "The connection to the upstream broke after the request was sent; its \
                 outcome is unknown. Retry with the same Idempotency-Key: it answers 409 \
                 until the attempt's lease lapses, then executes as the next attempt.",
            ),
            UpstreamFailure::AnswerTooLarge => (
                ProblemKind::UpstreamAnswerTooLarge,
                "The upstream executed the request, but its answer is over the gateway's \
                 response limit and cannot be recorded. This answer is recorded in its \
                 place and is final for this Idempotency-Key: a retry replays it and \
                 does not execute again.",
            ),
        };
        Problem::new(kind, detail)
    }
}

/// The [`ForwardError`] an inner service failed with, whether its error type is that
/// or the boxed error of a stack that boxes its errors; `None` for any other error.
pub(crate) fn forward_error<E: Any>(error: &E) -> Option<&ForwardError> {
    let error: &dyn Any = error;
    error.downcast_ref::<ForwardError>().or_else(|| {
        error
            .downcast_ref::<BoxError>()
            .and_then(|e| e.downcast_ref::<ForwardError>())
    })
}

/// The answer to an unkeyed request whose inner service failed with `error`: a
/// [`ForwardError`] answered in `dialect` and reported to `observer` (the request passed
/// through, as its outcome says); any other error is the caller's, as it came.
pub(crate) fn passed_through<B, E: Any>(
    result: Result<Response<B>, E>,
    dialect: Dialect,
    observer: &dyn Observer,
) -> Result<Response<IdempotencyBody<B>>, E> {
    let mut response = match result {
        Ok(response) => response.map(IdempotencyBody::stream),
        Err(e) => {
            let Some(failed) = forward_error(&e) else {
                return Err(e);
            };
            if let Some(failure) = failed.upstream_failure() {
                observer.upstream_failed(failure);
            }
            failed
                .problem()
                .answer(dialect)
                .map(IdempotencyBody::buffered)
        }
    };
    Handled::mark(&mut response, Outcome::PassedThrough);
    Ok(response)
}

#[cfg(test)]
mod tests;
