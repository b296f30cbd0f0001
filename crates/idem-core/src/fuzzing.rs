//! Entry points for idem's fuzz targets (`fuzz/` in the repository): the parsers behind
//! [`Fingerprint::compute`](crate::Fingerprint::compute), so that their properties can be
//! checked on their own output rather than through a digest.
//!
//! Not part of the supported API: compiled only with the `fuzzing` feature, hidden from
//! the docs, and free to change in any release.

use crate::FingerprintOptions;

/// The canonical form of a JSON body that [`Fingerprint::compute`] hashes, with the
/// pointers `options` ignores left out; `None` when the body is not JSON idem reads
/// (see [`UnreadableJson`](crate::UnreadableJson)).
///
/// [`Fingerprint::compute`]: crate::Fingerprint::compute
pub fn canonical_json(body: &[u8], options: &FingerprintOptions) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    crate::canonical::canonicalize(body, &options.ignored, &mut out)
        .ok()
        .map(|_| out)
}

/// The boundary a `multipart/*` content type names, as the fingerprint reads it.
pub fn multipart_boundary(content_type: &str) -> Option<&str> {
    crate::multipart::boundary(content_type)
}

/// The parts (header block, content) of a multipart `body` under `boundary`, as the
/// fingerprint hashes them; `None` when the body is not well formed.
pub fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let parts = crate::multipart::parts(body, boundary)?;
    Some(parts.into_iter().map(|p| (p.headers, p.content)).collect())
}
