//! What idem reads as JSON, for the fingerprint (SPEC S4) and for a key carried in the
//! body: the limits, why a body is not read, and the value at a pointer.
//!
//! One parser (the canonical form's, `canonical.rs`) reads a body for both, so the key
//! idem finds in a body and the fields its fingerprint covers come from one reading.
//! It reads every body that mainstream parsers read, up to these limits:
//!
//! - **Nesting**: up to [`MAX_JSON_DEPTH`] arrays and objects in one another (Go's
//!   `encoding/json` allows as many; Jackson 1 000, Python about 1 000, serde_json 128).
//!   The parser and everything that walks its tree keep their own stacks, so a body of
//!   a megabyte of `[` is refused at that depth rather than overflowing a thread's stack.
//! - **Numbers**: any number of digits (the body limit bounds them); an exponent of at
//!   most [`MAX_EXPONENT_DIGITS`] significant digits (`1e999999999999`, far past any
//!   double, is read; one more digit is not).
//! - **Strings**: UTF-8, escapes as RFC 8259 has them; a `\u` escape of half a
//!   surrogate pair without its other half (`"\ud800"`, which JavaScript's
//!   `JSON.stringify` writes for a string cut inside an emoji) is refused, since no
//!   Unicode string holds it and parsers disagree on what it becomes.
//! - **Names**: a name repeated within one object is read (and reported: see
//!   [`DuplicateMember`](crate::DuplicateMember)).

use std::borrow::Cow;

use crate::canonical::{Node, parse};

pub(crate) mod unreadable;

pub use unreadable::{MAX_EXPONENT_DIGITS, MAX_JSON_DEPTH, UnreadableJson};

/// Whether `body` holds nothing but JSON's whitespace: no JSON text, and nothing a
/// parser could read a field from. idem reads such a body as naming nothing.
pub fn is_blank(body: &[u8]) -> bool {
    body.iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

/// What a JSON body holds at a pointer, as far as a key needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PointedValue {
    /// Nothing: the pointer names no value in the body.
    Missing,
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool,
    /// A number.
    Number,
    /// A string, unescaped.
    String(String),
    /// An array.
    Array,
    /// An object.
    Object,
}

/// What [`value_at_pointer`] read in a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointerLookup {
    /// The value at the pointer (where an object on its way repeats the name it looks
    /// up, the last member of that name).
    pub value: PointedValue,
    /// A name repeated within one object anywhere in the body, unescaped (the first
    /// found, where several are).
    pub repeated: Option<String>,
    /// Whether an object on the pointer's way repeats the name the pointer looks up in
    /// it, so that parsers may disagree on whether, and which, value the body holds
    /// there.
    pub repeated_on_pointer: bool,
}

/// The value at the JSON pointer `pointer` (RFC 6901, `/a/b/0`) in `body`, read as the
/// fingerprint reads it, within the limits above. An array index is as RFC 6901
/// writes it (digits, no leading zero); a pointer that is not of RFC 6901's form names
/// nothing. A blank body ([`is_blank`]) names nothing; any other body idem does not
/// read is `Err` with why.
///
/// ```
/// use idem_core::{PointedValue, UnreadableJson, value_at_pointer};
/// let found = value_at_pointer(br#"{"meta": {"key": "k-1"}}"#, "/meta/key").unwrap();
/// assert_eq!(found.value, PointedValue::String("k-1".into()));
/// let lone = value_at_pointer(br#"{"key": "k-1", "note": "\ud800"}"#, "/key");
/// assert_eq!(lone, Err(UnreadableJson::LoneSurrogate { at: 24 }));
/// ```
pub fn value_at_pointer(body: &[u8], pointer: &str) -> Result<PointerLookup, UnreadableJson> {
    let mut lookup = PointerLookup {
        value: PointedValue::Missing,
        repeated: None,
        repeated_on_pointer: false,
    };
    if is_blank(body) {
        return Ok(lookup);
    }
    let document = parse(body, &[])?;
    lookup.repeated = document.duplicate.clone().map(Cow::into_owned);
    let Ok(tokens) = parse_pointer(pointer) else {
        return Ok(lookup);
    };
    let mut node = Some(&document.root);
    for token in &tokens {
        node = match node {
            Some(Node::Object(entries)) => {
                let mut named = entries.iter().filter(|(name, _)| name == token);
                let first = named.next();
                let last = named.next_back();
                lookup.repeated_on_pointer |= last.is_some();
                last.or(first).map(|(_, value)| value)
            }
            Some(Node::Array(items)) => {
                let index = token
                    .parse::<usize>()
                    .ok()
                    .filter(|i| *token == i.to_string());
                index.and_then(|i| items.get(i))
            }
            _ => None,
        };
    }
    lookup.value = match node {
        None => PointedValue::Missing,
        Some(Node::Null) => PointedValue::Null,
        Some(Node::Bool(_)) => PointedValue::Bool,
        Some(Node::Number(_)) => PointedValue::Number,
        Some(Node::String(s)) => PointedValue::String(s.clone().into_owned()),
        Some(Node::Array(_)) => PointedValue::Array,
        Some(Node::Object(_)) => PointedValue::Object,
    };
    Ok(lookup)
}

/// A JSON pointer that is not of RFC 6901's form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON pointer {pointer:?}: {reason}")]
pub struct PointerError {
    pointer: String,
    reason: &'static str,
}

/// The reference tokens of `pointer` (RFC 6901), unescaped.
pub(crate) fn parse_pointer(pointer: &str) -> Result<Vec<String>, PointerError> {
    let err = |reason| PointerError {
        pointer: pointer.to_owned(),
        reason,
    };
    if pointer.is_empty() {
        return Err(err(
            "the empty pointer names the whole body; it cannot be ignored",
        ));
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(err("a pointer starts with '/'"));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(err("'~' must be followed by '0' or '1'")),
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}
