//! `--profile`: the dialect an API speaks, which decides what its refusals look like.
//!
//! Every profile agrees on what executes (a replay, one execution per key); they differ
//! in how a refusal is spelt: its status and its body's shape.
//!
//! | profile | reused with another payload | in progress | missing key | malformed key |
//! |---|---|---|---|---|
//! | `ietf` | 422 (problem+json) | 409 with `Retry-After` | 400 | 400 |
//! | `stripe` | 400, `error.type` `idempotency_error` | 409, `error.code` `idempotency_key_in_use` | 400, `error.type` `invalid_request_error` | 400, `error.type` `invalid_request_error` |
//! | `acp` | 422, `type` `invalid_request`, `code` `idempotency_conflict` | 409, `code` `idempotency_in_flight`, `Retry-After` | 400, `code` `idempotency_key_required` | 400, `type` `invalid_request` |
//! | `ucp` | 409, `code` `idempotency_conflict` | 409 | 400 | 400 |
//! | `mcp` | 200, JSON-RPC `error.data.code` `idempotency_conflict` | 200, `error.data.code` `idempotency_in_flight`, `Retry-After` | 200, `error.data.code` `idempotency_key_required` | 200, `error.data.code` `idempotency_key_invalid` |

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use serde_json::Value;

pub use idem_core::Profile;

use super::client::Answer;

/// `--profile`: one of [`Profile::ALL`], each listed in `--help` with what its refusals
/// look like.
pub fn parser() -> impl TypedValueParser<Value = Profile> {
    let values = Profile::ALL.map(|p| {
        PossibleValue::new(p.as_str()).help(match p {
            Profile::Ietf => {
                "The IETF draft: 422 problem+json for a reused key, 409 with Retry-After"
            }
            Profile::Stripe => "Stripe's API: 400/409 with an `error` object",
            Profile::Acp => "The Agentic Commerce Protocol: flat `type`/`code` error bodies",
            Profile::Ucp => "The Universal Commerce Protocol: 409 with `code` for a reused key",
            Profile::Mcp => "MCP tool calls: JSON-RPC errors with `error.data.code`, the call's id",
        })
    });
    PossibleValuesParser::new(values).map(|name| {
        name.parse()
            .expect("clap let through only the possible values")
    })
}

/// A verdict on one answer: whether it is the profile's, and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// The answer is the one the profile expects.
    pub ok: bool,
    /// What was seen, and what was expected when it differs.
    pub detail: String,
}

/// What a refusal answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The key was used before with another payload.
    Mismatch,
    /// The key's first request is still in progress.
    InProgress,
    /// The route requires a key and there is none.
    MissingKey,
    /// The key is malformed (too long, a control character, two fields).
    MalformedKey,
}

/// One expectation on the body: the string at a JSON pointer.
type Field = (&'static str, &'static str);

/// What a refusal looks like under a [`Profile`], and the verdict on an answer.
pub trait Expectations: Copy {
    /// The status `refusal` is answered with.
    fn status(self, refusal: Refusal) -> u16;
    /// What `refusal` looks like under this profile, in words.
    fn expected(self, refusal: Refusal) -> String;
    /// Whether `a` is a 409 for a request still in progress, one worth sending again:
    /// under a profile whose reused key is a 409 too (`ucp`), not one that is this
    /// profile's answer to a reused key.
    fn in_progress(self, a: &Answer) -> bool;
    /// Whether `a` is this profile's answer to `refusal`.
    fn judge(self, refusal: Refusal, a: &Answer) -> Judged;
}

