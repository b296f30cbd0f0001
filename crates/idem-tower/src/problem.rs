//! Every error answer the layer gives, as an RFC 9457 problem body. Statuses and `type`
//! URIs live here and nowhere else.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::operation_state::OperationState;

/// The media type of problem bodies.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// How long a client should wait after a 503 for an unavailable store.
pub const STORE_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The kinds of problem the layer answers with. Each has a stable `type` URI (see
/// [`ProblemKind::type_uri`]) that clients may match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the `Idempotency-Key` header is malformed or repeated (SPEC S2).
    InvalidKey,
    /// 400: the route requires a key and none was sent (SPEC S5).
    MissingKey,
    /// 400: the request body could not be read.
    BodyUnreadable,
    /// 401 + `WWW-Authenticate: Bearer`: the layer requires a tenant
    /// ([`IdempotencyLayer::require_tenant`](crate::IdempotencyLayer::require_tenant))
    /// and the keyed request carries none of the headers that name one; nothing was
    /// reserved or forwarded (SPEC S3).
    MissingTenant,
    /// 401 + `WWW-Authenticate: Bearer error="invalid_token"`: the layer names tenants
    /// by a verified bearer token ([`TenantSources::credential`]) and the keyed
    /// request's token does not verify (a bad signature, an expired token, another
    /// issuer or audience); nothing was reserved or forwarded (SPEC S3).
    ///
    /// [`TenantSources::credential`]: crate::TenantSources::credential
    InvalidCredential,
    /// 400: the request's path cannot be normalised (SPEC S14): a `..` above the root,
    /// a broken percent-escape, an escaped control character. Nothing was reserved or
    /// forwarded.
    InvalidPath,
    /// 400: the request's `Host` is missing on HTTP/1.1, repeated, or no host (RFC 9112
    /// §3.2 makes each a 400): the idem gateway's listener (SPEC S14). Nothing was
    /// reserved or forwarded.
    InvalidHost,
    /// 400: the method-override headers (`X-HTTP-Method-Override` and the like; see
    /// [`IdempotencyLayer::method_override_headers`](crate::IdempotencyLayer::method_override_headers))
    /// do not name one method: two different ones, or a value that is no method. The
    /// upstream could run the request as either, so nothing was reserved or forwarded
    /// (SPEC S14).
    InvalidMethodOverride,
    /// 400: a keyed request carries a header named as the key's or a tenant header is,
    /// but with `_` for `-` (`Idempotency_Key`), which CGI and WSGI servers, and nginx
    /// with `underscores_in_headers`, read as that header: the upstream would see a key
    /// or a tenant the layer never read. Nothing was reserved or forwarded (SPEC S14).
    AmbiguousHeader,
    /// 400: a keyed request's JSON body names a member twice in one object
    /// (`{"amount":100,"amount":1}`, at any depth, names compared after unescaping),
    /// which RFC 7493 (I-JSON) forbids: parsers disagree on which member counts, so the
    /// upstream could act on another payload than the one fingerprinted, or another
    /// key than the one read. Nothing was reserved or forwarded (SPEC S4).
    DuplicateJsonMember,
    /// 400: a keyed request's JSON body, on a route that reads its key or its
    /// fingerprint's fields from the body (a key pointer, ignored pointers, JCS), is
    /// not JSON the layer reads ([`UnreadableJson`](idem_core::UnreadableJson): not
    /// JSON's grammar, a byte that is not UTF-8, a lone surrogate escape, nesting past
    /// [`MAX_JSON_DEPTH`](idem_core::MAX_JSON_DEPTH), a number JCS cannot write). The
    /// upstream's own parser might still read a key in it, so it is refused rather than
    /// passed on unkeyed or hashed as bytes. Nothing was reserved or forwarded (SPEC S4).
    UnreadableJson,
    /// 400 `invalid-json-rpc`: on a route of the `mcp` profile (SPEC S24), a body that
    /// is JSON but no JSON-RPC message the layer can read where a keyed call may be:
    /// a batch holding a keyed method, a keyed method without a request `id` (or with
    /// `null`), a member named twice, or an envelope whose `method` or `params` is of
    /// the wrong type. The upstream might still run the call, so it is refused rather
    /// than passed on unkeyed; nothing was reserved or forwarded.
    InvalidJsonRpc,
    /// 413: the body is over the limit; nothing was reserved (SPEC S4).
    BodyTooLarge,
    /// 408: the body did not arrive within the layer's body timeout; nothing was
    /// reserved, so a retry executes.
    BodyTimeout,
    /// 429 + `Retry-After`: the request's tenant has as many keyed requests in progress
    /// as [`IdempotencyLayer::tenant_max_in_flight`] allows; nothing was reserved or
    /// forwarded.
    ///
    /// [`IdempotencyLayer::tenant_max_in_flight`]: crate::IdempotencyLayer::tenant_max_in_flight
    TooManyInFlight,
    /// 429 + `Retry-After`: the request would start a new key for a tenant that has
    /// used up its rate of new keys ([`IdempotencyLayer::tenant_key_rate`]); its
    /// reservation was released and nothing was forwarded, so its retry is free to
    /// run once the tenant's bucket has a token again. Replays are not limited.
    ///
    /// [`IdempotencyLayer::tenant_key_rate`]: crate::IdempotencyLayer::tenant_key_rate
    KeyRateExceeded,
    /// 409 + `Retry-After`: another attempt with this key is executing (SPEC S5).
    RequestInProgress,
    /// 422: the key was used for a request with a different payload (SPEC S5).
    KeyReused,
    /// 410: the key's record expired and its tombstone remains (SPEC S16): the
    /// operation completed once, its answer is no longer kept, and it is not executed
    /// again. The body says when it completed and with what status.
    KeyExpired,
    /// 500: the handler panicked or failed after it started; it may have had effects, so
    /// this answer is recorded and replayed.
    HandlerFailed,
    /// 500: the handler ran, but its answer is over the response limit and cannot be
    /// recorded; this problem is recorded and replayed in its place, so the operation
    /// never runs twice.
    ResponseTooLarge,
    /// 503 + `Retry-After`: the idempotency store is unreachable; the handler was not
    /// called (SPEC S10).
    StoreUnavailable,
    /// 503 + `Retry-After`: the store granted the key, but its reply came so late (half
    /// the lease or more after the reserve was sent) that the lease may have lapsed and
    /// another attempt taken the key over (SPEC S7). The handler was not called; the
    /// reservation was given back if it was still this attempt's. Retry with the same key.
    ReservationLate,
    /// 503 + `Retry-After`: the keyed request's credential could not be checked now, for
    /// a fault of the service's, not the client's (the keys that verify it could not be
    /// loaded in time: [`CredentialError::Unavailable`](crate::CredentialError::Unavailable)).
    /// Nothing was reserved or forwarded; the same request may succeed on a retry.
    CredentialUnavailable,
    /// 503 + `Retry-After`: the key's answer is recorded as a
    /// [`ResourceReference`](crate::ResourceReference)
    /// and rendering it again failed. The operation did run:
    /// retry with the same key, never a new one.
    ReplayUnavailable,
    /// 502: a proxy inside the layer (the idem gateway) could not connect to its
    /// upstream, or set up TLS with it; nothing was sent, so the key is released
    /// ([`UpstreamFailure::Unreachable`](crate::UpstreamFailure::Unreachable),
    /// [`UpstreamFailure::Tls`](crate::UpstreamFailure::Tls)).
    UpstreamUnreachable,
    /// 504: the upstream did not answer in time after the request was sent; the record
    /// stays in progress until its lease lapses ([`UpstreamFailure::Timeout`](crate::UpstreamFailure::Timeout)).
    UpstreamTimeout,
    /// 504: the connection to the upstream broke after the request was sent; the record
    /// stays in progress until its lease lapses ([`UpstreamFailure::ConnectionLost`](crate::UpstreamFailure::ConnectionLost)).
    UpstreamConnectionLost,
    /// 502: the upstream acted, but its answer is over the response limit; this problem
    /// is recorded and replayed in its place ([`UpstreamFailure::AnswerTooLarge`](crate::UpstreamFailure::AnswerTooLarge)).
    UpstreamAnswerTooLarge,
}

