//! Profiles: the dialect the layer's own answers are written in, so that each client
//! reads them as its protocol's SDK expects (the IETF draft's problem details, Stripe's
//! error envelope, the Agentic Commerce Protocol's and the Universal Commerce
//! Protocol's flat errors, JSON-RPC errors to MCP tool calls).
//!
//! A profile changes how an answer is written, and one rule of what happens to the key
//! (SPEC S23): which upstream statuses release it by default
//! ([`ReleaseStatuses::of_profile`]). A key reused with another payload is refused
//! under every profile, only its status and body differ.

use bytes::Bytes;
use http::StatusCode;
use idem_core::Profile;
use serde_json::{Map, Value};

use crate::config::ReleaseStatuses;
use crate::problem::{Problem, ProblemKind};

/// What a [`Profile`] means to the layer: the statuses and bodies of its answers, as
/// the table on [`Profile`](crate::Profile) shows.
pub(crate) trait Speaks: Copy {
    /// Whether every answer to a keyed request echoes its key (ACP: "echo on all POST
    /// responses").
    fn echoes_key(self) -> bool;
    /// Whether an upstream 5xx releases the key by default, so the retry executes
    /// afresh (ACP: "5xx responses MUST NOT be stored"), rather than being recorded
    /// (SPEC S6). The layer's own 504s for an outcome it could not observe never do.
    fn releases_server_errors(self) -> bool;
    /// The header the record's lifetime is published in, unless a setting says
    /// otherwise: ACP's agents asked for one (ACP issue 97); the other protocols
    /// publish it in their documentation.
    fn retention_header(self) -> Option<http::HeaderName>;
    /// The name of the replay marker, unless a setting says otherwise.
    fn replay_marker(self) -> http::HeaderName;
    /// The status `problem` is answered with under this profile.
    fn status(self, problem: &Problem) -> StatusCode;
    /// The body of `problem` under this profile, and its media type.
    fn body(self, problem: &Problem) -> (&'static str, Bytes);
}

impl Speaks for Profile {
    fn echoes_key(self) -> bool {
        match self {
            Profile::Acp => true,
            Profile::Ietf | Profile::Stripe | Profile::Ucp | Profile::Mcp => false,
        }
    }

    fn releases_server_errors(self) -> bool {
        match self {
            Profile::Acp => true,
            // UCP's REST binding stores "the operation result" for duplicate keys,
            // with no exception for 5xx. MCP says nothing of it: a tool's own failure is a
            // JSON-RPC result, and an HTTP 5xx is recorded as S6 says.
            Profile::Ietf | Profile::Stripe | Profile::Ucp | Profile::Mcp => false,
        }
    }

    fn retention_header(self) -> Option<http::HeaderName> {
        match self {
            Profile::Acp => Some(crate::publish::RETENTION_HEADER),
            Profile::Ietf | Profile::Stripe | Profile::Ucp | Profile::Mcp => None,
        }
    }

    fn replay_marker(self) -> http::HeaderName {
        match self {
            // Stripe's name, which ACP's SEP #120 took.
            Profile::Ietf | Profile::Stripe | Profile::Acp | Profile::Ucp | Profile::Mcp => {
                crate::IDEMPOTENT_REPLAYED
            }
        }
    }

    fn status(self, problem: &Problem) -> StatusCode {
        let kind = problem.kind();
        let reused_or_expired = matches!(kind, ProblemKind::KeyReused | ProblemKind::KeyExpired);
        match self {
            Profile::Stripe if reused_or_expired => StatusCode::BAD_REQUEST,
            Profile::Acp if kind == ProblemKind::KeyExpired => StatusCode::UNPROCESSABLE_ENTITY,
            Profile::Ucp if reused_or_expired => StatusCode::CONFLICT,
            Profile::Mcp => crate::mcp::reply::status(problem),
            Profile::Ietf | Profile::Stripe | Profile::Acp | Profile::Ucp => problem.status(),
        }
    }

