//! [`ResponseMeta`]: what a record keeps about its answer besides the answer's own
//! status, headers and body.
//!
//! In memory every field is typed. A store maps them at its boundary: the ambiguity
//! reason goes to a column (SQLite, PostgreSQL) or a field of the record head (Redis) so
//! that a listing of ambiguous records ([`Store::list`](crate::Store::list)) finds them
//! by an index; the rest travels in the header block beside the headers
//! ([`codec::encode_response_headers`](crate::codec::encode_response_headers)), under
//! names no HTTP field can have, the form every record written before this type was
//! introduced also has, so that such records read back into the same fields.

use bytes::Bytes;

use crate::{Ambiguity, FencingToken, StoredResponse};

/// What a record keeps about its answer besides its status, headers and body: each a
/// typed field, never an HTTP header, so that no replay sends one and no reader has to
/// filter them out.
///
/// Built through [`StoredResponse`]'s `with_*` methods or field by field from
/// [`Default`]; read through its accessors or the fields.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ResponseMeta {
    /// A path on the same service (`/v1/reports/42`) that the answer's body is rendered
    /// from at replay time, instead of the body itself (SPEC S6, for large answers).
    pub reference: Option<String>,
    /// Why the answer's outcome is ambiguous, if it is: the request ran (or may have),
    /// and what it did is not known from the answer alone.
    pub ambiguity: Option<Ambiguity>,
    /// Trailer fields of the answer (a gRPC call's `grpc-status`, say), names in lower
    /// case, in their original order, sent as trailers again at replay (SPEC S18).
    pub trailers: Vec<(String, Bytes)>,
    /// The W3C trace context (`00-<trace id>-<span id>-<flags>`) of the execution that
    /// produced the answer, so that a replay's trace can link to it.
    pub trace_parent: Option<String>,
    /// The id of the record key this answer is sealed with (SPEC S17): `Some` while the
    /// answer is sealed, when its body is the ciphertext of its headers, body and every
    /// other field here but the ambiguity. An opened answer has none.
    pub sealed_by: Option<String>,
    /// On a replay of a sealed answer: the token of the attempt whose record holds it,
    /// as [`decide`](crate::decide) read it from the record, since the answer is bound to
    /// it. Never stored: a store's own copy would not be trusted.
    pub(crate) sealing_attempt: Option<FencingToken>,
}

impl ResponseMeta {
    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == ResponseMeta::default()
    }
}

impl StoredResponse {
    /// Records `reference`, a path on the same service (`/v1/reports/42`), as where
    /// this answer's body is to be rendered from at replay time, instead of the body
    /// itself (SPEC S6, for large answers): [`ResponseMeta::reference`].
    pub fn with_reference(mut self, reference: &str) -> StoredResponse {
        self.meta.reference = Some(reference.to_owned());
        self
    }

    /// The reference this answer's body is to be rendered from, if it was recorded as
    /// one ([`with_reference`](Self::with_reference)).
    pub fn reference(&self) -> Option<&str> {
        self.meta.reference.as_deref()
    }

    /// Records `traceparent`, the W3C trace context of the execution that produced this
    /// answer (`00-<trace id>-<span id>-<flags>`), so that a replay's trace can link to
    /// it: [`ResponseMeta::trace_parent`].
    pub fn with_trace_parent(mut self, traceparent: &str) -> StoredResponse {
        self.meta.trace_parent = Some(traceparent.to_owned());
        self
    }

    /// The trace context recorded with [`with_trace_parent`](Self::with_trace_parent);
    /// `None` for an answer recorded without one.
    pub fn trace_parent(&self) -> Option<&str> {
        self.meta.trace_parent.as_deref()
    }

    /// Records a trailer field of the answer (a gRPC call's `grpc-status`, say), to be
    /// sent as a trailer again at replay: [`ResponseMeta::trailers`]. The name is kept
    /// in lower case.
    pub fn with_trailer(mut self, name: &str, value: impl Into<Bytes>) -> StoredResponse {
        self.meta
            .trailers
            .push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// The trailers recorded with [`with_trailer`](Self::with_trailer): names and
    /// values, in their original order.
    pub fn trailers(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.meta
            .trailers
            .iter()
            .map(|(name, value)| (name.as_str(), value))
    }

    /// Marks this answer as one whose outcome is ambiguous, for `reason`:
    /// [`ResponseMeta::ambiguity`]. A listing of ambiguous records finds it
    /// ([`ListQuery::ambiguous`](crate::ListQuery::ambiguous)).
    pub fn with_ambiguity(mut self, reason: Ambiguity) -> StoredResponse {
        self.meta.ambiguity = Some(reason);
        self
    }

    /// The reason recorded with [`with_ambiguity`](Self::with_ambiguity); `None` for an
    /// answer recorded without one (or, read from a store, with a reason this build
    /// does not know).
    pub fn ambiguity(&self) -> Option<Ambiguity> {
        self.meta.ambiguity
    }

    /// The id of the record key this answer is sealed with, while it is sealed
    /// ([`ResponseMeta::sealed_by`]).
    pub fn sealed_by(&self) -> Option<&str> {
        self.meta.sealed_by.as_deref()
    }

    /// The answer's HTTP headers: [`headers`](Self::headers) itself, since everything
    /// else a record keeps about its answer is in [`meta`](Self::meta).
    pub fn http_headers(&self) -> impl Iterator<Item = &(String, Bytes)> {
        self.headers.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_kept_apart_from_the_http_headers() {
        let stored = StoredResponse::new(201, "ok")
            .with_header("Location", "/v1/things/1")
            .with_reference("/v1/things/1")
            .with_trace_parent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .with_trailer("Grpc-Status", "0")
            .with_ambiguity(Ambiguity::AnswerTooLarge);
        assert_eq!(stored.reference(), Some("/v1/things/1"));
        assert_eq!(
            stored.trace_parent(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        assert_eq!(
            stored.trailers().collect::<Vec<_>>(),
            [("grpc-status", &Bytes::from_static(b"0"))]
        );
        assert_eq!(stored.ambiguity(), Some(Ambiguity::AnswerTooLarge));
        let http: Vec<&str> = stored.http_headers().map(|(n, _)| n.as_str()).collect();
        assert_eq!(http, ["location"]);
        let plain = StoredResponse::new(200, "");
        assert_eq!(plain.trace_parent(), None);
        assert_eq!(plain.ambiguity(), None);
        assert!(plain.meta.is_empty());
    }
}
