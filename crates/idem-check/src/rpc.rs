//! JSON-RPC as `--profile mcp` needs it: every request gets a fresh `id` (MCP forbids
//! reusing one within a session), and an answer, JSON or an event stream, is read for
//! the response it carries.
//!
//! The `id` is rewritten in place: only the bytes of the top-level `id` member's value
//! change, so a body written in other bytes on purpose (the equivalent-body probe) stays
//! as it was written.

use serde::de::IgnoredAny;
use serde_json::Value;

use super::client::Answer;

/// `body` with the value of every top-level `id` member replaced by `id`, the rest byte
/// for byte as it was; `None` when `body` is no JSON object or has no `id` member (a
/// notification, which is sent as it is).
pub fn with_id(body: &[u8], id: u64) -> Option<Vec<u8>> {
    let mut spans = Vec::new();
    let mut i = skip_ws(body, 0);
    if body.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(body, i + 1);
    if body.get(i) == Some(&b'}') {
        return None;
    }
    loop {
        let (key, end) = next::<String>(body, i)?;
        i = skip_ws(body, end);
        if body.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(body, i + 1);
        let (_, end) = next::<IgnoredAny>(body, start)?;
        if key == "id" {
            spans.push((start, end));
        }
        i = skip_ws(body, end);
        match body.get(i) {
            Some(b',') => i = skip_ws(body, i + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    if spans.is_empty() {
        return None;
    }
    let id = id.to_string();
    let mut out = Vec::with_capacity(body.len() + id.len());
    let mut from = 0;
    for (start, end) in spans {
        out.extend_from_slice(&body[from..start]);
        out.extend_from_slice(id.as_bytes());
        from = end;
    }
    out.extend_from_slice(&body[from..]);
    Some(out)
}

fn skip_ws(body: &[u8], mut i: usize) -> usize {
    while body.get(i).is_some_and(|b| b" \t\r\n".contains(b)) {
        i += 1;
    }
    i
}

/// The JSON value that starts at `at`, and where it ends.
fn next<T: serde::de::DeserializeOwned>(body: &[u8], at: usize) -> Option<(T, usize)> {
    let mut values = serde_json::Deserializer::from_slice(body.get(at..)?).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, at + values.byte_offset()))
}

/// How the answer was framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One JSON body.
    Json,
    /// `text/event-stream`, the messages in `data:` lines.
    EventStream,
}

impl Framing {
    /// `a JSON answer` or `an event-stream answer`.
    pub fn shown(self) -> &'static str {
        match self {
            Framing::Json => "a JSON answer",
            Framing::EventStream => "an event-stream answer",
        }
    }
}

/// How `a` is framed.
pub fn framing(a: &Answer) -> Framing {
    let event_stream = a.header("content-type").is_some_and(|ct| {
        ct.trim()
            .to_ascii_lowercase()
            .starts_with("text/event-stream")
    });
    if event_stream {
        Framing::EventStream
    } else {
        Framing::Json
    }
}

/// The JSON-RPC messages of `a`: its JSON body, or each event's `data:` lines joined
/// (the event-stream format), each parsed.
pub fn messages(a: &Answer) -> Vec<Value> {
    match framing(a) {
        Framing::Json => a.json().into_iter().collect(),
        Framing::EventStream => {
            let text = String::from_utf8_lossy(&a.body);
            let mut out = Vec::new();
            let mut data: Vec<&str> = Vec::new();
            let lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
            for line in lines.chain([""]) {
                if line.is_empty() {
                    if !data.is_empty()
                        && let Ok(v) = serde_json::from_str(&data.join("\n"))
                    {
                        out.push(v);
                    }
                    data.clear();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            out
        }
    }
}

/// The JSON-RPC response `a` carries: the last message with a `result` or an `error`
/// and no `method` (an event stream may carry notifications before it).
pub fn response(a: &Answer) -> Option<Value> {
    messages(a).into_iter().rev().find(|m| {
        m.get("method").is_none() && (m.get("result").is_some() || m.get("error").is_some())
    })
}

/// The `id` the response of `a` answers, if it carries a response.
pub fn answered_id(a: &Answer) -> Option<Value> {
    response(a)?.get("id").cloned()
}

/// What tells one execution's answer from another's under JSON-RPC: the response with
/// its `id` left out (a replay carries the retry's own), else the body's bytes.
pub fn identity(a: &Answer) -> String {
    match response(a) {
        Some(Value::Object(mut m)) => {
            m.remove("id");
            Value::Object(m).to_string()
        }
        _ => String::from_utf8_lossy(&a.body).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn answer(content_type: &str, body: &str) -> Answer {
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", content_type.parse().unwrap());
        Answer {
            status: 200,
            headers,
            body: bytes::Bytes::from(body.to_owned()),
            received: Instant::now(),
            request_id: None,
        }
    }

    #[test]
    fn the_id_is_rewritten_in_place_and_nothing_else_moves() {
        let body = br#"{ "jsonrpc" : "2.0",
  "id" : "first", "method":"tools/call","params":{"id":1,"arguments":{"id":"x"}} }"#;
        let out = with_id(body, 7).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{ "jsonrpc" : "2.0",
  "id" : 7, "method":"tools/call","params":{"id":1,"arguments":{"id":"x"}} }"#
        );
        assert_eq!(
            with_id(br#"{"params":{"a":[1,{"id":2}]},"id":1}"#, 12).unwrap(),
            br#"{"params":{"a":[1,{"id":2}]},"id":12}"#
        );
        // A key spelt with an escape is still `id`.
        assert_eq!(
            with_id(br#"{"\u0069d":1}"#, 3).unwrap(),
            br#"{"\u0069d":3}"#
        );
    }

    #[test]
    fn bodies_without_a_top_level_id_are_left_alone() {
        for body in [
            &br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#[..],
            br#"[{"jsonrpc":"2.0","id":1}]"#,
            b"{}",
            b"a=1&id=2",
            br#"{"id":1"#,
            br#"{"id" 1}"#,
            b"",
        ] {
            assert_eq!(with_id(body, 1), None, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn an_event_streams_response_is_found_past_its_notifications() {
        let a = answer(
            "text/event-stream",
            "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"id\":1}}\r\n\r\n\
             : a comment\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":2,\"result\":{\"ok\":true}}\n\n",
        );
        assert_eq!(framing(&a), Framing::EventStream);
        assert_eq!(messages(&a).len(), 2);
        assert_eq!(answered_id(&a), Some(Value::from(2)));
        assert_eq!(identity(&a), r#"{"jsonrpc":"2.0","result":{"ok":true}}"#);
        let json = answer(
            "application/json",
            r#"{"jsonrpc":"2.0","id":"a","result":{"ok":true}}"#,
        );
        assert_eq!(framing(&json), Framing::Json);
        assert_eq!(answered_id(&json), Some(Value::from("a")));
        assert_eq!(
            identity(&json),
            identity(&a),
            "the same response, ids aside"
        );
        let plain = answer("application/json", r#"{"ok":true}"#);
        assert_eq!(answered_id(&plain), None);
        assert_eq!(identity(&plain), r#"{"ok":true}"#);
    }
}