impl ProblemKind {
    /// Every kind, for documentation and tests.
    pub const ALL: [ProblemKind; 29] = [
        ProblemKind::InvalidKey,
        ProblemKind::MissingKey,
        ProblemKind::BodyUnreadable,
        ProblemKind::MissingTenant,
        ProblemKind::InvalidCredential,
        ProblemKind::InvalidPath,
        ProblemKind::InvalidHost,
        ProblemKind::InvalidMethodOverride,
        ProblemKind::AmbiguousHeader,
        ProblemKind::DuplicateJsonMember,
        ProblemKind::UnreadableJson,
        ProblemKind::InvalidJsonRpc,
        ProblemKind::BodyTooLarge,
        ProblemKind::BodyTimeout,
        ProblemKind::TooManyInFlight,
        ProblemKind::KeyRateExceeded,
        ProblemKind::RequestInProgress,
        ProblemKind::KeyReused,
        ProblemKind::KeyExpired,
        ProblemKind::HandlerFailed,
        ProblemKind::ResponseTooLarge,
        ProblemKind::StoreUnavailable,
        ProblemKind::ReservationLate,
        ProblemKind::CredentialUnavailable,
        ProblemKind::ReplayUnavailable,
        ProblemKind::UpstreamUnreachable,
        ProblemKind::UpstreamTimeout,
        ProblemKind::UpstreamConnectionLost,
        ProblemKind::UpstreamAnswerTooLarge,
    ];

