//! MCP tool calls over JSON-RPC 2.0 (SPEC S24): on a route of the `mcp` profile the
//! operation is the call in the body, not the HTTP request. This file reads a call's
//! envelope once its body is in hand: whether its method is keyed, its key (from
//! `params._meta["idempotency-key"]`, a configured pointer or the key header, which
//! must agree), its request `id`, and the document its fingerprint covers (method,
//! tool name, arguments; never the `id` or `_meta`). `mcp/reply.rs` writes the answers.
//!
//! Nothing that could be a keyed call is passed on unkeyed because its envelope could
//! not be read: a body that does not parse, a batch holding a keyed method, a keyed
//! method without a usable `id`, a member named twice are refused.

use std::sync::Arc;

use bytes::Bytes;
use idem_core::Key;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::body_key::key_at;
use crate::problem::{Problem, ProblemKind};

pub mod reply;

/// The JSON-RPC methods a route of the `mcp` profile keys when it names none.
pub const DEFAULT_KEYED_METHODS: [&str; 1] = ["tools/call"];

/// Where MCP clients put the key: the request's `_meta`, as MCP reserves it for such
/// metadata.
pub const META_KEY_POINTER: &str = "/params/_meta/idempotency-key";

/// A request on a route of the `mcp` profile whose body is still to be read.
pub(crate) struct PendingCall {
    /// The key header's key, or what is wrong with it: only a keyed call reads it.
    pub(crate) header_key: Result<Option<Key>, String>,
    /// A further place the key may be (`/params/arguments/idempotency_key`).
    pub(crate) pointer: Option<Arc<str>>,
    /// The JSON-RPC methods that are keyed.
    pub(crate) methods: Arc<[Box<str>]>,
    /// The 400 `missing-key` when the route requires a key.
    pub(crate) missing: Option<Problem>,
    /// The answer a keyed call gets (a tenant it must name and does not).
    pub(crate) refusal: Option<Problem>,
}

/// A JSON-RPC request `id` as its request spelled it (`7`, `7.0`, `"a"`): a replay
/// carries it back byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestId(Arc<str>);

impl RequestId {
    /// The id's JSON text.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// A keyed call, read.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) key: Key,
    pub(crate) id: RequestId,
    /// `{"method": …, "name": …, "arguments": …}`, as sent: what the fingerprint covers.
    pub(crate) document: Bytes,
}

/// What a body on a route of the `mcp` profile is.
#[derive(Debug)]
pub(crate) enum Read {
    /// A keyed call with its key.
    Call(Call),
    /// No keyed call (another method, a notification, a response), or a keyed call
    /// without a key on a route that does not require one: passed on untouched.
    Unkeyed,
    /// Refused, with the request's id where it could be read.
    Refused(Problem, Option<RequestId>),
}

/// A JSON-RPC message's members that matter here. A member named twice is an error
/// (serde's), as is a member of the wrong type.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
}

