//! Multipart bodies behind `Fingerprint::compute` (SPEC S4): hashed as their parts,
//! without the boundary a client picks anew for every attempt.

use idem_core::fuzzing::{multipart_boundary, multipart_parts};
use idem_core::{Fingerprint, FingerprintOptions};

use crate::input::first_line;

/// `data` as a request: its first line the `Content-Type`, the rest the body.
///
/// # Panics
///
/// When a boundary is empty or longer than 70 characters; when a part does not lie in
/// the body or holds the delimiter; when the same parts under another boundary, with a
/// preamble and an epilogue, parse differently or fingerprint differently; or when a
/// body is hashed as parts although it has none, or as bytes although it has some.
pub fn fingerprint_multipart(data: &[u8]) {
    let (line, body) = first_line(data);
    let Ok(content_type) = std::str::from_utf8(line) else {
        return;
    };
    let options = FingerprintOptions::default();
    let fp = |content_type: &str, body: &[u8]| {
        Fingerprint::compute(
            "POST",
            "POST /v1/uploads",
            Some(content_type),
            body,
            &options,
        )
    };
    let fingerprint = fp(content_type, body);
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if !essence.starts_with("multipart/") {
        return;
    }
    let raw = fp("application/octet-stream", body);
    let Some(boundary) = multipart_boundary(content_type) else {
        assert_eq!(fingerprint, raw, "no boundary in {content_type:?}");
        return;
    };
    assert!((1..=70).contains(&boundary.len()), "{boundary:?}");
    let Some(parts) = multipart_parts(body, boundary) else {
        assert_eq!(fingerprint, raw, "no parts, yet not hashed as bytes");
        return;
    };
    assert_ne!(fingerprint, raw, "parts, yet hashed as bytes");
    assert!(!parts.is_empty());

    let delimiter = [b"\r\n--", boundary.as_bytes()].concat();
    let within = body.as_ptr_range();
    for (headers, content) in &parts {
        for field in [headers, content] {
            let range = field.as_ptr_range();
            assert!(within.start <= range.start && range.end <= within.end);
            assert!(!contains(field, &delimiter));
        }
        assert!(!contains(headers, b"\r\n\r\n"));
    }

    // The same parts under another boundary: what a client's retry sends.
    let Some(other) = (0..32)
        .map(|i| format!("idem-retry-{i}"))
        .find(|b| !parts.iter().any(|(h, c)| mentions(h, b) || mentions(c, b)))
    else {
        return;
    };
    let mut retry = b"a preamble, ignored".to_vec();
    for (headers, content) in &parts {
        retry.extend_from_slice(format!("\r\n--{other}\r\n").as_bytes());
        if !headers.is_empty() {
            retry.extend_from_slice(headers);
            retry.extend_from_slice(b"\r\n");
        }
        retry.extend_from_slice(b"\r\n");
        retry.extend_from_slice(content);
    }
    retry.extend_from_slice(format!("\r\n--{other}--\r\nan epilogue, ignored").as_bytes());
    assert_eq!(multipart_parts(&retry, &other).as_ref(), Some(&parts));
    let retry_type = format!("{essence}; boundary=\"{other}\"");
    assert_eq!(
        fp(&retry_type, &retry),
        fingerprint,
        "the retry under {other:?} is another request"
    );
}

/// Whether `field` holds `--boundary`, which could open a delimiter line of it.
fn mentions(field: &[u8], boundary: &str) -> bool {
    contains(field, [b"--", boundary.as_bytes()].concat().as_slice())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