    fn body(self, problem: &Problem) -> (&'static str, Bytes) {
        let status = self.status(problem);
        let kind = problem.kind();
        let members = problem.extension_members();
        let body = match self {
            Profile::Ietf => return (crate::PROBLEM_CONTENT_TYPE, problem.body()),
            Profile::Stripe => {
                let mut error = Map::new();
                error.insert("type".into(), stripe_type(kind, status).into());
                if kind == ProblemKind::RequestInProgress {
                    error.insert("code".into(), "idempotency_key_in_use".into());
                } else if status == StatusCode::TOO_MANY_REQUESTS {
                    error.insert("code".into(), "rate_limit".into());
                }
                error.insert("message".into(), problem.detail().into());
                error.insert("doc_url".into(), kind.type_uri().into());
                error.extend(members);
                serde_json::json!({ "error": error })
            }
            Profile::Acp => {
                let mut error = Map::new();
                error.insert("type".into(), acp_type(status).into());
                error.insert("code".into(), code(kind).into());
                error.insert("message".into(), problem.detail().into());
                error.extend(members);
                Value::Object(error)
            }
            Profile::Ucp => {
                let mut error = Map::new();
                error.insert("code".into(), code(kind).into());
                error.insert("content".into(), problem.detail().into());
                error.extend(members);
                Value::Object(error)
            }
            Profile::Mcp => crate::mcp::reply::body(problem),
        };
        ("application/json", Bytes::from(body.to_string()))
    }
}

impl Problem {
    /// [`to_response`](Problem::to_response) in `profile`'s dialect: its status for
    /// this kind and its body shape (see [`Profile`]).
    pub fn to_response_in(&self, profile: Profile) -> http::Response<Bytes> {
        let (content_type, body) = profile.body(self);
        self.respond(profile.status(self), content_type, body)
    }
}

impl ReleaseStatuses {
    /// The statuses that release the key under `profile` unless the layer or a route
    /// is given its own (SPEC S6, S23): [`DEFAULT_RELEASE_STATUSES`](crate::DEFAULT_RELEASE_STATUSES),
    /// and under `acp` every 5xx as well.
    ///
    /// ```
    /// use http::StatusCode;
    /// use idem_tower::{Profile, ReleaseStatuses};
    ///
    /// assert!(ReleaseStatuses::of_profile(Profile::Acp).contains(StatusCode::INTERNAL_SERVER_ERROR));
    /// assert!(!ReleaseStatuses::of_profile(Profile::Ietf).contains(StatusCode::INTERNAL_SERVER_ERROR));
    /// assert_eq!(ReleaseStatuses::of_profile(Profile::Stripe), ReleaseStatuses::default());
    /// ```
    pub fn of_profile(profile: Profile) -> ReleaseStatuses {
        let defaults = ReleaseStatuses::default();
        if !profile.releases_server_errors() {
            return defaults;
        }
        let server_errors = (500..=599).filter_map(|c| StatusCode::from_u16(c).ok());
        ReleaseStatuses::new(defaults.iter().chain(server_errors))
    }

