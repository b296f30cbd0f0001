//! The parts of a `multipart/*` body (RFC 2046 §5.1), for fingerprints (SPEC S4).
//!
//! Clients choose a new random boundary every time they encode a multipart body (curl's
//! `-F`, Python's `requests`, browsers), so a retry of the same upload differs from the
//! first attempt in every delimiter line. Hashed as raw bytes, the retry of an upload
//! was refused as a different request. The fingerprint hashes the parts instead: each
//! part's header block and content, as sent, in order, without the boundary, the
//! preamble or the epilogue (which RFC 2046 says to ignore).

/// The boundary named by a `multipart/*` content type's `boundary` parameter, quoted or
/// not; `None` when there is none, or it is empty or longer than RFC 2046's 70
/// characters.
pub(crate) fn boundary(content_type: &str) -> Option<&str> {
    let (_, params) = content_type.split_once(';')?;
    params.split(';').find_map(|param| {
        let (name, value) = param.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let value = value.trim();
        // A quoted boundary has no quoted-pair in practice: its characters are all
        // allowed as they are (RFC 2046's bchars), so a backslash is refused rather
        // than unescaped.
        let value = match value.strip_prefix('"') {
            Some(quoted) => quoted
                .strip_suffix('"')
                .filter(|v| !v.contains(['"', '\\']))?,
            None => value,
        };
        (1..=70).contains(&value.len()).then_some(value)
    })
}

/// One part: its header block (without the blank line that ends it) and its content.
pub(crate) struct Part<'a> {
    pub headers: &'a [u8],
    pub content: &'a [u8],
}

/// The parts of `body` delimited by `boundary`, or `None` unless the body is well
/// formed: a delimiter line (`--boundary`, optional spaces or tabs, CRLF) opens each
/// part, each part has its headers, a blank line and its content, and a close delimiter
/// (`--boundary--`) ends the last.
pub(crate) fn parts<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<Part<'a>>> {
    let delimiter = [b"--", boundary.as_bytes()].concat();
    // A delimiter in the middle of the body follows a line break.
    let inner_delimiter = [b"\r\n", delimiter.as_slice()].concat();
    let mut pos = if body.starts_with(&delimiter) {
        delimiter.len()
    } else {
        find(body, &inner_delimiter)? + inner_delimiter.len()
    };
    let mut parts = Vec::new();
    loop {
        let rest = &body[pos..];
        if rest.starts_with(b"--") {
            return (!parts.is_empty()).then_some(parts);
        }
        let padding = rest
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        if !rest[padding..].starts_with(b"\r\n") {
            return None;
        }
        let start = pos + padding + 2;
        let len = find(&body[start..], &inner_delimiter)?;
        let part = &body[start..start + len];
        let (headers, content) = match part.strip_prefix(b"\r\n") {
            // No header fields: the blank line comes first.
            Some(content) => (&part[..0], content),
            None => {
                let end = find(part, b"\r\n\r\n")?;
                (&part[..end], &part[end + 4..])
            }
        };
        parts.push(Part { headers, content });
        pos = start + len + inner_delimiter.len();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_are_read_from_the_content_type() {
        let b = |ct| boundary(ct);
        assert_eq!(b("multipart/form-data; boundary=abc"), Some("abc"));
        assert_eq!(b("multipart/form-data;BOUNDARY=\"a b:c\""), Some("a b:c"));
        assert_eq!(
            b("multipart/mixed; charset=x; boundary=----x1"),
            Some("----x1")
        );
        assert_eq!(b("multipart/form-data"), None);
        assert_eq!(b("multipart/form-data; boundary="), None);
        assert_eq!(b("multipart/form-data; boundary=\"unterminated"), None);
        assert_eq!(b("multipart/form-data; boundary=\"a\\\"b\""), None);
        assert_eq!(
            b(&format!("multipart/form-data; boundary={}", "x".repeat(71))),
            None
        );
    }

    #[test]
    fn parts_are_split_without_boundary_preamble_or_epilogue() {
        let body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n\
            --XyZ  \r\nContent-Disposition: form-data; name=\"f\"; filename=\"x.txt\"\r\n\
            Content-Type: text/plain\r\n\r\nline one\r\nline two\r\n--XyZ\r\n\r\nno headers\r\n\
            --XyZ--\r\nepilogue";
        let parts = parts(body, "XyZ").unwrap();
        let got: Vec<(&[u8], &[u8])> = parts.iter().map(|p| (p.headers, p.content)).collect();
        assert_eq!(
            got,
            [
                (&b"Content-Disposition: form-data; name=\"a\""[..], &b"1"[..]),
                (
                    &b"Content-Disposition: form-data; name=\"f\"; filename=\"x.txt\"\r\nContent-Type: text/plain"[..],
                    &b"line one\r\nline two"[..]
                ),
                (&b""[..], &b"no headers"[..]),
            ]
        );
    }

    #[test]
    fn malformed_bodies_have_no_parts() {
        for body in [
            &b""[..],
            b"--b--",
            b"--b\r\nname: x\r\n\r\nunterminated",
            b"--b\r\nno blank line\r\n--b--",
            b"--bx\r\n\r\n1\r\n--b--",
            b"no delimiter at all",
        ] {
            assert!(
                parts(body, "b").is_none(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
