//! A key carried in the request's JSON body ([`RouteConfig::key_pointer`]), for clients
//! that send it there rather than in a header.
//!
//! [`RouteConfig::key_pointer`]: crate::RouteConfig::key_pointer

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, header};
use idem_core::Key;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

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

/// The key at `pointer` in a JSON body, and a member name the body repeats within one
/// object, found in one pass over it (no tree is built: only the value at `pointer`
/// is kept). A body that is no JSON names no key and repeats nothing.
pub(crate) fn key_in_body(headers: &HeaderMap, body: &[u8], pointer: &str) -> BodyKey {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(idem_core::is_json_content_type);
    if !json {
        return BodyKey::default();
    }
    // The pointer was checked when the route was configured (RFC 6901: `/a/b`).
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let repeated = RefCell::new(None);
    let seek = Seek {
        path: Some(&tokens),
        repeated: &repeated,
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let Ok(found) = seek
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found))
    else {
        return BodyKey::default();
    };
    let key = match found {
        None | Some(Found::Null) => Ok(None),
        Some(Found::String(s)) => Key::new(s)
            .map(Some)
            .map_err(|e| format!("the key at {pointer} in the body: {e}")),
        Some(other) => Err(format!(
            "the key at {pointer} in the body is no string but {}; send the key as a \
             string",
            match other {
                Found::Bool => "a boolean",
                Found::Number => "a number",
                Found::Array => "an array",
                _ => "an object",
            }
        )),
    };
    BodyKey {
        key,
        repeated: repeated.into_inner(),
    }
}

/// The value at the pointer, as far as the key needs it.
#[derive(Debug)]
enum Found {
    Null,
    Bool,
    Number,
    String(String),
    Array,
    Object,
}

/// Reads one JSON value: `path` is what is left of the pointer when the value lies on
/// it (empty: the value is the one the pointer names), `None` when it does not.
#[derive(Clone, Copy)]
struct Seek<'s> {
    path: Option<&'s [String]>,
    repeated: &'s RefCell<Option<Repeated>>,
}

impl Seek<'_> {
    fn is_target(&self) -> bool {
        self.path.is_some_and(<[String]>::is_empty)
    }

    /// The reading of a value inside this one, under the name or index `token`.
    fn child(&self, matches: impl FnOnce(&str) -> bool) -> Self {
        let path = match self.path {
            Some([first, rest @ ..]) if matches(first) => Some(rest),
            _ => None,
        };
        Seek { path, ..*self }
    }

    fn found(&self, found: Found) -> Option<Found> {
        self.is_target().then_some(found)
    }
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = Option<Found>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = Option<Found>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(self.found(Found::Null))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(self.found(Found::Bool))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(self.found(Found::Number))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(self.found(Found::Number))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(self.found(Found::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(self.found(Found::String(s.to_owned())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut i = 0usize;
        // An index as serde_json's pointers read one: digits, no sign, no leading 0.
        let at = |i: usize| move |t: &str| t == i.to_string();
        while let Some(item) = seq.next_element_seed(self.child(at(i)))? {
            found = found.or(item);
            i += 1;
        }
        Ok(self.found(Found::Array).or(found))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut names: Vec<Cow<'de, str>> = Vec::new();
        while let Some(name) = map.next_key_seed(Name)? {
            let child = self.child(|t| t == name);
            if let Some(value) = map.next_value_seed(child)? {
                found = Some(value);
            }
            names.push(name);
        }
        // Sorted, a repeated name sits beside itself: one comparison per member.
        names.sort_unstable();
        let mut repeated = self.repeated.borrow_mut();
        for pair in names.windows(2).filter(|w| w[0] == w[1]) {
            let on_pointer = matches!(self.path, Some([first, ..]) if *first == pair[0]);
            match &mut *repeated {
                None => {
                    *repeated = Some(Repeated {
                        name: pair[0].clone().into_owned(),
                        on_pointer,
                    })
                }
                Some(r) => r.on_pointer |= on_pointer,
            }
        }
        Ok(self.found(Found::Object).or(found))
    }
}

/// A member name, borrowed from the body unless it has escapes.
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_owned()))
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
        let BodyKey { key, repeated } = key_in_body(headers, body, pointer);
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
        super::key_in_body(h, body, pointer).key
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
        let in_array = br#"{"a": [{"k": "k-0"}, {"k": "k-1"}], "b/c~": "k-3"}"#;
        let key = key_in_body(&json, in_array, "/a/1/k").unwrap().unwrap();
        assert_eq!(key.as_str(), "k-1");
        let key = key_in_body(&json, in_array, "/b~1c~0").unwrap().unwrap();
        assert_eq!(key.as_str(), "k-3");
        assert_eq!(key_in_body(&json, in_array, "/a/01/k").unwrap(), None);
        assert_eq!(key_in_body(&json, b"{} {}", "/a").unwrap(), None);
    }

    #[test]
    fn a_repeated_member_is_found_in_the_same_pass_and_said_whether_on_the_pointer() {
        let json = headers("application/json");
        let read = |body: &str| super::key_in_body(&json, body.as_bytes(), "/meta/key");
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