    /// The stable `type` URI, `https://idem.dev/problems/<slug>`.
    pub fn type_uri(self) -> &'static str {
        match self {
            ProblemKind::InvalidKey => "https://idem.dev/problems/invalid-key",
            ProblemKind::MissingKey => "https://idem.dev/problems/missing-key",
            ProblemKind::BodyUnreadable => "https://idem.dev/problems/body-unreadable",
            ProblemKind::MissingTenant => "https://idem.dev/problems/missing-tenant",
            ProblemKind::InvalidCredential => "https://idem.dev/problems/invalid-credential",
            ProblemKind::TooManyInFlight => "https://idem.dev/problems/too-many-in-flight",
            ProblemKind::KeyRateExceeded => "https://idem.dev/problems/key-rate-exceeded",
            ProblemKind::InvalidPath => "https://idem.dev/problems/invalid-path",
            ProblemKind::InvalidHost => "https://idem.dev/problems/invalid-host",
            ProblemKind::InvalidMethodOverride => {
                "https://idem.dev/problems/invalid-method-override"
            }
            ProblemKind::AmbiguousHeader => "https://idem.dev/problems/ambiguous-header",
            ProblemKind::DuplicateJsonMember => "https://idem.dev/problems/duplicate-json-member",
            ProblemKind::UnreadableJson => "https://idem.dev/problems/unreadable-json",
            ProblemKind::InvalidJsonRpc => "https://idem.dev/problems/invalid-json-rpc",
            ProblemKind::BodyTooLarge => "https://idem.dev/problems/body-too-large",
            ProblemKind::BodyTimeout => "https://idem.dev/problems/body-timeout",
            ProblemKind::RequestInProgress => "https://idem.dev/problems/request-in-progress",
            ProblemKind::KeyReused => "https://idem.dev/problems/key-reused",
            ProblemKind::KeyExpired => "https://idem.dev/problems/key-expired",
            ProblemKind::HandlerFailed => "https://idem.dev/problems/handler-failed",
            ProblemKind::ResponseTooLarge => "https://idem.dev/problems/response-too-large",
            ProblemKind::StoreUnavailable => "https://idem.dev/problems/store-unavailable",
            ProblemKind::ReservationLate => "https://idem.dev/problems/reservation-late",
            ProblemKind::CredentialUnavailable => {
                "https://idem.dev/problems/credential-unavailable"
            }
            ProblemKind::ReplayUnavailable => "https://idem.dev/problems/replay-unavailable",
            ProblemKind::UpstreamUnreachable => "https://idem.dev/problems/upstream-unreachable",
            ProblemKind::UpstreamTimeout => "https://idem.dev/problems/upstream-timeout",
            ProblemKind::UpstreamConnectionLost => {
                "https://idem.dev/problems/upstream-connection-lost"
            }
            ProblemKind::UpstreamAnswerTooLarge => {
                "https://idem.dev/problems/upstream-answer-too-large"
            }
        }
    }

    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::InvalidKey
            | ProblemKind::MissingKey
            | ProblemKind::BodyUnreadable
            | ProblemKind::InvalidPath
            | ProblemKind::InvalidHost
            | ProblemKind::InvalidMethodOverride
            | ProblemKind::AmbiguousHeader
            | ProblemKind::DuplicateJsonMember
            | ProblemKind::UnreadableJson
            | ProblemKind::InvalidJsonRpc => StatusCode::BAD_REQUEST,
            ProblemKind::MissingTenant | ProblemKind::InvalidCredential => StatusCode::UNAUTHORIZED,
            ProblemKind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ProblemKind::RequestInProgress => StatusCode::CONFLICT,
            ProblemKind::TooManyInFlight | ProblemKind::KeyRateExceeded => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ProblemKind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemKind::KeyExpired => StatusCode::GONE,
            ProblemKind::HandlerFailed | ProblemKind::ResponseTooLarge => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ProblemKind::StoreUnavailable
            | ProblemKind::ReservationLate
            | ProblemKind::CredentialUnavailable
            | ProblemKind::ReplayUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ProblemKind::UpstreamUnreachable | ProblemKind::UpstreamAnswerTooLarge => {
                StatusCode::BAD_GATEWAY
            }
            ProblemKind::UpstreamTimeout | ProblemKind::UpstreamConnectionLost => {
                StatusCode::GATEWAY_TIMEOUT
            }
        }
    }

    /// A short, fixed summary.
    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::InvalidKey => "Invalid Idempotency-Key",
            ProblemKind::MissingKey => "Idempotency-Key required",
            ProblemKind::BodyUnreadable => "Request body could not be read",
            ProblemKind::MissingTenant => "Credentials required for a keyed request",
            ProblemKind::InvalidCredential => "Credential not accepted for a keyed request",
            ProblemKind::TooManyInFlight => "Too many keyed requests in progress for this tenant",
            ProblemKind::KeyRateExceeded => "Too many new keys for this tenant",
            ProblemKind::InvalidPath => "Invalid request path",
            ProblemKind::InvalidHost => "Invalid Host header",
            ProblemKind::InvalidMethodOverride => "Conflicting method override",
            ProblemKind::AmbiguousHeader => "Ambiguous header name",
            ProblemKind::DuplicateJsonMember => "Duplicate member name in JSON body",
            ProblemKind::UnreadableJson => "JSON body cannot be read",
            ProblemKind::InvalidJsonRpc => "Invalid JSON-RPC request",
            ProblemKind::BodyTooLarge => "Request body too large",
            ProblemKind::BodyTimeout => "Request body too slow",
            ProblemKind::RequestInProgress => "Request in progress",
            ProblemKind::KeyReused => "Idempotency-Key reused with a different payload",
            ProblemKind::KeyExpired => "Idempotency-Key expired",
            ProblemKind::HandlerFailed => "Request failed",
            ProblemKind::ResponseTooLarge => "Response too large to record",
            ProblemKind::StoreUnavailable => "Idempotency store unavailable",
            ProblemKind::ReservationLate => "Reservation confirmed too late to execute",
            ProblemKind::CredentialUnavailable => "Credential cannot be checked now",
            ProblemKind::ReplayUnavailable => "Recorded answer unavailable",
            ProblemKind::UpstreamUnreachable => "Upstream unreachable",
            ProblemKind::UpstreamTimeout => "Upstream timed out",
            ProblemKind::UpstreamConnectionLost => "Upstream connection lost",
            ProblemKind::UpstreamAnswerTooLarge => "Upstream answer too large to record",
        }
    }
}

