//! The gateway's own error answers, in one place: what the upstream did wrong, as an
//! RFC 9457 problem, and what it means for the key's record.
//!
//! Errors of the idempotency protocol itself (400, 409, 413, 422, 503) are answered by
//! `idem-tower`; the gateway only adds the upstream's failures.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use idem_tower::Disposition;

use crate::proxy::ProxyBody;

/// Why the upstream gave no usable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// The connection could not be made: nothing was sent, so nothing happened upstream.
    Unreachable,
    /// No complete answer within `--upstream-timeout` after the request was sent: the
    /// upstream may or may not have acted.
    Timeout,
    /// The connection broke (reset, closed, garbled) after the request was sent: the
    /// outcome is unknown as well.
    Broken,
    /// A keyed answer is over `--response-limit`: the upstream acted, but its answer
    /// cannot be recorded, so this problem is recorded in its place.
    TooLarge,
}

impl UpstreamError {
    /// The status the client gets.
    pub fn status(self) -> StatusCode {
        match self {
            UpstreamError::Unreachable | UpstreamError::TooLarge => StatusCode::BAD_GATEWAY,
            UpstreamError::Timeout | UpstreamError::Broken => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// What happens to the key's record (SPEC S6, S7): released when nothing was sent,
    /// kept in progress until its lease lapses when the outcome is unknown, so a retry
    /// neither runs twice concurrently nor replays a guess, and recorded when the
    /// upstream acted but its answer is too large to keep.
    pub fn disposition(self) -> Disposition {
        match self {
            UpstreamError::Unreachable => Disposition::Release,
            UpstreamError::Timeout | UpstreamError::Broken => Disposition::KeepInProgress,
            UpstreamError::TooLarge => Disposition::Record,
        }
    }

    /// A stable label for metrics and logs.
    pub fn kind(self) -> &'static str {
        match self {
            UpstreamError::Unreachable => "unreachable",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Broken => "broken",
            UpstreamError::TooLarge => "too_large",
        }
    }

    fn problem(self) -> (&'static str, &'static str, &'static str) {
        match self {
            UpstreamError::Unreachable => (
                "https://idem.dev/problems/upstream-unreachable",
                "Upstream unreachable",
                "The gateway could not connect to the upstream; the request was not sent, \
                 so a retry with the same Idempotency-Key will execute.",
            ),
            UpstreamError::Timeout => (
                "https://idem.dev/problems/upstream-timeout",
                "Upstream timed out",
                "The upstream did not answer in time after the request was sent; its \
                 outcome is unknown. Retry with the same Idempotency-Key: it answers 409 \
                 until the attempt's lease lapses, then executes as the next attempt.",
            ),
            UpstreamError::Broken => (
                "https://idem.dev/problems/upstream-connection-lost",
                "Upstream connection lost",
                "The connection to the upstream broke after the request was sent; its \
                 outcome is unknown. Retry with the same Idempotency-Key: it answers 409 \
                 until the attempt's lease lapses, then executes as the next attempt.",
            ),
            UpstreamError::TooLarge => (
                "https://idem.dev/problems/upstream-answer-too-large",
                "Upstream answer too large to record",
                "The upstream executed the request, but its answer is over the gateway's \
                 response limit and cannot be recorded. This answer is recorded in its \
                 place and is final for this Idempotency-Key: a retry replays it and \
                 does not execute again.",
            ),
        }
    }

    /// The answer: an `application/problem+json` body and the [`Disposition`]
    /// extension for the idempotency layer.
    pub fn into_response(self) -> Response<ProxyBody> {
        let (ty, title, detail) = self.problem();
        let body = serde_json::json!({
            "type": ty,
            "title": title,
            "status": self.status().as_u16(),
            "detail": detail,
        });
        let mut res = Response::new(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *res.status_mut() = self.status();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        res.extensions_mut().insert(self.disposition());
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unreachable_is_502_and_releases() {
        let res = UpstreamError::Unreachable.into_response();
        assert_eq!(res.status(), 502);
        assert_eq!(
            res.extensions().get::<Disposition>(),
            Some(&Disposition::Release)
        );
        assert_eq!(
            res.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], 502);
        assert_eq!(v["type"], "https://idem.dev/problems/upstream-unreachable");
    }

    #[test]
    fn too_large_answer_is_502_and_recorded() {
        let res = UpstreamError::TooLarge.into_response();
        assert_eq!(res.status(), 502);
        assert_eq!(
            res.extensions().get::<Disposition>(),
            Some(&Disposition::Record)
        );
    }

    #[test]
    fn unknown_outcomes_are_504_and_keep_the_record() {
        for e in [UpstreamError::Timeout, UpstreamError::Broken] {
            let res = e.into_response();
            assert_eq!(res.status(), 504);
            assert_eq!(
                res.extensions().get::<Disposition>(),
                Some(&Disposition::KeepInProgress)
            );
        }
    }
}