/// The status of `refusal` under `profile`, the body fields it must hold, and whether
/// it carries `Retry-After`.
fn expects(profile: Profile, refusal: Refusal) -> (u16, &'static [Field], bool) {
    use Refusal::*;
    match (profile, refusal) {
        (Profile::Ietf, Mismatch) => (422, &[], false),
        (Profile::Ietf, InProgress) => (409, &[], true),
        (Profile::Ietf | Profile::Ucp, MissingKey | MalformedKey) => (400, &[], false),
        (Profile::Stripe, Mismatch) => (400, &[("/error/type", "idempotency_error")], false),
        (Profile::Stripe, InProgress) => (
            409,
            &[
                ("/error/type", "idempotency_error"),
                ("/error/code", "idempotency_key_in_use"),
            ],
            false,
        ),
        (Profile::Stripe, MissingKey | MalformedKey) => {
            (400, &[("/error/type", "invalid_request_error")], false)
        }
        (Profile::Acp, Mismatch) => (
            422,
            &[
                ("/type", "invalid_request"),
                ("/code", "idempotency_conflict"),
            ],
            false,
        ),
        (Profile::Acp, InProgress) => (409, &[("/code", "idempotency_in_flight")], true),
        (Profile::Acp, MissingKey) => (400, &[("/code", "idempotency_key_required")], false),
        (Profile::Acp, MalformedKey) => (400, &[("/type", "invalid_request")], false),
        (Profile::Ucp, Mismatch) => (409, &[("/code", "idempotency_conflict")], false),
        (Profile::Ucp, InProgress) => (409, &[], false),
        (Profile::Mcp, Mismatch) => (200, &[("/error/data/code", "idempotency_conflict")], false),
        (Profile::Mcp, InProgress) => (200, &[("/error/data/code", "idempotency_in_flight")], true),
        (Profile::Mcp, MissingKey) => (
            200,
            &[("/error/data/code", "idempotency_key_required")],
            false,
        ),
        (Profile::Mcp, MalformedKey) => (
            200,
            &[("/error/data/code", "idempotency_key_invalid")],
            false,
        ),
    }
}

impl Expectations for Profile {
    fn status(self, refusal: Refusal) -> u16 {
        expects(self, refusal).0
    }

    fn expected(self, refusal: Refusal) -> String {
        let (status, fields, retry_after) = expects(self, refusal);
        let mut parts = vec![status.to_string()];
        parts.extend(fields.iter().map(|(p, v)| format!("{} {v:?}", dotted(p))));
        if retry_after {
            parts.push("Retry-After".to_owned());
        }
        parts.join(", ")
    }

    fn in_progress(self, a: &Answer) -> bool {
        if self == Profile::Mcp {
            // A tool call's refusals are all 200s, told apart by their code.
            return self.judge(Refusal::InProgress, a).ok;
        }
        a.status == 409
            && !(self.status(Refusal::Mismatch) == 409 && self.judge(Refusal::Mismatch, a).ok)
    }

    fn judge(self, refusal: Refusal, a: &Answer) -> Judged {
        let (status, fields, retry_after) = expects(self, refusal);
        let mut seen = vec![format!("answered {}", a.status)];
        let mut ok = a.status == status;
        if ok {
            // A tool call's refusal may come framed as an event stream.
            let body = if self == Profile::Mcp {
                super::rpc::response(a)
            } else {
                a.json()
            };
            for (pointer, want) in fields {
                let got = body
                    .as_ref()
                    .and_then(|b| b.pointer(pointer))
                    .and_then(Value::as_str);
                if got != Some(*want) {
                    ok = false;
                    seen.push(match got {
                        Some(got) => format!("{} {got:?}", dotted(pointer)),
                        None => format!("no {}", dotted(pointer)),
                    });
                }
            }
            if retry_after && !a.headers.contains_key(http::header::RETRY_AFTER) {
                ok = false;
                seen.push("no Retry-After".to_owned());
            }
            if self == Profile::Ietf
                && let Some(kind) = problem_type(a)
            {
                seen.push(format!("problem type {kind}"));
            }
        }
        let mut detail = seen.join(", ");
        if !ok {
            detail.push_str(&format!(
                " instead of {} (--profile {})",
                self.expected(refusal),
                self.as_str()
            ));
        }
        Judged { ok, detail }
    }
}

