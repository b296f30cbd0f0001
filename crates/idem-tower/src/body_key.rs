//! A key carried in the request's JSON body ([`RouteConfig::key_pointer`]), for clients
//! that send it there rather than in a header.
//!
//! [`RouteConfig::key_pointer`]: crate::RouteConfig::key_pointer

use bytes::Bytes;
use http::{HeaderMap, header};
use idem_core::{Key, PointedValue, UnreadableJson};

use crate::drain::drain_body;
use crate::plan::PendingKey;
use crate::problem::{Problem, ProblemKind};

/// What a JSON body says about its key: the key at the pointer, and a member name it
/// repeats within one object, if it does.
#[derive(Debug)]
pub(crate) struct BodyKey {
    /// The key at the pointer (`Ok(None)`: the body is no JSON, or names no key
    /// there); a value there that is no valid key is `Err` with what is wrong.
    pub(crate) key: Result<Option<Key>, String>,
    /// A name repeated within one object, anywhere in the body.
    pub(crate) repeated: Option<Repeated>,
}

/// A member name a body repeats within one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repeated {
    /// The name, unescaped (the first found, where several repeat).
    pub(crate) name: String,
    /// Whether some name the pointer passes through repeats where the pointer looks
    /// it up, so that parsers may disagree on whether, and which, key the body names.
    pub(crate) on_pointer: bool,
}

impl Default for BodyKey {
    fn default() -> BodyKey {
        BodyKey {
            key: Ok(None),
            repeated: None,
        }
    }
}

/// The key at `pointer` in a body (its content, once its codings are undone), and a
/// member name the body repeats within one object, read as the fingerprint reads JSON
/// ([`idem_core::value_at_pointer`]). A blank body names no key and repeats nothing. A
/// body of a JSON media type that the layer cannot read is `Err` with why: the
/// upstream's parser might read a key in it.
///
/// A body of another media type (or none) is read too, since some upstreams parse a
/// body as JSON whatever its type (Go's `encoding/json` on the request body): one that
/// is JSON names its key as a JSON one does, and only a name repeated on the pointer's
/// way counts; one that is not names no key.
pub(crate) fn key_in_body(
    headers: &HeaderMap,
    body: &[u8],
    pointer: &str,
) -> Result<BodyKey, UnreadableJson> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(idem_core::is_json_content_type);
    let found = match idem_core::value_at_pointer(body, pointer) {
        Ok(found) => found,
        Err(why) if json => return Err(why),
        Err(_) => return Ok(BodyKey::default()),
    };
    let key = key_at(found.value, pointer);
    let repeated = found
        .repeated
        .map(|name| Repeated {
            name,
            on_pointer: found.repeated_on_pointer,
        })
        // Outside the key's way, such a body's members are not the layer's business:
        // it is fingerprinted as its bytes.
        .filter(|r| json || r.on_pointer);
    Ok(BodyKey { key, repeated })
}