/// One problem answer: a kind, a detail for this occurrence, and for 409 and 503 how
/// long to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub(crate) kind: ProblemKind,
    pub(crate) detail: String,
    pub(crate) retry_after: Option<Duration>,
    /// A status other than the kind's, for a kind that has two (a sealed answer that
    /// cannot be opened is a 500 `replay-unavailable`, SPEC S17).
    pub(crate) status: Option<StatusCode>,
    /// RFC 9457 extension members, after the standard ones.
    pub(crate) members: Vec<(&'static str, serde_json::Value)>,
    /// Where the operation stands, where the layer knows better than the kind says (a
    /// reused key's record, a takeover).
    pub(crate) state: Option<OperationState>,
}

impl Problem {
    /// The refusal of a keyed JSON body that names a member twice in one object.
    pub(crate) fn duplicate_member(name: &str) -> Problem {
        // A name is echoed up to a length that identifies it, not a megabyte of it.
        const SHOWN: usize = 64;
        let name = match name.char_indices().nth(SHOWN) {
            Some((end, _)) => format!("{:?}…", &name[..end]),
            None => format!("{name:?}"),
        };
        let detail = format!(
            "the JSON body names the member {name} twice in one object; JSON parsers \
             disagree on which of the two counts, so the upstream could act on another \
             payload than the one this key is checked against; send each member once; \
             nothing was reserved or forwarded"
        );
        Problem::new(ProblemKind::DuplicateJsonMember, detail)
    }