/// `/error/type` as `error.type`.
fn dotted(pointer: &str) -> String {
    pointer.trim_start_matches('/').replace('/', ".")
}

/// The `type` of a `application/problem+json` answer.
fn problem_type(a: &Answer) -> Option<String> {
    let ct = a.header("content-type")?;
    if !ct
        .to_ascii_lowercase()
        .starts_with("application/problem+json")
    {
        return None;
    }
    a.json()?.get("type")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut map = http::HeaderMap::new();
        for (n, v) in headers {
            map.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        Answer {
            status,
            headers: map,
            body: bytes::Bytes::from(body.to_owned()),
            received: Instant::now(),
            request_id: None,
        }
    }

    #[test]
    fn profiles_parse_by_name_and_ietf_is_the_default() {
        let cmd = clap::Command::new("check").arg(clap::Arg::new("p").value_parser(parser()));
        let parse = |name: &str| {
            let m = cmd.clone().try_get_matches_from(["check", name])?;
            Ok::<_, clap::Error>(*m.get_one::<Profile>("p").expect("given"))
        };
        for (name, p) in [
            ("ietf", Profile::Ietf),
            ("stripe", Profile::Stripe),
            ("acp", Profile::Acp),
            ("ucp", Profile::Ucp),
        ] {
            assert_eq!(parse(name).unwrap(), p);
            assert_eq!(p.as_str(), name);
        }
        assert!(parse("paypal").is_err());
        assert!(parse("Stripe").is_err(), "spelt exactly");
        assert_eq!(Profile::default(), Profile::Ietf);
    }

    #[test]
    fn ietf_mismatch_is_any_422_and_reports_the_problem_type() {
        let problem = answer(
            422,
            &[("content-type", "application/problem+json")],
            r#"{"type":"https://api.example/problems/key-reuse","status":422}"#,
        );
        let j = Profile::Ietf.judge(Refusal::Mismatch, &problem);
        assert!(j.ok, "{j:?}");
        assert!(
            j.detail
                .contains("problem type https://api.example/problems/key-reuse")
        );
        assert!(
            Profile::Ietf
                .judge(Refusal::Mismatch, &answer(422, &[], ""))
                .ok
        );
        let j = Profile::Ietf.judge(Refusal::Mismatch, &answer(201, &[], "{}"));
        assert!(!j.ok);
        assert_eq!(j.detail, "answered 201 instead of 422 (--profile ietf)");
        // In progress: 409 with Retry-After.
        assert!(
            Profile::Ietf
                .judge(
                    Refusal::InProgress,
                    &answer(409, &[("retry-after", "1")], "")
                )
                .ok
        );
        assert!(
            !Profile::Ietf
                .judge(Refusal::InProgress, &answer(409, &[], ""))
                .ok
        );
    }

    #[test]
    fn stripe_answers_are_judged_by_their_error_object() {
        let mismatch = answer(
            400,
            &[],
            r#"{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters"}}"#,
        );
        assert!(Profile::Stripe.judge(Refusal::Mismatch, &mismatch).ok);
        // A 422, fine under ietf, is not Stripe's answer.
        let j = Profile::Stripe.judge(Refusal::Mismatch, &answer(422, &[], "{}"));
        assert!(!j.ok);
        assert!(
            j.detail
                .contains("instead of 400, error.type \"idempotency_error\""),
            "{}",
            j.detail
        );
        let wrong = answer(400, &[], r#"{"error":{"type":"invalid_request_error"}}"#);
        let j = Profile::Stripe.judge(Refusal::Mismatch, &wrong);
        assert!(
            !j.ok && j.detail.contains("error.type \"invalid_request_error\""),
            "{}",
            j.detail
        );
        let busy = answer(
            409,
            &[],
            r#"{"error":{"type":"idempotency_error","code":"idempotency_key_in_use"}}"#,
        );
        assert!(Profile::Stripe.judge(Refusal::InProgress, &busy).ok);
        let bad = answer(
            400,
            &[],
            r#"{"error":{"type":"invalid_request_error","message":"…"}}"#,
        );
        assert!(Profile::Stripe.judge(Refusal::MalformedKey, &bad).ok);
        assert!(Profile::Stripe.judge(Refusal::MissingKey, &bad).ok);
        assert!(
            !Profile::Stripe
                .judge(Refusal::MissingKey, &answer(400, &[], "no json"))
                .ok
        );
    }

    #[test]
    fn acp_answers_are_flat_and_in_progress_carries_retry_after() {
        let conflict = answer(
            422,
            &[],
            r#"{"type":"invalid_request","code":"idempotency_conflict","message":"…"}"#,
        );
        assert!(Profile::Acp.judge(Refusal::Mismatch, &conflict).ok);
        let busy = r#"{"type":"invalid_request","code":"idempotency_in_flight"}"#;
        assert!(
            Profile::Acp
                .judge(
                    Refusal::InProgress,
                    &answer(409, &[("retry-after", "2")], busy)
                )
                .ok
        );
        let j = Profile::Acp.judge(Refusal::InProgress, &answer(409, &[], busy));
        assert!(!j.ok && j.detail.contains("no Retry-After"), "{}", j.detail);
        let missing = answer(
            400,
            &[],
            r#"{"type":"invalid_request","code":"idempotency_key_required"}"#,
        );
        assert!(Profile::Acp.judge(Refusal::MissingKey, &missing).ok);
        let malformed = answer(
            400,
            &[],
            r#"{"type":"invalid_request","code":"invalid_key"}"#,
        );
        assert!(Profile::Acp.judge(Refusal::MalformedKey, &malformed).ok);
        assert!(!Profile::Acp.judge(Refusal::MissingKey, &malformed).ok);
    }

    #[test]
    fn mcp_refusals_are_read_from_json_and_from_an_event_stream() {
        let error = r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32600,"message":"…","data":{"code":"idempotency_conflict"}}}"#;
        let json = answer(200, &[("content-type", "application/json")], error);
        assert!(Profile::Mcp.judge(Refusal::Mismatch, &json).ok);
        let sse = answer(
            200,
            &[("content-type", "text/event-stream")],
            &format!("event: message\ndata: {error}\n\n"),
        );
        assert!(Profile::Mcp.judge(Refusal::Mismatch, &sse).ok);
        let result = answer(
            200,
            &[("content-type", "text/event-stream")],
            "data: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n",
        );
        let j = Profile::Mcp.judge(Refusal::Mismatch, &result);
        assert!(!j.ok);
        assert_eq!(
            j.detail,
            "answered 200, no error.data.code instead of 200, error.data.code \
             \"idempotency_conflict\" (--profile mcp)"
        );
    }

    #[test]
    fn ucp_reuse_is_a_409_with_its_code() {
        let conflict = answer(409, &[], r#"{"code":"idempotency_conflict","content":"…"}"#);
        assert!(
            !Profile::Ucp.in_progress(&conflict),
            "a reused key is final"
        );
        assert!(Profile::Ietf.in_progress(&conflict));
        let busy = answer(
            409,
            &[],
            r#"{"code":"idempotency_in_flight","content":"…"}"#,
        );
        assert!(Profile::Ucp.in_progress(&busy));
        assert!(Profile::Ucp.judge(Refusal::Mismatch, &conflict).ok);
        assert!(
            !Profile::Ucp
                .judge(Refusal::Mismatch, &answer(422, &[], "{}"))
                .ok
        );
        assert!(
            !Profile::Ucp
                .judge(Refusal::Mismatch, &answer(409, &[], "{}"))
                .ok
        );
        assert!(
            Profile::Ucp
                .judge(Refusal::InProgress, &answer(409, &[], ""))
                .ok
        );
        assert!(
            Profile::Ucp
                .judge(Refusal::MalformedKey, &answer(400, &[], ""))
                .ok
        );
    }
}
