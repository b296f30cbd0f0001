//! What went wrong forwarding a request, by the side it went wrong on (as pingora's
//! errors say): the client's, or the upstream's.
//!
//! The proxy classifies; `idem-tower` renders every problem body
//! ([`Problem`]) and decides what each failure means for the key's
//! record ([`UpstreamFailure::disposition`]).

use idem_tower::{Problem, ProblemKind, UpstreamFailure};

/// Why forwarding a request gave no answer of the upstream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardError {
    /// Downstream: the client's request body broke off (a malformed chunk, an upload
    /// abandoned halfway). The client's fault, so no retry with the same key is asked
    /// for and no upstream error is counted.
    ClientBody,
    /// Upstream: no usable answer.
    Upstream(UpstreamFailure),
}

impl ForwardError {
    /// The answer: a 400 `body-unreadable` for the client's fault, the upstream
    /// failure's own problem otherwise.
    pub fn problem(self) -> Problem {
        match self {
            ForwardError::ClientBody => Problem::new(
                ProblemKind::BodyUnreadable,
                "the request body could not be read: it broke off or was malformed",
            ),
            ForwardError::Upstream(failure) => Problem::upstream(failure),
        }
    }
}

/// The `kind` label of `idem_upstream_errors_total` for an upstream failure.
pub fn upstream_error_label(failure: UpstreamFailure) -> &'static str {
    match failure {
        UpstreamFailure::Unreachable => "unreachable",
        UpstreamFailure::Timeout => "timeout",
        UpstreamFailure::ConnectionLost => "broken",
        UpstreamFailure::AnswerTooLarge => "too_large",
        // `UpstreamFailure` is non-exhaustive; a failure added there is counted apart.
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_client_body_is_the_clients_400() {
        let res = ForwardError::ClientBody.problem().to_response();
        assert_eq!(res.status(), 400);
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(v["type"], "https://idem.dev/problems/body-unreadable");
    }

    #[test]
    fn upstream_failures_keep_their_metric_labels() {
        let labels = [
            UpstreamFailure::Unreachable,
            UpstreamFailure::Timeout,
            UpstreamFailure::ConnectionLost,
            UpstreamFailure::AnswerTooLarge,
        ]
        .map(upstream_error_label);
        assert_eq!(labels, ["unreachable", "timeout", "broken", "too_large"]);
    }
}