    /// The refusal of a keyed JSON body that the layer cannot read, on a route that
    /// reads its key or its fingerprint's fields from the body.
    pub(crate) fn unreadable_json(why: &idem_core::UnreadableJson) -> Problem {
        let detail = format!(
            "the JSON body cannot be read: {why}; this route reads its key or its \
             fingerprint from the body, so a body idem cannot read is refused rather than \
             passed on unkeyed; nothing was reserved or forwarded"
        );
        Problem::new(ProblemKind::UnreadableJson, detail)
    }

    /// The refusal of a keyed JSON body the fingerprint will not take.
    pub(crate) fn refused_json(refused: &idem_core::RefusedJson) -> Problem {
        match refused {
            idem_core::RefusedJson::DuplicateMember(repeated) => {
                Problem::duplicate_member(repeated.name())
            }
            idem_core::RefusedJson::Unreadable(why) => Problem::unreadable_json(why),
            other => Problem::new(ProblemKind::UnreadableJson, other.to_string()),
        }
    }

    /// A problem of `kind` with a human-readable `detail`.
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Problem {
        let retry_after = match kind {
            ProblemKind::StoreUnavailable
            | ProblemKind::ReservationLate
            | ProblemKind::CredentialUnavailable
            | ProblemKind::ReplayUnavailable => Some(STORE_UNAVAILABLE_RETRY_AFTER),
            ProblemKind::RequestInProgress => Some(Duration::from_secs(1)),
            _ => None,
        };
        Problem {
            kind,
            detail: detail.into(),
            retry_after,
            status: None,
            members: Vec::new(),
            state: None,
        }
    }

    /// The 410 `key-expired` for a key whose tombstone remains (SPEC S16): the
    /// operation completed at `completed_at` with `status`. The body carries both as
    /// the members `completed_at` (RFC 3339, UTC) and `completed_status`.
    pub fn key_expired(completed_at: idem_core::Timestamp, status: u16) -> Problem {
        let when = completed_at.to_rfc3339();
        let mut problem = Problem::new(
            ProblemKind::KeyExpired,
            format!(
                "the operation with this key completed at {when} with status {status}; its \
                 recorded answer has expired and it is not executed again: look up its \
                 result in your own records, and use a new key for a new operation"
            ),
        );
        problem.members = vec![
            ("completed_at", serde_json::Value::String(when)),
            ("completed_status", serde_json::Value::from(status)),
        ];
        problem
    }

    /// The 500 `replay-unavailable` for a recorded answer that cannot be opened (SPEC
    /// S17): the operation ran, and a retry cannot change that the record is unreadable
    /// until an operator restores its key, so there is no `Retry-After`.
    pub fn unopenable(detail: impl Into<String>) -> Problem {
        Problem {
            kind: ProblemKind::ReplayUnavailable,
            detail: detail.into(),
            retry_after: None,
            status: Some(StatusCode::INTERNAL_SERVER_ERROR),
            members: Vec::new(),
            state: None,
        }
    }

