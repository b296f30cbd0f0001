//! The answers to MCP tool calls (SPEC S24): the layer's own as JSON-RPC errors, and a
//! replay carrying the retry's own request `id` in place of the first attempt's, in a
//! JSON body and in a `text/event-stream` one alike; nothing else in the recorded answer
//! changes.
//!
//! | answer                                   | JSON-RPC `code` | HTTP |
//! |------------------------------------------|-----------------|------|
//! | body that does not parse                 | -32700          | 400  |
//! | no readable JSON-RPC request where a keyed call may be (`invalid-json-rpc`, a member named twice) | -32600 | 400 |
//! | key missing where required, key malformed, keys that disagree | -32602 | 200 |
//! | key reused with other arguments, call in progress, expired key, store unavailable, overload, upstream failures, the rest | -32000 | 200 |
//!
//! `-32000` follows UCP's MCP binding, which answers its protocol errors (its REST
//! binding's 409 among them) with it; `error.data` says which one (`type`, `code`,
//! `status`, and `retry_after` in seconds where a retry is worth it). A body too large
//! and a credential the layer needs keep their HTTP status (413, 401), as MCP's
//! transport answers what it cannot accept with one.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::RequestId;
use crate::IdempotencyBody;
use crate::bounds::ReadBody;
use crate::problem::{Problem, ProblemKind};
use crate::replay::IDEMPOTENT_REPLAYED;

/// JSON-RPC's "Parse error".
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's "Invalid Request".
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's "Invalid params".
pub const INVALID_PARAMS: i64 = -32602;
/// The first of JSON-RPC's server errors, which UCP's MCP binding answers its protocol
/// errors with.
pub const SERVER_ERROR: i64 = -32000;

/// A JSON-RPC 2.0 error response with `code`, `message` and `data`, its `id` `null`
/// until the request's is known: the layer sets it in every answer to a call.
pub fn error_response(code: i64, message: &str, data: Map<String, Value>) -> Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message, "data": data },
    })
}

/// The JSON-RPC error code of `kind`'s answer.
pub fn error_code(kind: ProblemKind) -> i64 {
    match kind {
        ProblemKind::UnreadableJson => PARSE_ERROR,
        ProblemKind::InvalidJsonRpc | ProblemKind::DuplicateJsonMember => INVALID_REQUEST,
        ProblemKind::MissingKey | ProblemKind::InvalidKey => INVALID_PARAMS,
        _ => SERVER_ERROR,
    }
}

/// The HTTP status of `problem`'s answer to a tool call: what MCP's transport answers
/// a message it cannot read or take with (a 4xx), else 200 with the error, the answer
/// to the request.
pub(crate) fn status(problem: &Problem) -> StatusCode {
    match problem.kind() {
        ProblemKind::UnreadableJson
        | ProblemKind::InvalidJsonRpc
        | ProblemKind::DuplicateJsonMember
        | ProblemKind::BodyTooLarge
        | ProblemKind::BodyTimeout
        | ProblemKind::BodyUnreadable
        | ProblemKind::InvalidPath
        | ProblemKind::InvalidHost
        | ProblemKind::InvalidMethodOverride
        | ProblemKind::AmbiguousHeader
        | ProblemKind::MissingTenant
        | ProblemKind::InvalidCredential => problem.status(),
        _ => StatusCode::OK,
    }
}

/// `problem` as a JSON-RPC error response (its `id` `null`).
pub(crate) fn body(problem: &Problem) -> Value {
    let kind = problem.kind();
    let mut data = Map::new();
    data.insert("type".into(), kind.type_uri().into());
    data.insert("code".into(), crate::profile::code(kind).into());
    data.insert("status".into(), problem.status().as_u16().into());
    data.insert("detail".into(), problem.detail().into());
    if let Some(wait) = problem.retry_after {
        let secs = wait.as_millis().div_ceil(1000).max(1);
        data.insert(
            "retry_after".into(),
            u64::try_from(secs).unwrap_or(u64::MAX).into(),
        );
    }
    // The problem's own members (a tombstone's), and where the operation stands.
    data.extend(problem.extension_members());
    error_response(error_code(kind), kind.title(), data)
}

