//! gRPC calls (SPEC S18): how the layer tells one, the statuses that release its key,
//! and the gRPC errors it answers a gRPC client with instead of HTTP problems.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};

use crate::problem::{Problem, ProblemKind};

/// The gRPC status codes by number (`OK` is 0, `UNAUTHENTICATED` 16), as the gRPC
/// specification names them.
pub const GRPC_CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

const INVALID_ARGUMENT: u32 = 3;
const DEADLINE_EXCEEDED: u32 = 4;
const PERMISSION_DENIED: u32 = 7;
const RESOURCE_EXHAUSTED: u32 = 8;
const ALREADY_EXISTS: u32 = 6;
const FAILED_PRECONDITION: u32 = 9;
const ABORTED: u32 = 10;
const INTERNAL: u32 = 13;
const UNAVAILABLE: u32 = 14;
const DATA_LOSS: u32 = 15;
const UNAUTHENTICATED: u32 = 16;
const CANCELLED: u32 = 1;

/// gRPC statuses that release the key by default (SPEC S18): `INVALID_ARGUMENT`,
/// `PERMISSION_DENIED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `UNAVAILABLE`,
/// `UNAUTHENTICATED`. Each says the call did not take effect, so a retry with the same
/// key may run it; every other status is recorded.
pub const DEFAULT_GRPC_RELEASE_CODES: [u32; 6] = [
    INVALID_ARGUMENT,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    ABORTED,
    UNAVAILABLE,
    UNAUTHENTICATED,
];

/// The trailers (or, in a trailers-only answer, headers) that carry a gRPC call's
/// status; always recorded with a gRPC answer and replayed where they came.
pub const GRPC_STATUS_FIELDS: [&str; 3] =
    ["grpc-status", "grpc-message", "grpc-status-details-bin"];

/// The header that tells a gRPC client how long to wait before it retries
/// (`ABORTED` for a call in progress, `UNAVAILABLE` for a store outage).
pub const GRPC_RETRY_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The gRPC statuses that release the key instead of recording the answer (SPEC S18),
/// as [`ReleaseStatuses`](crate::ReleaseStatuses) are for HTTP statuses; by default
/// [`DEFAULT_GRPC_RELEASE_CODES`].
///
/// ```
/// use idem_tower::GrpcReleaseCodes;
///
/// let codes = GrpcReleaseCodes::parse(["UNAVAILABLE", "aborted", "8"]).unwrap();
/// assert!(codes.contains(14) && codes.contains(10) && codes.contains(8));
/// assert!(!codes.contains(13));
/// assert!(GrpcReleaseCodes::default().contains(16));
/// assert!(GrpcReleaseCodes::parse(["NOT_A_CODE"]).is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct GrpcReleaseCodes(Arc<[u32]>);

impl GrpcReleaseCodes {
    /// The set of `codes`; repeats are ignored.
    pub fn new<I: IntoIterator<Item = u32>>(codes: I) -> GrpcReleaseCodes {
        let mut codes: Vec<u32> = codes.into_iter().collect();
        codes.sort_unstable();
        codes.dedup();
        GrpcReleaseCodes(codes.into())
    }

    /// The set named by `codes`: each a status name (`UNAVAILABLE`, any case) or its
    /// number (`14`), 0 to 16. The error says which entry is neither.
    pub fn parse<I, S>(codes: I) -> Result<GrpcReleaseCodes, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let parsed: Result<Vec<u32>, String> =
            codes.into_iter().map(|c| parse_code(c.as_ref())).collect();
        parsed.map(GrpcReleaseCodes::new)
    }

    /// Whether an answer with gRPC status `code` releases the key.
    pub fn contains(&self, code: u32) -> bool {
        self.0.binary_search(&code).is_ok()
    }

    /// The codes, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }
}

impl Default for GrpcReleaseCodes {
    fn default() -> Self {
        GrpcReleaseCodes::new(DEFAULT_GRPC_RELEASE_CODES)
    }
}

impl fmt::Debug for GrpcReleaseCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.0.iter().map(|&c| code_name(c)))
            .finish()
    }
}

/// The name of gRPC status `code` (`UNAVAILABLE`), or `"?"` for a number gRPC does not
/// define.
pub fn code_name(code: u32) -> &'static str {
    GRPC_CODE_NAMES.get(code as usize).copied().unwrap_or("?")
}

/// A gRPC status given by name (any case) or number.
fn parse_code(text: &str) -> Result<u32, String> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u32>() {
        if (n as usize) < GRPC_CODE_NAMES.len() {
            return Ok(n);
        }
    } else if let Some(n) = GRPC_CODE_NAMES
        .iter()
        .position(|name| name.eq_ignore_ascii_case(text))
    {
        return Ok(n as u32);
    }
    Err(format!(
        "{text:?} is no gRPC status: give a name ({}) or a number from 0 to 16",
        GRPC_CODE_NAMES.join(", ")
    ))
}