/// The key `value` (found at `pointer` in a body) names: none for a missing or `null`
/// value, `Err` with what is wrong for one that is no string or no valid key.
pub(crate) fn key_at(value: PointedValue, pointer: &str) -> Result<Option<Key>, String> {
    match value {
        PointedValue::Missing | PointedValue::Null => Ok(None),
        PointedValue::String(s) => Key::new(s)
            .map(Some)
            .map_err(|e| format!("the key at {pointer} in the body: {e}")),
        other => Err(format!(
            "the key at {pointer} in the body is no string but {}; send the key as a \
             string",
            match other {
                PointedValue::Bool => "a boolean",
                PointedValue::Number => "a number",
                PointedValue::Array => "an array",
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
    /// no valid key or contradicts the header's, a JSON body the layer cannot read, or
    /// a refusal the key brings on (a tenant it must name).
    Refused(Problem),
    /// No key anywhere, on a route that does not require one: passed through.
    Unkeyed,
}

impl PendingKey {
    /// What the request whose `headers` and read `body` (its content, codings undone)
    /// these are is.
    pub(crate) fn resolve(self, headers: &HeaderMap, body: &[u8]) -> Resolved {
        let pointer = &*self.pointer;
        let BodyKey { key, repeated } = match key_in_body(headers, body, pointer) {
            Ok(found) => found,
            // Whatever else the request carries: the upstream may read a key in it.
            Err(why) => return Resolved::Refused(Problem::unreadable_json(&why)),
        };
        // A body that repeats a member is refused when it is keyed under some reading
        // of it: by its header, by the key one reading finds, or where the pointer
        // passes through a repeated name (another parser may find another key, or
        // one where this one found none). The rest is unkeyed and passes.
        if let Some(repeated) = repeated
            && (self.header_key.is_some() || repeated.on_pointer || !matches!(key, Ok(None)))
        {
            return Resolved::Refused(crate::problem::Problem::duplicate_member(&repeated.name));
        }
        let found = match (self.header_key, key) {
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

    fn key_in_body(h: &HeaderMap, body: &[u8], pointer: &str) -> Result<Option<Key>, String> {
        super::key_in_body(h, body, pointer).unwrap().key
    }

    #[test]
    fn the_key_is_read_at_its_pointer() {
        let json = headers("application/json; charset=utf-8");
        let body = br#"{"idempotency_key": "k-1", "amount": 5}"#;
        let key = key_in_body(&json, body, "/idempotency_key")
            .unwrap()
            .unwrap();
        assert_eq!(key.as_str(), "k-1");
        assert_eq!(key_in_body(&json, body, "/other").unwrap(), None);
        assert_eq!(key_in_body(&json, b"", "/idempotency_key").unwrap(), None);
        assert_eq!(
            key_in_body(&json, b" \r\n", "/idempotency_key").unwrap(),
            None
        );
        let form = headers("application/x-www-form-urlencoded");
        assert_eq!(
            key_in_body(&form, b"idempotency_key=k-1", "/idempotency_key").unwrap(),
            None
        );
        let nested = br#"{"meta": {"key": "k-2"}}"#;
        let key = key_in_body(&headers("application/vnd.api+json"), nested, "/meta/key");
        assert_eq!(key.unwrap().unwrap().as_str(), "k-2");
        let null = br#"{"idempotency_key": null}"#;
        assert_eq!(key_in_body(&json, null, "/idempotency_key").unwrap(), None);
        let in_array = br#"{"a": [{"k": "k-0"}, {"k": "k-1"}], "b/c~": "k-3"}"#;
        let key = key_in_body(&json, in_array, "/a/1/k").unwrap().unwrap();
        assert_eq!(key.as_str(), "k-1");
        let key = key_in_body(&json, in_array, "/b~1c~0").unwrap().unwrap();
        assert_eq!(key.as_str(), "k-3");
        assert_eq!(key_in_body(&json, in_array, "/a/01/k").unwrap(), None);
        let form = headers("text/plain");
        assert_eq!(key_in_body(&form, b"not json", "/a").unwrap(), None);
    }

    /// An upstream that parses a body as JSON whatever its `Content-Type` reads the key
    /// in a `text/plain` body: so does the layer, rather than pass it on unkeyed.
    #[test]
    fn a_key_in_json_sent_under_another_media_type_is_read() {
        let body = br#"{"idempotency_key": "k-1", "a": 1, "a": 2}"#;
        for content_type in ["text/plain", "application/octet-stream"] {
            let found = super::key_in_body(&headers(content_type), body, "/idempotency_key");
            let found = found.unwrap();
            assert_eq!(found.key.unwrap().unwrap().as_str(), "k-1");
            assert_eq!(found.repeated, None, "off the key's way: not looked at");
        }
        let found = super::key_in_body(&HeaderMap::new(), body, "/idempotency_key");
        assert_eq!(found.unwrap().key.unwrap().unwrap().as_str(), "k-1");
        let twice = br#"{"idempotency_key": "KA", "idempotency_key": "KB"}"#;
        let found = super::key_in_body(&headers("text/plain"), twice, "/idempotency_key");
        assert!(found.unwrap().repeated.unwrap().on_pointer);
        // What is no JSON under another type is no body with a key, whatever its bytes.
        let found = super::key_in_body(&headers("text/plain"), br#"{"k": "\ud800"}"#, "/k");
        assert_eq!(found.unwrap().key, Ok(None));
    }

    /// Issue 61: a body that serde_json refused was read as naming no key, and passed
    /// on unkeyed to an upstream whose parser read the key in it, on every retry.
    #[test]
    fn a_json_body_the_layer_cannot_read_is_an_error_not_a_body_without_a_key() {
        let json = headers("application/json");
        let why = |body: &[u8]| super::key_in_body(&json, body, "/k").unwrap_err();
        assert_eq!(why(b"not json"), UnreadableJson::Syntax { at: 0 });
        assert_eq!(why(b"{} {}"), UnreadableJson::Syntax { at: 3 });
        assert_eq!(
            why(br#"{"k": "K1", "note": "\ud800"}"#),
            UnreadableJson::LoneSurrogate { at: 21 }
        );
        assert_eq!(
            why(b"{\"k\": \"K1\", \"note\": \"caf\xe9\"}"),
            UnreadableJson::InvalidUtf8 { at: 24 }
        );
        let deep = |levels: usize| {
            let mut body = br#"{"k": "K1", "deep": "#.to_vec();
            body.extend(std::iter::repeat_n(b'[', levels));
            body.extend(std::iter::repeat_n(b']', levels));
            body.push(b'}');
            body
        };
        let max = idem_core::MAX_JSON_DEPTH;
        assert_eq!(
            why(&deep(max)),
            UnreadableJson::TooDeep { at: 20 + max - 1 }
        );
        // Past serde_json's 128 levels, up to Go's 10000: read, and keyed.
        for levels in [200, max - 1] {
            let key = key_in_body(&json, &deep(levels), "/k").unwrap().unwrap();
            assert_eq!(key.as_str(), "K1");
        }
        // Numbers past a double's range are read (the default form keeps them exactly).
        let key = key_in_body(&json, br#"{"k": "K1", "n": 1e400}"#, "/k");
        assert_eq!(key.unwrap().unwrap().as_str(), "K1");
    }

    #[test]
    fn an_unreadable_body_is_refused_whatever_else_the_request_carries() {
        let json = headers("application/json");
        let pending = |header_key: Option<&str>| PendingKey {
            header_key: header_key.map(|k| Key::new(k).unwrap()),
            pointer: "/k".into(),
            missing: None,
            refusal: None,
        };
        for header_key in [None, Some("K1")] {
            let body = br#"{"k": "K1", "note": "\udc00"}"#;
            let Resolved::Refused(problem) = pending(header_key).resolve(&json, body) else {
                panic!("refused");
            };
            assert_eq!(problem.kind(), ProblemKind::UnreadableJson);
            assert_eq!(
                problem.detail(),
                "the JSON body cannot be read: the escape at byte 21 is half of a \
                 surrogate pair without its other half; this route reads its key or its \
                 fingerprint from the body, so a body idem cannot read is refused rather \
                 than passed on unkeyed; nothing was reserved or forwarded"
            );
        }
        // A blank body names no key: unkeyed, as before.
        assert!(matches!(
            pending(None).resolve(&json, b""),
            Resolved::Unkeyed
        ));
    }

    #[test]
    fn a_repeated_member_is_found_in_the_same_pass_and_said_whether_on_the_pointer() {
        let json = headers("application/json");
        let read = |body: &str| super::key_in_body(&json, body.as_bytes(), "/meta/key").unwrap();
        let repeated = |name: &str, on_pointer| {
            Some(Repeated {
                name: name.to_owned(),
                on_pointer,
            })
        };
        let r = read(r#"{"meta": {"key": "KA", "key": "KB"}}"#);
        assert_eq!(r.repeated, repeated("key", true));
        let r = read(r#"{"meta": {"key": "KA"}, "meta": {}}"#);
        assert_eq!(r.repeated, repeated("meta", true));
        let r = read(r#"{"meta": {"key": "KA"}, "amount": 1, "\u0061mount": 2}"#);
        assert_eq!(r.repeated, repeated("amount", false));
        assert_eq!(r.key.unwrap().unwrap().as_str(), "KA");
        let r = read(r#"{"x": [{"key": 1, "key": 2}]}"#);
        assert_eq!(r.repeated, repeated("key", false));
        assert_eq!(r.key, Ok(None));
        let r = read(r#"{"meta": {"key": "KA"}, "x": {"meta": 1}, "meta2": 2}"#);
        assert_eq!(r.repeated, None);
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