    /// How this set, given in place of `profile`'s, contradicts its protocol's rule for
    /// an upstream 5xx (SPEC S23), as the end of a sentence; `None`
    /// where it keeps it.
    /// Under `acp` a registered 5xx (one with a reason phrase: 500 to 511) that is
    /// recorded does; under the others, a 5xx other than 503 that is released.
    pub fn contradicts(&self, profile: Profile) -> Option<String> {
        let server_errors = (500..=599).filter_map(|c| StatusCode::from_u16(c).ok());
        let registered = server_errors
            .clone()
            .filter(|s| s.canonical_reason().is_some());
        let departs: Vec<StatusCode> = if profile.releases_server_errors() {
            registered.filter(|s| !self.contains(*s)).collect()
        } else {
            let released = server_errors.filter(|s| self.contains(*s));
            released
                .filter(|s| *s != StatusCode::SERVICE_UNAVAILABLE)
                .collect()
        };
        let departs: Vec<u16> = departs.iter().map(|s| s.as_u16()).collect();
        let (first, more) = match departs.as_slice() {
            [] => return None,
            [first, rest @ ..] => (first, if rest.is_empty() { "" } else { " and others" }),
        };
        Some(if profile.releases_server_errors() {
            format!(
                "records an upstream {first}{more}, which the protocol says must not be \
                 stored: a retry gets the 5xx again instead of reaching the upstream"
            )
        } else {
            format!(
                "releases an upstream {first}{more}, which the protocol records: a retry runs \
                 again an operation that may have acted"
            )
        })
    }
}

/// Stripe's error `type`: `idempotency_error` for a key's misuse, `api_error` for the
/// server's failures, `invalid_request_error` for the rest.
fn stripe_type(kind: ProblemKind, status: StatusCode) -> &'static str {
    match kind {
        ProblemKind::KeyReused | ProblemKind::KeyExpired | ProblemKind::RequestInProgress => {
            "idempotency_error"
        }
        _ if status.is_server_error() => "api_error",
        _ => "invalid_request_error",
    }
}

/// ACP's error `type`.
fn acp_type(status: StatusCode) -> &'static str {
    if status == StatusCode::SERVICE_UNAVAILABLE {
        "service_unavailable"
    } else if status.is_server_error() {
        "processing_error"
    } else {
        "invalid_request"
    }
}

/// The `code` of ACP's and UCP's errors: ACP's own for the idempotency answers, else
/// the problem's slug with `_` (`body_too_large`).
pub(crate) fn code(kind: ProblemKind) -> String {
    match kind {
        ProblemKind::KeyReused => "idempotency_conflict".to_owned(),
        ProblemKind::RequestInProgress => "idempotency_in_flight".to_owned(),
        ProblemKind::MissingKey => "idempotency_key_required".to_owned(),
        ProblemKind::InvalidKey => "idempotency_key_invalid".to_owned(),
        ProblemKind::KeyExpired => "idempotency_key_expired".to_owned(),
        other => other
            .type_uri()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .replace('-', "_"),
    }
}

/// How the layer's own answers to one request are written: as gRPC errors to a gRPC
/// call (SPEC S18), else in the route's profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Dialect {
    /// A gRPC call.
    pub(crate) grpc: bool,
    /// The route's profile.
    pub(crate) profile: Profile,
}

