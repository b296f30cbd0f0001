//! Entry points for idem's fuzz targets (`fuzz/` in the repository): how the layer
//! undoes a body's content codings and fingerprints a request.
//!
//! Not part of the supported API: compiled only with the `fuzzing` feature, hidden from
//! the docs, and free to change in any release.

use http::HeaderMap;
use http::request::Parts;
use idem_core::{Fingerprint, FingerprintOptions, RefusedJson};

/// The content of `body` with the codings its `Content-Encoding` fields name undone, at
/// most `limit` bytes of it; `None` when the layer fingerprints the body as sent.
pub fn decoded(headers: &HeaderMap, body: &[u8], limit: usize) -> Option<Vec<u8>> {
    crate::coding::decoded(headers, body, limit)
}

/// The fingerprint the layer takes of a request with head `parts` and (buffered) `body`,
/// a compressed body's content read up to `limit` bytes; `Err` for a JSON body the
/// layer refuses (a member named twice in one object; one it cannot read where
/// `options` read its fields).
pub fn fingerprint(
    parts: &Parts,
    body: &[u8],
    limit: usize,
    options: &FingerprintOptions,
) -> Result<Fingerprint, RefusedJson> {
    crate::fingerprint::fingerprint(parts, parts.method.as_str(), None, body, limit, options)
}
