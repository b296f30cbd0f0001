//! The content codings `idem-tower` undoes before it fingerprints a body.

use std::io::Write;

use flate2::Compression;
use flate2::write::{DeflateEncoder, GzEncoder, ZlibEncoder};
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request};
use idem_core::FingerprintOptions;
use idem_tower::fuzzing::{decoded, fingerprint};

/// The body limits tried: none at all, tiny, around a small JSON body, and larger than
/// any input libFuzzer makes by default, so that a bomb's content passes it.
const LIMITS: [usize; 8] = [0, 1, 2, 31, 100, 1024, 4096, 1 << 20];

/// The `Content-Encoding` field values tried.
const CODINGS: [&str; 8] = [
    "gzip",
    "deflate",
    "X-Gzip",
    "gzip, deflate",
    "deflate,gzip",
    "identity, GZIP",
    "gzip, br",
    " , identity",
];

/// `data`'s first byte picks a limit, a `Content-Encoding` and a mode; the rest is the
/// body as sent (modes 0 and 1) or the content to encode and send (modes 2 and 3; 3
/// sends `deflate` as a bare stream instead of zlib's format).
///
/// # Panics
///
/// When a body decodes to more than the limit, or to content that decodes again under
/// a limit it exceeds, or still decodes with a byte after it; when decoded content fingerprints differently from the same
/// content sent without a coding, or a body that is not decoded differently from
/// itself sent without one; or when content encoded as its header says does not
/// decode to itself whenever it and every layer of it fit the limit.
pub fn content_coding(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let limit = LIMITS[usize::from(selector & 7)];
    let coding = CODINGS[usize::from((selector >> 3) & 7)];
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding));
    match selector >> 6 {
        0 | 1 => sent(&headers, rest, limit),
        mode => encoded(&headers, coding, rest, limit, mode == 3),
    }
}

/// Arbitrary bytes sent under a coding.
fn sent(headers: &HeaderMap, body: &[u8], limit: usize) {
    let content = decoded(headers, body, limit);
    let as_sent = request_fingerprint(headers, body, limit);
    match &content {
        Some(content) => {
            assert!(content.len() <= limit, "{} > {limit}", content.len());
            // Decoding stops at the limit, not after it.
            if let Some(smaller) = content.len().checked_sub(1) {
                assert_eq!(decoded(headers, body, smaller), None);
            }
            // Every byte sent is part of the coded content: a byte after it makes the
            // body another one, not the same content with something ignored.
            let longer = [body, &body[body.len().saturating_sub(1)..]].concat();
            assert_eq!(
                decoded(headers, &longer, limit),
                None,
                "a byte after the stream is ignored"
            );
            assert_eq!(
                as_sent,
                request_fingerprint(&HeaderMap::new(), content, limit),
                "not the fingerprint of its content"
            );
        }
        None => assert_eq!(
            as_sent,
            request_fingerprint(&HeaderMap::new(), body, limit),
            "neither its content's fingerprint nor its own"
        ),
    }
}

/// `content` encoded as `coding` says, then decoded.
fn encoded(headers: &HeaderMap, coding: &str, content: &[u8], limit: usize, bare: bool) {
    let mut layers = vec![content.to_vec()];
    let mut known = true;
    for name in coding.split(',').map(str::trim) {
        let last = layers.last().expect("the content");
        let next = match name.to_ascii_lowercase().as_str() {
            "" | "identity" => continue,
            "gzip" | "x-gzip" => {
                let level = Compression::new(u32::from(content.len() as u8 % 10));
                let mut e = GzEncoder::new(Vec::new(), level);
                e.write_all(last).expect("a Vec");
                e.finish().expect("a Vec")
            }
            "deflate" if bare => {
                let mut e = DeflateEncoder::new(Vec::new(), Compression::default());
                e.write_all(last).expect("a Vec");
                e.finish().expect("a Vec")
            }
            "deflate" => {
                let mut e = ZlibEncoder::new(Vec::new(), Compression::fast());
                e.write_all(last).expect("a Vec");
                e.finish().expect("a Vec")
            }
            _ => {
                known = false;
                break;
            }
        };
        layers.push(next);
    }
    let body = layers.last().expect("the content");
    let got = decoded(headers, body, limit);
    // Every layer but the body as sent is held in memory while decoding, so each must
    // fit the limit.
    let fits = layers[..layers.len() - 1].iter().all(|l| l.len() <= limit);
    let expected = (known && layers.len() > 1 && fits).then(|| content.to_vec());
    assert_eq!(
        got,
        expected,
        "{coding:?} of {} bytes, limit {limit}",
        content.len()
    );
}

/// The fingerprint the layer takes of a JSON `POST` with `headers` and `body` (or the
/// JSON it refuses the request for).
fn request_fingerprint(
    headers: &HeaderMap,
    body: &[u8],
    limit: usize,
) -> Result<idem_core::Fingerprint, idem_core::RefusedJson> {
    let mut parts = head();
    parts.headers = headers.clone();
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    fingerprint(&parts, body, limit, &FingerprintOptions::default())
}

fn head() -> Parts {
    let request = Request::post("/v1/charges?expand=customer")
        .body(())
        .expect("a valid request");
    request.into_parts().0
}