/// Whether a request or response with `headers` is gRPC: its content type is
/// `application/grpc` or `application/grpc+<codec>` (`+proto`, `+json`). gRPC-Web
/// (`application/grpc-web…`) carries its trailers in the body and is plain HTTP here.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some(rest) = essence
        .get(..16)
        .filter(|p| p.eq_ignore_ascii_case("application/grpc"))
        .map(|_| &essence[16..])
    else {
        return false;
    };
    rest.is_empty() || rest.starts_with('+')
}

/// The gRPC status in `headers` (trailers, or a trailers-only answer's headers), if
/// there is one that reads as a number.
pub(crate) fn status_in(headers: &HeaderMap) -> Option<u32> {
    headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether the request body `body` is exactly one gRPC length-prefixed message, as a
/// unary call's is: a 5-byte prefix (compressed flag, big-endian length) and that many
/// bytes. A client-streaming call sends several, or none.
pub(crate) fn is_one_message(body: &[u8]) -> bool {
    let Some(prefix) = body.get(..5) else {
        return false;
    };
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    body.len() - 5 == len
}

/// The answer to a keyed gRPC call whose request stream is not one message: a
/// client-streaming (or bidirectional) call, which keys do not cover (SPEC S18).
/// Nothing was reserved or forwarded.
pub(crate) fn not_unary() -> Response<Bytes> {
    status_response(
        INVALID_ARGUMENT,
        "an idempotency-key is honoured on unary calls only, and this call's request \
         stream is not one message; send streaming calls without a key; nothing was \
         reserved or forwarded",
    )
}

/// A trailers-only gRPC answer with status `code` and `message`.
pub(crate) fn status_response(code: u32, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", message);
    }
    response
}

/// A gRPC call's fingerprint (SPEC S18): over `POST` and its method path and the
/// message bytes as sent. Protobuf encodings are not canonical, so no normalisation is
/// tried; the same client resends the same bytes.
pub(crate) fn fingerprint(
    parts: &http::request::Parts,
    body: &[u8],
    options: &idem_core::FingerprintOptions,
) -> idem_core::Fingerprint {
    let path = parts.uri.path();
    let mut target = String::with_capacity(5 + path.len());
    target.push_str("POST ");
    target.push_str(path);
    // No content type: `application/grpc+json` must not be read as JSON.
    idem_core::Fingerprint::compute("POST", &target, None, body, options)
}

impl ProblemKind {
    /// The gRPC status the layer answers a gRPC client with for this problem (SPEC
    /// S18); the idem guide's gRPC page says why for each.
    pub fn grpc_code(self) -> u32 {
        match self {
            // The call as sent can never succeed: correct it.
            ProblemKind::InvalidKey
            | ProblemKind::MissingKey
            | ProblemKind::InvalidPath
            | ProblemKind::InvalidHost
            | ProblemKind::InvalidMethodOverride
            | ProblemKind::AmbiguousHeader
            | ProblemKind::DuplicateJsonMember
            | ProblemKind::UnreadableJson
            | ProblemKind::InvalidJsonRpc => INVALID_ARGUMENT,
            // The client's own stream broke off; nothing was reserved.
            ProblemKind::BodyUnreadable => CANCELLED,
            ProblemKind::MissingTenant | ProblemKind::InvalidCredential => UNAUTHENTICATED,
            // gRPC's own answer to a message over a receiver's limit.
            ProblemKind::BodyTooLarge
            | ProblemKind::TooManyInFlight
            | ProblemKind::KeyRateExceeded => RESOURCE_EXHAUSTED,
            ProblemKind::BodyTimeout => DEADLINE_EXCEEDED,
            // Another attempt holds the key: retry after the pushback.
            ProblemKind::RequestInProgress => ABORTED,
            ProblemKind::KeyReused => FAILED_PRECONDITION,
            // Done once, and not to be done again: what the call asked for exists.
            ProblemKind::KeyExpired => ALREADY_EXISTS,
            // Recorded and final: the call may have had effects.
            ProblemKind::HandlerFailed
            | ProblemKind::ResponseTooLarge
            | ProblemKind::UpstreamAnswerTooLarge => INTERNAL,
            // Nothing ran (or the outcome is held in progress): retry with the same key.
            ProblemKind::StoreUnavailable
            | ProblemKind::ReservationLate
            | ProblemKind::CredentialUnavailable
            | ProblemKind::ReplayUnavailable
            | ProblemKind::UpstreamUnreachable
            | ProblemKind::UpstreamConnectionLost => UNAVAILABLE,
            // Sent, and no answer in time: the outcome is unknown, as gRPC's own
            // deadline says.
            ProblemKind::UpstreamTimeout => DEADLINE_EXCEEDED,
        }
    }
}

impl Problem {
    /// The gRPC status this problem is answered with: its kind's
    /// ([`ProblemKind::grpc_code`]), except for a recorded answer that cannot be opened
    /// ([`Problem::unopenable`], HTTP 500), which is `DATA_LOSS`: the call ran, its
    /// answer is unreadable, and a retry must not be taken as safe, as gRPC clients
    /// take `UNAVAILABLE`.
    pub fn grpc_code(&self) -> u32 {
        match (self.kind, self.status) {
            (ProblemKind::ReplayUnavailable, Some(StatusCode::INTERNAL_SERVER_ERROR)) => DATA_LOSS,
            (kind, _) => kind.grpc_code(),
        }
    }