/// A `tools/call`'s `params`, as far as the fingerprint reads them.
#[derive(Deserialize)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// A member that is present, `null` included (serde reads a `null` `Option` as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl PendingCall {
    /// What the body `content` (its codings undone) is.
    pub(crate) fn read(self, content: &[u8]) -> Read {
        let invalid = |detail: &str, id: Option<RequestId>| {
            let detail = format!("{detail}; nothing was reserved or forwarded");
            Read::Refused(Problem::new(ProblemKind::InvalidJsonRpc, detail), id)
        };
        if idem_core::is_blank(content) {
            return invalid("the body holds no JSON-RPC message", None);
        }
        // Read as the fingerprint reads JSON first, so that what the upstream may read
        // and the layer cannot is refused, whatever the method.
        let meta = match idem_core::value_at_pointer(content, META_KEY_POINTER) {
            Ok(found) => found,
            Err(why) => return Read::Refused(Problem::unreadable_json(&why), None),
        };
        let Ok(text) = std::str::from_utf8(content) else {
            return invalid("the body is not UTF-8", None);
        };
        if text.trim_start().starts_with('[') {
            return self.batch(text);
        }
        let envelope = match serde_json::from_str::<Envelope<'_>>(text) {
            Ok(envelope) => envelope,
            Err(e) => return invalid(&format!("the JSON-RPC envelope cannot be read: {e}"), None),
        };
        let id = envelope.id.map(|raw| RequestId(Arc::from(raw.get())));
        let Some(method) = envelope.method else {
            // A response, or no message at all: no call to key.
            return Read::Unkeyed;
        };
        let Ok(method) = serde_json::from_str::<String>(method.get()) else {
            return invalid("the JSON-RPC method is not a string", id);
        };
        if !self.methods.iter().any(|m| **m == *method) {
            return Read::Unkeyed;
        }
        let Some(id) = id.filter(|id| is_request_id(id.as_str())) else {
            return invalid(
                &format!(
                    "{method} is keyed here, and this message has no request id (a string or \
                     a number; null is none): a notification cannot be answered or replayed"
                ),
                None,
            );
        };
        if let Some(name) = meta.repeated {
            return invalid(&format!("the member {name:?} is named twice"), Some(id));
        }
        // serde reads a struct from an array too: by-position params are no tool call.
        let params = match envelope
            .params
            .map(|p| (p.get(), serde_json::from_str::<Params<'_>>(p.get())))
        {
            None => None,
            Some((raw, Ok(params))) if raw.starts_with('{') => Some(params),
            Some((_, Ok(_))) => return invalid("the params are no object", Some(id)),
            Some((_, Err(e))) => {
                return invalid(&format!("the params cannot be read: {e}"), Some(id));
            }
        };
        let key = match self.key(content, meta.value) {
            Ok(key) => key,
            Err(detail) => {
                let problem = Problem::new(ProblemKind::InvalidKey, detail);
                return Read::Refused(problem, Some(id));
            }
        };
        let key = match (key, self.missing) {
            (Some(key), _) => key,
            (None, Some(missing)) => return Read::Refused(missing, Some(id)),
            (None, None) => return Read::Unkeyed,
        };
        if let Some(refusal) = self.refusal {
            return Read::Refused(refusal, Some(id));
        }
        let raw = |v: Option<&RawValue>| v.map_or("null", RawValue::get).to_owned();
        let (name, arguments) = match &params {
            Some(p) => (raw(p.name), raw(p.arguments)),
            None => ("null".to_owned(), "null".to_owned()),
        };
        let document = format!(
            r#"{{"method":{method},"name":{name},"arguments":{arguments}}}"#,
            method = serde_json::Value::String(method),
        );
        Read::Call(Call {
            key,
            id,
            document: Bytes::from(document),
        })
    }

    /// A batch: refused if it holds a keyed method (a key per call cannot be kept for
    /// a batch's answer), else passed on.
    fn batch(&self, text: &str) -> Read {
        let refused = |detail: String| {
            let detail = format!("{detail}; nothing was reserved or forwarded");
            Read::Refused(Problem::new(ProblemKind::InvalidJsonRpc, detail), None)
        };
        let messages = match serde_json::from_str::<Vec<&RawValue>>(text) {
            Ok(messages) => messages,
            Err(e) => return refused(format!("the JSON-RPC batch cannot be read: {e}")),
        };
        for message in messages {
            if !message.get().starts_with('{') {
                continue;
            }
            let method = match serde_json::from_str::<Envelope<'_>>(message.get()) {
                Ok(Envelope {
                    method: Some(method),
                    ..
                }) => serde_json::from_str::<String>(method.get()).ok(),
                Ok(_) => continue,
                Err(_) => None,
            };
            match method {
                Some(m) if !self.methods.iter().any(|k| **k == *m) => {}
                Some(m) => {
                    return refused(format!(
                        "a JSON-RPC batch holds {m}, which is keyed here; send each keyed \
                         call as a message of its own"
                    ));
                }
                None => {
                    return refused(
                        "a JSON-RPC batch holds a message whose method cannot be read".to_owned(),
                    );
                }
            }
        }
        Read::Unkeyed
    }

    /// The call's key: from `_meta` (`meta`), the route's pointer and the key header,
    /// which must agree; `Ok(None)` when none carries one.
    fn key(&self, content: &[u8], meta: idem_core::PointedValue) -> Result<Option<Key>, String> {
        let mut found: Vec<(String, Key)> = Vec::with_capacity(3);
        if let Some(key) = self.header_key.clone()? {
            found.push(("the key header".to_owned(), key));
        }
        if let Some(key) = key_at(meta, META_KEY_POINTER)? {
            found.push((META_KEY_POINTER.to_owned(), key));
        }
        if let Some(pointer) = &self.pointer {
            let at = idem_core::value_at_pointer(content, pointer).map_err(|e| e.to_string())?;
            if at.repeated_on_pointer {
                return Err(format!("a member on the way to {pointer} is named twice"));
            }
            if let Some(key) = key_at(at.value, pointer)? {
                found.push((pointer.to_string(), key));
            }
        }
        let mut found = found.into_iter();
        let Some((first_at, first)) = found.next() else {
            return Ok(None);
        };
        for (at, key) in found {
            if key != first {
                return Err(format!(
                    "{first_at} and {at} carry different keys, and the upstream may read \
                     either; send one key; nothing was reserved or forwarded"
                ));
            }
        }
        Ok(Some(first))
    }
}

/// Whether `raw` is a JSON-RPC request id: a string or a number (`null`, which
/// JSON-RPC discourages and MCP forbids, is none).
fn is_request_id(raw: &str) -> bool {
    matches!(raw.as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

#[cfg(test)]
mod tests;
