//! The content codings a keyed request's body arrives in, undone for its fingerprint.
//!
//! A client that compresses its bodies compresses each attempt afresh, and the bytes
//! need not repeat: gzip's header carries a modification time, which Python's
//! `gzip.compress` sets to the current second, and another library or level packs the
//! same content differently. Fingerprinted as sent, such a retry would be refused as a
//! different payload (422). So the fingerprint is taken over the content once its
//! codings are undone, and a retry that carries the same content matches, however it
//! was compressed and whether it was at all. What the handler or upstream receives is
//! the body as sent.
//!
//! Known codings are `gzip` (and `x-gzip`), `deflate` (zlib's format, as HTTP defines
//! it, or the bare deflate stream that some clients send under that name) and
//! `identity`. A body that names any other coding (`br`, `zstd`), that does not decode
//! (bytes after the coded stream included), or whose content would exceed the body
//! limit, is fingerprinted as sent.

use std::io::Read;

use flate2::bufread::{DeflateDecoder, ZlibDecoder};
use flate2::read::MultiGzDecoder;
use http::HeaderMap;
use http::header::CONTENT_ENCODING;

/// The content of `body` with the codings its `Content-Encoding` fields name undone,
/// at most `limit` bytes of it; `None` when there is nothing to undo, or when it cannot
/// be undone within the limit (see the module docs).
pub(crate) fn decoded(headers: &HeaderMap, body: &[u8], limit: usize) -> Option<Vec<u8>> {
    let mut codings = Vec::new();
    for value in headers.get_all(CONTENT_ENCODING) {
        for coding in value.to_str().ok()?.split(',') {
            let coding = coding.trim();
            if coding.eq_ignore_ascii_case("identity") || coding.is_empty() {
                continue;
            }
            codings.push(Coding::parse(coding)?);
        }
    }
    if codings.is_empty() {
        return None;
    }
    // Codings are listed in the order they were applied: undo the last one first.
    let mut content: Option<Vec<u8>> = None;
    for coding in codings.iter().rev() {
        content = Some(coding.undo(content.as_deref().unwrap_or(body), limit)?);
    }
    content
}

/// A content coding this module undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Gzip,
    Deflate,
}

impl Coding {
    fn parse(name: &str) -> Option<Coding> {
        if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            Some(Coding::Gzip)
        } else if name.eq_ignore_ascii_case("deflate") {
            Some(Coding::Deflate)
        } else {
            None
        }
    }

    /// `coded` decoded, if it decodes without error to at most `limit` bytes.
    fn undo(self, coded: &[u8], limit: usize) -> Option<Vec<u8>> {
        match self {
            // A gzip body may hold several members, one after the other.
            Coding::Gzip => read_all(MultiGzDecoder::new(coded), limit),
            // A deflate stream says where it ends, and its decoder stops there: bytes
            // after it would be ignored, making two bodies one. The whole body must be
            // the stream, as a gzip body must be its members.
            Coding::Deflate => read_whole(ZlibDecoder::new(coded), limit, ZlibDecoder::into_inner)
                .or_else(|| {
                    read_whole(
                        DeflateDecoder::new(coded),
                        limit,
                        DeflateDecoder::into_inner,
                    )
                }),
        }
    }
}

/// What [`read_all`] gives of `decoder`, if the decoder then has read all its input:
/// `rest` is the input it left.
fn read_whole<'a, D: Read>(
    mut decoder: D,
    limit: usize,
    rest: impl FnOnce(D) -> &'a [u8],
) -> Option<Vec<u8>> {
    let content = read_all(&mut decoder, limit)?;
    rest(decoder).is_empty().then_some(content)
}