    /// This problem as a gRPC error (SPEC S18): HTTP 200, a trailers-only answer whose
    /// headers carry `grpc-status` ([`ProblemKind::grpc_code`]) and `grpc-message` (the
    /// title and detail, percent-encoded), and a retry delay as
    /// `grpc-retry-pushback-ms`. It carries the same extensions as
    /// [`Problem::to_response`].
    pub fn to_grpc_response(&self) -> Response<Bytes> {
        let (mut head, _) = self.to_response().into_parts();
        head.status = StatusCode::OK;
        head.headers.remove(header::RETRY_AFTER);
        head.headers.remove(header::WWW_AUTHENTICATE);
        let headers = &mut head.headers;
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from(self.grpc_code()));
        let message = percent_encode(&format!("{}: {}", self.kind.title(), self.detail));
        if let Ok(message) = HeaderValue::from_str(&message) {
            headers.insert("grpc-message", message);
        }
        if let Some(wait) = self.retry_after {
            headers.insert(
                GRPC_RETRY_PUSHBACK,
                HeaderValue::from(wait.as_millis() as u64),
            );
        }
        Response::from_parts(head, Bytes::new())
    }

    /// [`to_grpc_response`](Problem::to_grpc_response) for a gRPC client, else
    /// [`to_response_in`](Problem::to_response_in) the route's profile.
    pub(crate) fn answer(&self, dialect: crate::profile::Dialect) -> Response<Bytes> {
        if dialect.grpc {
            self.to_grpc_response()
        } else {
            self.to_response_in(dialect.profile)
        }
    }
}

/// `grpc-message`'s encoding (gRPC over HTTP/2): bytes outside printable ASCII, and
/// `%`, as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).unwrap(),
        );
        h
    }

    #[test]
    fn grpc_is_told_by_its_content_type_and_grpc_web_is_not_grpc() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+json; x=1",
        ] {
            assert!(is_grpc(&headers(yes)), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/json",
            "application/grpcx",
        ] {
            assert!(!is_grpc(&headers(no)), "{no}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn codes_parse_by_name_or_number_and_nothing_else() {
        assert_eq!(parse_code("unavailable"), Ok(14));
        assert_eq!(parse_code(" 0 "), Ok(0));
        assert_eq!(parse_code("16"), Ok(16));
        assert!(parse_code("17").is_err());
        assert!(parse_code("UNAVAILABLEX").is_err());
        let names: Vec<_> = GrpcReleaseCodes::default().iter().map(code_name).collect();
        assert_eq!(
            names,
            [
                "INVALID_ARGUMENT",
                "PERMISSION_DENIED",
                "RESOURCE_EXHAUSTED",
                "ABORTED",
                "UNAVAILABLE",
                "UNAUTHENTICATED"
            ]
        );
    }

    #[test]
    fn one_message_is_a_prefix_and_its_length() {
        assert!(is_one_message(&[0, 0, 0, 0, 2, b'h', b'i']));
        assert!(is_one_message(&[0, 0, 0, 0, 0]));
        assert!(!is_one_message(&[0, 0, 0, 0, 1, b'h', 0, 0, 0, 0, 0]));
        assert!(!is_one_message(&[]));
        assert!(!is_one_message(&[0, 0, 0, 0, 9, b'h']));
    }

    /// The gateway's own answers a gRPC client can act on, as SPEC S18 and the guide's
    /// gRPC page name them; an expired key's tombstone (SPEC S16) is `ALREADY_EXISTS`.
    #[test]
    fn the_layers_answers_map_to_the_documented_grpc_statuses() {
        let name = |kind: ProblemKind| code_name(kind.grpc_code());
        assert_eq!(name(ProblemKind::RequestInProgress), "ABORTED");
        assert_eq!(name(ProblemKind::KeyReused), "FAILED_PRECONDITION");
        assert_eq!(name(ProblemKind::KeyExpired), "ALREADY_EXISTS");
        assert_eq!(name(ProblemKind::InvalidKey), "INVALID_ARGUMENT");
        assert_eq!(name(ProblemKind::MissingKey), "INVALID_ARGUMENT");
        assert_eq!(name(ProblemKind::StoreUnavailable), "UNAVAILABLE");
        assert_eq!(
            code_name(Problem::unopenable("sealed").grpc_code()),
            "DATA_LOSS"
        );
        assert_eq!(
            Problem::unopenable("sealed").to_grpc_response().headers()["grpc-status"],
            "15"
        );
        let answer =
            Problem::key_expired(idem_core::Timestamp::from_millis(0), 201).to_grpc_response();
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()["grpc-status"], "6");
        assert!(answer.headers().get("grpc-retry-pushback-ms").is_none());
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(percent_encode("50% off – now"), "50%25 off %E2%80%93 now");
    }
}
