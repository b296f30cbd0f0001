//! What an execution's answer means for its key (SPEC S6): the inner service's own
//! [`Disposition`], a [`ResourceReference`] to record in place of the body, and the
//! upstream failures a proxy inside the layer fails with.

use std::time::Instant;

use idem_core::Ambiguity;

/// A response extension by which the inner service overrides SPEC S6's default
/// record-or-release decision for one response.
///
/// ```
/// use idem_tower::Disposition;
///
/// // A 503 produced after the charge went through must not let a retry charge again.
/// let mut response = http::Response::builder().status(503).body(()).unwrap();
/// response.extensions_mut().insert(Disposition::Record);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Record the response and replay it to every retry.
    Record,
    /// Delete the in-progress record: the request had no effect, and a retry with the
    /// same key executes.
    Release,
    /// The outcome is unknown (an upstream timed out after the request was sent): leave
    /// the record in progress and stop renewing its lease. Retries get 409 until the
    /// lease lapses, then one takes over as attempt n+1 with `recovered = true` and can
    /// check its business records first.
    KeepInProgress,
}

/// A response extension by which the inner service records where its answer's body
/// can be rendered again, instead of the body itself (SPEC S6, for answers too large to
/// keep, or not worth keeping).
///
/// The layer records the status, the allow-listed headers and the reference, passes the
/// body on to the first caller as it streams (no response limit applies), and answers
/// a replay by asking for `GET <reference>` (the retry's headers, no body): a 2xx
/// answer is replayed with the recorded status and headers, its own representation
/// headers (`content-type`, `content-length`, `content-encoding`, `etag`,
/// `last-modified`), `Content-Location: <reference>` and `Idempotent-Replayed: true`;
/// anything else is a 503 `replay-unavailable`. The
/// replay shows the resource as it is then, which may differ from the first answer.
///
/// Honoured only where the layer is told how to render references: with a renderer of
/// the application's own
/// ([`IdempotencyLayer::render_references_with`](crate::IdempotencyLayer::render_references_with)),
/// which works anywhere, or through the wrapped service
/// ([`IdempotencyLayer::render_references`](crate::IdempotencyLayer::render_references)),
/// which needs one that routes a `GET` by its path: a whole router, or a proxy such as
/// the idem gateway. Elsewhere the extension is ignored (with a warning) and the answer
/// recorded whole.
///
/// ```
/// use idem_tower::ResourceReference;
///
/// let mut response = http::Response::builder().status(201).body(()).unwrap();
/// let reference = ResourceReference::new("/v1/reports?id=42").unwrap();
/// response.extensions_mut().insert(reference);
/// assert!(ResourceReference::new("https://elsewhere.example/x").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceReference(String);

impl ResourceReference {
    /// A reference to `path_and_query` on the wrapped service; `None` unless it is an
    /// absolute path (`/…`, not `//…`), with an optional query, valid in a URI.
    pub fn new(path_and_query: &str) -> Option<ResourceReference> {
        let valid = path_and_query.starts_with('/')
            && !path_and_query.starts_with("//")
            && http::uri::PathAndQuery::try_from(path_and_query)
                .is_ok_and(|pq| pq.as_str() == path_and_query);
        valid.then(|| ResourceReference(path_and_query.to_owned()))
    }

    /// The path and query.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A response extension by which a proxy inside the layer (the idem gateway) marks an
/// answer as its upstream's, and says by when that answer must have arrived whole.
///
/// The layer reads an answer it records whole, up to its response limit
/// ([`IdempotencyLayer::response_limit`](crate::IdempotencyLayer::response_limit)); a
/// proxied one also by `deadline`, and what goes wrong on the way is the upstream's
/// failure, not the handler's ([`UpstreamFailure`]): no end by the deadline is a 504
/// `upstream-timeout` and a body that breaks off a 504 `upstream-connection-lost`, both
/// keeping the record in progress (the upstream may have acted), and an answer over the
/// limit is a 502 `upstream-answer-too-large`, recorded in its place. An answer the
/// layer releases, or records as a [`ResourceReference`], streams on unread and untimed.
///
/// ```
/// use std::time::{Duration, Instant};
/// use idem_tower::Proxied;
///
/// let mut response = http::Response::builder().status(201).body(()).unwrap();
/// response
///     .extensions_mut()
///     .insert(Proxied::by(Instant::now() + Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Proxied {
    deadline: Instant,
}

impl Proxied {
    /// An upstream's answer that must have arrived whole by `deadline`.
    pub fn by(deadline: Instant) -> Proxied {
        Proxied { deadline }
    }

    /// When the answer must have arrived whole.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// Why an upstream gave no usable answer, as a proxy inside the layer classifies it (the
/// side a failure came from, as pingora's errors say): each is answered with its own
/// [`ProblemKind`](crate::ProblemKind) (see [`Problem::upstream`](crate::Problem::upstream)),
/// and means one thing for the key's record ([`UpstreamFailure::disposition`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UpstreamFailure {
    /// The connection could not be made: nothing was sent, so nothing happened upstream.
    Unreachable,
    /// The TLS handshake with an `https://` upstream failed (a certificate from an
    /// unknown CA, for another name, expired…): nothing was sent, as when it is
    /// unreachable, and the connection is never tried again in plaintext.
    Tls,
    /// No complete answer by the deadline after the request was sent: the upstream may
    /// or may not have acted.
    Timeout,
    /// The connection broke (reset, closed, garbled) after the request was sent: the
    /// outcome is unknown as well.
    ConnectionLost,
    /// The answer is over the response limit: the upstream acted, but its answer cannot
    /// be recorded, so a problem is recorded in its place.
    AnswerTooLarge,
}

impl UpstreamFailure {
    /// What happens to the key's record (SPEC S6, S7): released when nothing was sent,
    /// kept in progress until its lease lapses when the outcome is unknown, so a retry
    /// neither runs twice concurrently nor replays a guess, and recorded when the
    /// upstream acted but its answer is too large to keep.
    pub fn disposition(self) -> Disposition {
        match self {
            UpstreamFailure::Unreachable | UpstreamFailure::Tls => Disposition::Release,
            UpstreamFailure::Timeout | UpstreamFailure::ConnectionLost => {
                Disposition::KeepInProgress
            }
            UpstreamFailure::AnswerTooLarge => Disposition::Record,
        }
    }

    /// Why the outcome is unknown after this failure: every one but those where nothing
    /// was sent ([`Unreachable`](UpstreamFailure::Unreachable),
    /// [`Tls`](UpstreamFailure::Tls)).
    pub fn ambiguity(self) -> Option<Ambiguity> {
        match self {
            UpstreamFailure::Unreachable | UpstreamFailure::Tls => None,
            UpstreamFailure::Timeout => Some(Ambiguity::UpstreamTimeout),
            UpstreamFailure::ConnectionLost => Some(Ambiguity::UpstreamConnectionLost),
            UpstreamFailure::AnswerTooLarge => Some(Ambiguity::AnswerTooLarge),
        }
    }
}