#[cfg(test)]
impl Dialect {
    /// Plain HTTP in `profile`.
    pub(crate) fn http(profile: Profile) -> Dialect {
        Dialect {
            grpc: false,
            profile,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn answer(profile: Profile, problem: Problem) -> (StatusCode, http::HeaderMap, Value) {
        let r = problem.answer(Dialect::http(profile));
        let body = serde_json::from_slice(r.body()).unwrap();
        (r.status(), r.headers().clone(), body)
    }

    fn reused() -> Problem {
        Problem::new(ProblemKind::KeyReused, "another payload")
    }

    fn busy() -> Problem {
        Problem::new(ProblemKind::RequestInProgress, "busy").retry_after(Duration::from_secs(2))
    }

    #[test]
    fn ietf_is_todays_problem_details() {
        let (status, headers, body) = answer(Profile::Ietf, reused());
        assert_eq!(status, 422);
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(body["type"], "https://idem.dev/problems/key-reused");
    }

    #[test]
    fn stripe_answers_in_its_error_envelope() {
        let (status, headers, body) = answer(Profile::Stripe, reused());
        assert_eq!(status, 400);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(body["error"]["type"], "idempotency_error");
        assert_eq!(body["error"]["message"], "another payload");
        assert_eq!(
            body["error"]["doc_url"],
            "https://idem.dev/problems/key-reused"
        );
        assert!(body["error"].get("code").is_none());

        let (status, headers, body) = answer(Profile::Stripe, busy());
        assert_eq!(status, 409);
        assert_eq!(headers["retry-after"], "2");
        assert_eq!(body["error"]["type"], "idempotency_error");
        assert_eq!(body["error"]["code"], "idempotency_key_in_use");

        let missing = Problem::new(ProblemKind::MissingKey, "send one");
        let (status, _, body) = answer(Profile::Stripe, missing);
        assert_eq!(status, 400);
        assert_eq!(body["error"]["type"], "invalid_request_error");

        let down = Problem::new(ProblemKind::StoreUnavailable, "down");
        let (status, _, body) = answer(Profile::Stripe, down);
        assert_eq!(status, 503);
        assert_eq!(body["error"]["type"], "api_error");

        let expired = Problem::key_expired(idem_core::Timestamp::from_millis(0), 201);
        let (status, _, body) = answer(Profile::Stripe, expired);
        assert_eq!(status, 400);
        assert_eq!(body["error"]["type"], "idempotency_error");
        assert_eq!(body["error"]["completed_status"], 201);
    }

    #[test]
    fn acp_answers_with_its_codes_and_flat_errors() {
        let cases = [
            (reused(), 422, "idempotency_conflict", "invalid_request"),
            (busy(), 409, "idempotency_in_flight", "invalid_request"),
            (
                Problem::new(ProblemKind::MissingKey, "x"),
                400,
                "idempotency_key_required",
                "invalid_request",
            ),
            (
                Problem::new(ProblemKind::InvalidKey, "x"),
                400,
                "idempotency_key_invalid",
                "invalid_request",
            ),
            (
                Problem::key_expired(idem_core::Timestamp::from_millis(0), 200),
                422,
                "idempotency_key_expired",
                "invalid_request",
            ),
            (
                Problem::new(ProblemKind::StoreUnavailable, "x"),
                503,
                "store_unavailable",
                "service_unavailable",
            ),
            (
                Problem::new(ProblemKind::HandlerFailed, "x"),
                500,
                "handler_failed",
                "processing_error",
            ),
        ];
        for (problem, status, code, kind) in cases {
            let (got, headers, body) = answer(Profile::Acp, problem);
            assert_eq!(got, status, "{body}");
            assert_eq!(headers["content-type"], "application/json");
            assert_eq!(body["code"], code);
            assert_eq!(body["type"], kind);
            assert!(body["message"].is_string());
        }
        assert!(Profile::Acp.echoes_key());
        assert!(!Profile::Stripe.echoes_key());
    }

    #[test]
    fn acp_releases_every_5xx_by_default_and_the_others_record_them() {
        let acp = ReleaseStatuses::of_profile(Profile::Acp);
        for code in [500, 501, 502, 503, 504, 599] {
            assert!(acp.contains(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        assert!(acp.contains(StatusCode::CONFLICT));
        assert!(!acp.contains(StatusCode::PAYMENT_REQUIRED));
        for profile in [Profile::Ietf, Profile::Stripe, Profile::Ucp] {
            let set = ReleaseStatuses::of_profile(profile);
            assert_eq!(set, ReleaseStatuses::default(), "{profile}");
            assert!(!set.contains(StatusCode::INTERNAL_SERVER_ERROR));
        }
        for profile in Profile::ALL {
            assert_eq!(
                ReleaseStatuses::of_profile(profile).contradicts(profile),
                None
            );
        }
    }

    #[test]
    fn a_list_that_departs_from_its_profiles_5xx_rule_is_named() {
        let none = ReleaseStatuses::new([]);
        let why = none.contradicts(Profile::Acp).unwrap();
        assert!(
            why.starts_with("records an upstream 500 and others"),
            "{why}"
        );
        let only_500 = ReleaseStatuses::new([StatusCode::INTERNAL_SERVER_ERROR]);
        assert!(only_500.contradicts(Profile::Acp).unwrap().contains("501"));
        let why = only_500.contradicts(Profile::Stripe).unwrap();
        assert!(why.starts_with("releases an upstream 500,"), "{why}");
        assert!(
            ReleaseStatuses::default()
                .contradicts(Profile::Acp)
                .is_some()
        );
        assert_eq!(none.contradicts(Profile::Ietf), None);
    }

    #[test]
    fn every_dialect_says_where_the_operation_stands() {
        let held = || reused().in_state(crate::OperationState::Completed);
        for profile in Profile::ALL {
            let (_, headers, body) = answer(profile, held());
            assert_eq!(
                headers["idempotency-operation-state"], "completed",
                "{profile}"
            );
            let member = match profile {
                Profile::Stripe => &body["error"]["operation_state"],
                Profile::Ietf | Profile::Acp | Profile::Ucp => &body["operation_state"],
                Profile::Mcp => &body["error"]["data"]["operation_state"],
            };
            assert_eq!(member, "completed", "{profile}: {body}");
            let (_, headers, body) = answer(profile, busy());
            assert_eq!(headers["idempotency-operation-state"], "in_progress");
            assert!(
                body.to_string()
                    .contains("\"operation_state\":\"in_progress\"")
            );
        }
        let grpc = busy().answer(Dialect {
            grpc: true,
            profile: Profile::Ietf,
        });
        assert_eq!(grpc.headers()["idempotency-operation-state"], "in_progress");
    }

    #[test]
    fn ucp_answers_409_for_a_reused_key_with_code_and_content() {
        let (status, _, body) = answer(Profile::Ucp, reused());
        assert_eq!(status, 409);
        assert_eq!(body["code"], "idempotency_conflict");
        assert_eq!(body["content"], "another payload");
        let (status, headers, body) = answer(Profile::Ucp, busy());
        assert_eq!(status, 409);
        assert_eq!(headers["retry-after"], "2");
        assert_eq!(body["code"], "idempotency_in_flight");
    }

    #[test]
    fn a_duplicate_json_member_or_unreadable_json_is_a_400_in_every_dialect() {
        for (kind, slug) in [
            (ProblemKind::DuplicateJsonMember, "duplicate-json-member"),
            (ProblemKind::UnreadableJson, "unreadable-json"),
        ] {
            let refused = || Problem::new(kind, "refused");
            let uri = format!("https://idem.dev/problems/{slug}");
            let code = slug.replace('-', "_");
            let (status, headers, body) = answer(Profile::Ietf, refused());
            assert_eq!(status, 400);
            assert_eq!(headers["content-type"], "application/problem+json");
            assert_eq!(body["type"], *uri);
            assert_eq!(body["detail"], "refused");
            let (status, headers, body) = answer(Profile::Stripe, refused());
            assert_eq!(status, 400);
            assert_eq!(headers["content-type"], "application/json");
            assert_eq!(body["error"]["type"], "invalid_request_error");
            assert_eq!(body["error"]["doc_url"], *uri);
            assert_eq!(body["error"]["message"], "refused");
            let (status, _, body) = answer(Profile::Acp, refused());
            assert_eq!(status, 400);
            assert_eq!(body["type"], "invalid_request");
            assert_eq!(body["code"], *code);
            let (status, _, body) = answer(Profile::Ucp, refused());
            assert_eq!(status, 400);
            assert_eq!(body["code"], *code);
            assert_eq!(body["content"], "refused");
            let grpc = refused().answer(Dialect {
                grpc: true,
                profile: Profile::Ietf,
            });
            assert_eq!(grpc.headers()["grpc-status"], "3", "INVALID_ARGUMENT");
        }
    }

    #[test]
    fn grpc_calls_get_grpc_errors_whatever_the_profile() {
        for profile in Profile::ALL {
            let r = reused().answer(Dialect {
                grpc: true,
                profile,
            });
            assert_eq!(r.status(), 200);
            assert!(r.headers().contains_key("grpc-status"));
        }
    }
}