/// `response`, the answer to the call whose request id is `id`: a replay with `id` in
/// place of the recorded one, the layer's own error with `id`; anything else as it is.
pub(crate) async fn stamp<B: ReadBody>(
    response: Response<IdempotencyBody<B>>,
    id: &RequestId,
    limit: usize,
) -> Response<IdempotencyBody<B>> {
    let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
    let own = response.extensions().get::<ProblemKind>().is_some();
    if !(replayed || own) || !response.body().is_buffered() {
        return response;
    }
    let (mut head, body) = response.into_parts();
    let Ok(collected) = body.collect().await else {
        // A buffered body does not fail; were it to, an empty answer is no lie.
        return Response::from_parts(head, IdempotencyBody::buffered(Bytes::new()));
    };
    let trailers = collected.trailers().cloned();
    let bytes = collected.to_bytes();
    let coded = head.headers.contains_key(header::CONTENT_ENCODING);
    let content = match coded {
        true => crate::coding::decoded(&head.headers, &bytes, limit),
        false => None,
    };
    let plain = content.as_deref().unwrap_or(&bytes);
    let event_stream = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
    let rewritten = if event_stream {
        with_id_in_events(plain, id.as_str())
    } else {
        with_id(plain, id.as_str())
    };
    let body = match rewritten {
        Some(body) => {
            head.headers.remove(header::CONTENT_LENGTH);
            if content.is_some() {
                // Sent as its content: the layer keeps no encoder, and identity is
                // always acceptable.
                head.headers.remove(header::CONTENT_ENCODING);
            }
            let len = HeaderValue::from(body.len());
            head.headers.insert(header::CONTENT_LENGTH, len);
            Bytes::from(body)
        }
        None => bytes,
    };
    Response::from_parts(
        head,
        IdempotencyBody::buffered_with_trailers(body, trailers),
    )
}

/// The members of a JSON-RPC response that say it is one.
#[derive(Deserialize)]
struct ResponseMembers<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Where in `text` the `id` of the JSON-RPC response it holds is; `None` when it holds
/// no JSON-RPC response (an upstream's HTTP error page, a request, a batch).
fn id_span(text: &str) -> Option<(usize, usize)> {
    let members: ResponseMembers<'_> = serde_json::from_str(text).ok()?;
    if members.method.is_some() || (members.result.is_none() && members.error.is_none()) {
        return None;
    }
    let id = members.id?.get();
    let start = id.as_ptr() as usize - text.as_ptr() as usize;
    Some((start, start + id.len()))
}

/// `body`, a JSON-RPC response, with `id` in place of its own; `None` when it is none.
pub(crate) fn with_id(body: &[u8], id: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let (start, end) = id_span(text)?;
    let mut out = Vec::with_capacity(body.len() + id.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(&body[end..]);
    Some(out)
}

/// `body`, a `text/event-stream`, with `id` in place of the id of every JSON-RPC
/// response an event's data holds (one `data:` line or several, joined by line feeds
/// as the event stream's readers join them); `None` when it holds none.
pub(crate) fn with_id_in_events(body: &[u8], id: &str) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut spans: Vec<(usize, usize)> = Vec::new();
    // The data lines of the event being read: where each value starts and ends.
    let mut data: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    for line in text.split_inclusive(['\n', '\r']) {
        let start = at;
        at += line.len();
        let content = line.trim_end_matches(['\n', '\r']);
        if content.is_empty() {
            if line == "\n" && text[..start].ends_with('\r') {
                // The `\n` of a `\r\n`: the line ended at the `\r`.
                continue;
            }
            spans.extend(event_id(text, &data));
            data.clear();
        } else if let Some(value) = content.strip_prefix("data") {
            let value = match value.strip_prefix(':') {
                Some(v) => v.strip_prefix(' ').unwrap_or(v),
                None if value.is_empty() => value,
                None => continue,
            };
            let value_start = start + (content.len() - value.len());
            data.push((value_start, value_start + value.len()));
        }
    }
    spans.extend(event_id(text, &data));
    if spans.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + spans.len() * id.len());
    let mut from = 0;
    for (start, end) in spans {
        out.extend_from_slice(&body[from..start]);
        out.extend_from_slice(id.as_bytes());
        from = end;
    }
    out.extend_from_slice(&body[from..]);
    Some(out)
}

/// Where in `text` the id of the JSON-RPC response an event's `data` lines hold is.
fn event_id(text: &str, data: &[(usize, usize)]) -> Option<(usize, usize)> {
    match data {
        [] => None,
        [(start, end)] => id_span(&text[*start..*end]).map(|(s, e)| (start + s, start + e)),
        lines => {
            let joined: Vec<&str> = lines.iter().map(|(s, e)| &text[*s..*e]).collect();
            let joined = joined.join("\n");
            let (s, e) = id_span(&joined)?;
            // A value is one token: within one line.
            let mut offset = 0;
            for (start, end) in lines {
                let len = end - start;
                if s >= offset && e <= offset + len {
                    return Some((start + s - offset, start + e - offset));
                }
                offset += len + 1;
            }
            None
        }
    }
}
