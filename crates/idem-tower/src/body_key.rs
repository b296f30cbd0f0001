//! A key carried in the request's JSON body ([`RouteConfig::key_pointer`]), for clients
//! that send it there rather than in a header.
//!
//! [`RouteConfig::key_pointer`]: crate::RouteConfig::key_pointer

use bytes::Bytes;
use http::{HeaderMap, header};
use idem_core::Key;

use crate::drain::drain_body;
use crate::plan::PendingKey;
use crate::problem::{Problem, ProblemKind};

/// The key at `pointer` in a JSON body (`Ok(None)`: the body is no JSON, or names no
/// key there); a value there that is no valid key is `Err` with what is wrong.
pub(crate) fn key_in_body(
    headers: &HeaderMap,
    body: &[u8],
    pointer: &str,
) -> Result<Option<Key>, String> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(idem_core::is_json_content_type);
    if !json {
        return Ok(None);
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Ok(None);
    };
    match value.pointer(pointer) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Key::new(s.as_str())
            .map(Some)
            .map_err(|e| format!("the key at {pointer} in the body: {e}")),
        Some(other) => Err(format!(
            "the key at {pointer} in the body is no string but {}; send the key as a \
             string",
            match other {
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::Array(_) => "an array",
                _ => "an object",
            }
        )),
    }
}

/// What a request on a route whose key may be in its body is, once its body is read.
pub(crate) enum Resolved {
    /// Keyed, by this key.
    Key(Key),
    /// Answered with this problem: no key where the route requires one, a key that is
    /// no valid key or contradicts the header's, or a refusal the key brings on (a
    /// tenant it must name).
    Refused(Problem),
    /// No key anywhere, on a route that does not require one: passed through.
    Unkeyed,
}

impl PendingKey {
    /// What the request whose `headers` and read `body` these are is.
    pub(crate) fn resolve(self, headers: &HeaderMap, body: &[u8]) -> Resolved {
        let pointer = &*self.pointer;
        let found = match (self.header_key, key_in_body(headers, body, pointer)) {
            (Some(header), Ok(Some(body))) if header != body => Err(format!(
                "the key header and the body's {pointer} carry different keys, and the \
                 upstream may read either; send one key; nothing was reserved or forwarded"
            )),
            (Some(header), Ok(_)) => Ok(Some(header)),
            (None, found) => found,
            (Some(_), Err(detail)) => Err(detail),
        };
        match found {
            Ok(Some(_)) if let Some(refusal) = self.refusal => Resolved::Refused(refusal),
            Ok(Some(key)) => Resolved::Key(key),
            Ok(None) => match self.missing {
                Some(missing) => Resolved::Refused(missing),
                None => Resolved::Unkeyed,
            },
            Err(detail) => Resolved::Refused(Problem::new(ProblemKind::InvalidKey, detail)),
        }
    }
}

/// A keyed request's body: still to be read, or read already to find its key.
pub(crate) enum Incoming<B> {
    /// Not read yet.
    Stream(B),
    /// Read whole.
    Read(Bytes),
}

impl<B> Incoming<B>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    /// Reads away what is left of the body, for an answer given before it was read.
    pub(crate) fn drain(self, headers: &HeaderMap) {
        if let Incoming::Stream(body) = self {
            drain_body(headers, body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        h
    }

    #[test]
    fn the_key_is_read_at_its_pointer_in_json_bodies_only() {
        let json = headers("application/json; charset=utf-8");
        let body = br#"{"idempotency_key": "k-1", "amount": 5}"#;
        let key = key_in_body(&json, body, "/idempotency_key")
            .unwrap()
            .unwrap();
        assert_eq!(key.as_str(), "k-1");
        assert_eq!(key_in_body(&json, body, "/other").unwrap(), None);
        assert_eq!(
            key_in_body(&json, b"not json", "/idempotency_key").unwrap(),
            None
        );
        let form = headers("application/x-www-form-urlencoded");
        assert_eq!(key_in_body(&form, body, "/idempotency_key").unwrap(), None);
        let nested = br#"{"meta": {"key": "k-2"}}"#;
        let key = key_in_body(&headers("application/vnd.api+json"), nested, "/meta/key");
        assert_eq!(key.unwrap().unwrap().as_str(), "k-2");
        let null = br#"{"idempotency_key": null}"#;
        assert_eq!(key_in_body(&json, null, "/idempotency_key").unwrap(), None);
    }

    #[test]
    fn a_key_that_is_no_string_or_no_valid_key_is_an_error() {
        let json = headers("application/json");
        let e = key_in_body(&json, br#"{"k": 5}"#, "/k").unwrap_err();
        assert!(e.contains("a number"), "{e}");
        let long = format!(r#"{{"k": "{}"}}"#, "x".repeat(300));
        let e = key_in_body(&json, long.as_bytes(), "/k").unwrap_err();
        assert!(e.contains("/k"), "{e}");
    }
}