    /// The HTTP status: the kind's, unless this problem has its own.
    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| self.kind.status())
    }

    /// Sets `Retry-After` (whole seconds, rounded up, at least 1).
    pub fn retry_after(mut self, wait: Duration) -> Problem {
        self.retry_after = Some(wait);
        self
    }

    /// Where the operation under the key stands (SPEC S23): what the
    /// layer found, else what the kind says ([`OperationState::of_problem`]). Written as the header
    /// [`IDEMPOTENCY_OPERATION_STATE`](crate::IDEMPOTENCY_OPERATION_STATE) and the body's
    /// member `operation_state`.
    pub fn operation_state(&self) -> OperationState {
        self.state
            .unwrap_or_else(|| OperationState::of_problem(self.kind))
    }

    /// This problem saying `state` in place of what its kind says.
    pub(crate) fn in_state(mut self, state: OperationState) -> Problem {
        self.state = Some(state);
        self
    }

    /// The extension members of every dialect's body: this problem's own, then
    /// `operation_state`.
    pub(crate) fn extension_members(&self) -> impl Iterator<Item = (String, serde_json::Value)> {
        let state = ("operation_state", self.operation_state().as_str().into());
        self.members
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .chain(std::iter::once(state))
            .map(|(k, v)| (k.to_owned(), v))
    }

    /// The kind.
    pub fn kind(&self) -> ProblemKind {
        self.kind
    }

    /// The detail.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The `application/problem+json` body.
    pub fn body(&self) -> Bytes {
        let mut body = serde_json::json!({
            "type": self.kind.type_uri(),
            "title": self.kind.title(),
            "status": self.status().as_u16(),
            "detail": self.detail,
        });
        if let Some(object) = body.as_object_mut() {
            object.extend(self.extension_members());
        }
        Bytes::from(body.to_string())
    }

    /// The full response: status, `Content-Type`, `Retry-After` when set, body, and the
    /// [`ProblemKind`] as a response extension, by which layers outside can tell the
    /// layer's own answers from the handler's (the idem gateway adds CORS headers to
    /// them). Each is written once, in its dialect, where it is made. Problems the layer
    /// records in place of an answer (500s, and the 502 for an upstream answer too
    /// large) lose it with every other extension, so that the first answer and its
    /// replays look alike.
    pub fn to_response(&self) -> Response<Bytes> {
        self.respond(self.status(), PROBLEM_CONTENT_TYPE, self.body())
    }

    /// This problem's answer with `status` and `body` of `content_type`: its headers
    /// (`Retry-After`, a challenge) and extensions, whatever the dialect.
    pub(crate) fn respond(
        &self,
        status: StatusCode,
        content_type: &'static str,
        body: Bytes,
    ) -> Response<Bytes> {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        response.extensions_mut().insert(self.kind);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        self.operation_state().mark(headers);
        if let Some(wait) = self.retry_after {
            let secs = wait.as_millis().div_ceil(1000).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
        }
        if self.kind == ProblemKind::MissingTenant {
            // RFC 9110 §15.5.2: every 401 carries a challenge. The layer cannot know the
            // service's own scheme; `Bearer` is what API clients send, and unlike
            // `Basic` it opens no login dialog in a browser.
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.kind == ProblemKind::InvalidCredential {
            // RFC 6750 §3.1: the token was presented and is not accepted.
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer error=\"invalid_token\""),
            );
        }
        response
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.title(), self.detail)
    }
}

impl OperationState {
    /// The state a problem of `kind` says by itself; where it depends on the key's
    /// record (a key reused with another payload, a takeover), the layer says it instead.
    pub fn of_problem(kind: ProblemKind) -> OperationState {
        match kind {
            // Refused before the key was reserved, or (a new key over its rate) reserved
            // and released before anything was forwarded.
            ProblemKind::InvalidKey
            | ProblemKind::MissingKey
            | ProblemKind::BodyUnreadable
            | ProblemKind::MissingTenant
            | ProblemKind::InvalidCredential
            | ProblemKind::CredentialUnavailable
            | ProblemKind::InvalidPath
            | ProblemKind::InvalidHost
            | ProblemKind::InvalidMethodOverride
            | ProblemKind::AmbiguousHeader
            | ProblemKind::DuplicateJsonMember
            | ProblemKind::UnreadableJson
            | ProblemKind::InvalidJsonRpc
            | ProblemKind::BodyTooLarge
            | ProblemKind::BodyTimeout
            | ProblemKind::TooManyInFlight
            | ProblemKind::KeyRateExceeded
            | ProblemKind::UpstreamUnreachable => OperationState::NotStarted,
            ProblemKind::RequestInProgress => OperationState::InProgress,
            // A tombstone: it completed once. The others are recorded in place of an
            // answer, or are a recorded answer that cannot be given now.
            ProblemKind::KeyExpired
            | ProblemKind::HandlerFailed
            | ProblemKind::ResponseTooLarge
            | ProblemKind::ReplayUnavailable
            | ProblemKind::UpstreamAnswerTooLarge => OperationState::Completed,
            // The record could not be read; or the request was sent and no answer came.
            // A reused key's record is read for its state where it can be. A reservation
            // confirmed late was not executed under, but its lease may have lapsed in
            // the meantime and another attempt taken the key over and acted.
            ProblemKind::StoreUnavailable
            | ProblemKind::ReservationLate
            | ProblemKind::UpstreamTimeout
            | ProblemKind::UpstreamConnectionLost
            | ProblemKind::KeyReused => OperationState::Unknown,
        }
    }
}

#[cfg(test)]
mod tests;