/// Everything `reader` gives, unless it fails or gives more than `limit` bytes.
fn read_all(reader: impl Read, limit: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader.take(cap).read_to_end(&mut out).ok()?;
    (out.len() <= limit).then_some(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::{DeflateEncoder, ZlibEncoder};
    use http::HeaderValue;

    use super::*;

    const JSON: &[u8] = br#"{"amount":100,"currency":"eur"}"#;

    fn gzip(data: &[u8], mtime: u32, level: u32) -> Vec<u8> {
        let mut e = flate2::GzBuilder::new()
            .mtime(mtime)
            .write(Vec::new(), Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn encoded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(CONTENT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    #[test]
    fn gzip_is_undone_whatever_its_header_and_level() {
        let headers = encoded(&["gzip"]);
        for (mtime, level) in [(0, 6), (1_796_140_427, 1), (7, 9)] {
            let body = gzip(JSON, mtime, level);
            assert_eq!(decoded(&headers, &body, 1024).as_deref(), Some(JSON));
        }
        assert_eq!(
            decoded(&encoded(&["X-GZIP"]), &gzip(JSON, 3, 6), 1024).as_deref(),
            Some(JSON)
        );
        // Two members, one after the other.
        let mut two = gzip(&JSON[..10], 0, 6);
        two.extend(gzip(&JSON[10..], 0, 6));
        assert_eq!(decoded(&headers, &two, 1024).as_deref(), Some(JSON));
    }

    #[test]
    fn deflate_is_zlib_or_a_bare_stream() {
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
        zlib.write_all(JSON).unwrap();
        let mut bare = DeflateEncoder::new(Vec::new(), Compression::default());
        bare.write_all(JSON).unwrap();
        let headers = encoded(&["deflate"]);
        for body in [zlib.finish().unwrap(), bare.finish().unwrap()] {
            assert_eq!(decoded(&headers, &body, 1024).as_deref(), Some(JSON));
        }
    }

    #[test]
    fn stacked_codings_are_undone_last_first() {
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
        zlib.write_all(&gzip(JSON, 5, 6)).unwrap();
        let body = zlib.finish().unwrap();
        for headers in [
            encoded(&["gzip, deflate"]),
            encoded(&["gzip", "deflate"]),
            encoded(&["identity, gzip,deflate"]),
        ] {
            assert_eq!(decoded(&headers, &body, 1024).as_deref(), Some(JSON));
        }
        // In the other order it does not decode.
        assert_eq!(decoded(&encoded(&["deflate, gzip"]), &body, 1024), None);
    }

    #[test]
    fn bytes_after_the_coded_stream_leave_the_body_as_sent() {
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
        zlib.write_all(JSON).unwrap();
        let mut bare = DeflateEncoder::new(Vec::new(), Compression::default());
        bare.write_all(JSON).unwrap();
        let deflate = encoded(&["deflate"]);
        for body in [zlib.finish().unwrap(), bare.finish().unwrap()] {
            assert_eq!(decoded(&deflate, &body, 1024).as_deref(), Some(JSON));
            for tail in [&b"\0"[..], b"junk after the stream"] {
                let longer = [&body[..], tail].concat();
                assert_eq!(decoded(&deflate, &longer, 1024), None, "{tail:?}");
            }
        }
        let longer = [&gzip(JSON, 0, 6)[..], b"\0"].concat();
        assert_eq!(decoded(&encoded(&["gzip"]), &longer, 1024), None);
    }

    #[test]
    fn nothing_to_undo_or_nothing_undoable_leaves_the_body_as_sent() {
        assert_eq!(decoded(&HeaderMap::new(), JSON, 1024), None);
        assert_eq!(decoded(&encoded(&["identity"]), JSON, 1024), None);
        // An unknown coding anywhere in the list: the bytes as sent.
        assert_eq!(decoded(&encoded(&["br"]), JSON, 1024), None);
        assert_eq!(
            decoded(&encoded(&["gzip, br"]), &gzip(JSON, 0, 6), 1024),
            None
        );
        // Not what it says it is, or cut short.
        assert_eq!(decoded(&encoded(&["gzip"]), JSON, 1024), None);
        let body = gzip(JSON, 0, 6);
        assert_eq!(
            decoded(&encoded(&["gzip"]), &body[..body.len() - 4], 1024),
            None
        );
        // A header value that is not text.
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_ENCODING,
            HeaderValue::from_bytes(b"gz\xffip").unwrap(),
        );
        assert_eq!(decoded(&headers, &body, 1024), None);
    }

    proptest::proptest! {
        /// Whatever a client sends under a coding, arbitrary bytes or a compressed body
        /// with one byte changed, the answer is content within the limit or nothing,
        /// and never a panic.
        #[test]
        fn any_bytes_decode_within_the_limit_or_not_at_all(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            flip in proptest::prelude::any::<(usize, u8)>(),
            coding in proptest::sample::select(vec!["gzip", "deflate", "gzip, deflate"]),
            limit in 0usize..2048,
        ) {
            let mut damaged = gzip(&bytes, 0, 6);
            let at = flip.0 % damaged.len();
            damaged[at] ^= flip.1;
            for body in [&bytes, &damaged] {
                if let Some(content) = decoded(&encoded(&[coding]), body, limit) {
                    proptest::prop_assert!(content.len() <= limit);
                }
            }
        }

        /// Any content, compressed at any level with any header time, decodes to
        /// itself.
        #[test]
        fn any_content_round_trips(
            content in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            mtime in proptest::prelude::any::<u32>(),
            level in 0u32..=9,
        ) {
            let body = gzip(&content, mtime, level);
            let got = decoded(&encoded(&["gzip"]), &body, content.len());
            proptest::prop_assert_eq!(got, Some(content));
        }
    }

    #[test]
    fn content_past_the_limit_is_not_decoded_further() {
        // 16 MiB of zeros compress to about 16 KiB: decoding stops one byte past the
        // limit instead of inflating it all.
        let bomb = gzip(&vec![0; 16 << 20], 0, 9);
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        assert_eq!(decoded(&encoded(&["gzip"]), &bomb, 1 << 20), None);
        // Content exactly at the limit is decoded.
        let body = gzip(&[b'x'; 100], 0, 6);
        assert_eq!(
            decoded(&encoded(&["gzip"]), &body, 100).map(|c| c.len()),
            Some(100)
        );
        assert_eq!(decoded(&encoded(&["gzip"]), &body, 99), None);
    }
}
