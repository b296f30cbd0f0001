//! What went wrong forwarding a request, by the side it went wrong on (as pingora's
//! errors say): the client's, or the upstream's.
//!
//! The proxy classifies; `idem-tower` renders every problem body
//! ([`Problem`]) and decides what each failure means for the key's
//! record ([`UpstreamFailure::disposition`]).

use idem_tower::{Problem, ProblemKind, UpstreamFailure};

/// Why forwarding a request gave no answer of the upstream's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ForwardError {
    /// Downstream: the client's request body broke off (a malformed chunk, an upload
    /// abandoned halfway). The client's fault, so no retry with the same key is asked
    /// for and no upstream error is counted.
    ClientBody,
    /// Upstream: no usable answer.
    Upstream(UpstreamFailure),
    /// Upstream: the TLS handshake with an `https://` upstream failed, for the reason
    /// given (a certificate from an unknown CA, for another name, expired…). Nothing
    /// was sent, so it is answered as an unreachable upstream (502, the key released),
    /// with the reason in the detail; the connection is never tried again in plaintext.
    UpstreamTls(String),
}

impl ForwardError {
    /// The answer: a 400 `body-unreadable` for the client's fault, the upstream
    /// failure's own problem otherwise.
    pub(crate) fn problem(self) -> Problem {
        match self {
            ForwardError::ClientBody => Problem::new(
                ProblemKind::BodyUnreadable,
                "the request body could not be read: it broke off or was malformed",
            ),
            ForwardError::Upstream(failure) => Problem::upstream(failure),
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

    /// The `kind` label of `idem_upstream_errors_total` for this failure, `None` for
    /// the client's.
    pub(crate) fn label(&self) -> Option<&'static str> {
        match self {
            ForwardError::ClientBody => None,
            ForwardError::Upstream(failure) => Some(upstream_error_label(*failure)),
            ForwardError::UpstreamTls(_) => Some("tls"),
        }
    }
}

/// The `kind` label of `idem_upstream_errors_total` for an upstream failure.
pub(crate) fn upstream_error_label(failure: UpstreamFailure) -> &'static str {
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

    #[test]
    fn a_tls_failure_is_an_unreachable_upstream_naming_it() {
        let e = ForwardError::UpstreamTls("invalid peer certificate: UnknownIssuer".into());
        assert_eq!(e.label(), Some("tls"));
        let res = e.problem().to_response();
        assert_eq!(res.status(), 502);
        assert_eq!(
            res.extensions().get::<idem_tower::Disposition>(),
            Some(&idem_tower::Disposition::Release)
        );
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(v["type"], "https://idem.dev/problems/upstream-unreachable");
        let detail = v["detail"].as_str().unwrap();
        assert!(
            detail.contains("TLS") && detail.contains("UnknownIssuer"),
            "{detail}"
        );
    }
}
