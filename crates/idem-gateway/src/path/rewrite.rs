//! The byte-level work of [`normalize`](super::normalize): checking that a path is\nalready normal (the common case, no allocation), and rewriting it in one pass when\nit is not.

use super::{InvalidPath, PathNormalization};

/// RFC 3986's unreserved characters: an escape of one is decoded.
pub(super) fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// What a path segment may hold unencoded besides unreserved characters (RFC 3986
/// `pchar`: sub-delims, `:` and `@`).
pub(super) fn is_pchar_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@'
    )
}

pub(super) fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7F
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// How many escapes from `bytes[i]` on (a `%` whose byte is 0x80 or more) encode one
/// UTF-8 character; `None` when they encode none: a stray continuation byte, an
/// overlong form (`%C0%AE` for `.`), a surrogate, or a sequence cut short.
fn encoded_utf8_len(bytes: &[u8], i: usize) -> Option<usize> {
    let lead = escape_at(bytes, i)?;
    let len = match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    let mut buf = [0u8; 4];
    for (n, byte) in buf.iter_mut().enumerate().take(len) {
        let at = i + 3 * n;
        if bytes.get(at) != Some(&b'%') {
            return None;
        }
        *byte = escape_at(bytes, at)?;
    }
    std::str::from_utf8(&buf[..len]).ok().map(|_| len)
}

/// The escape at `bytes[i]` (a `%`), if two hex digits follow.
pub(super) fn escape_at(bytes: &[u8], i: usize) -> Option<u8> {
    let hi = hex_value(*bytes.get(i + 1)?)?;
    let lo = hex_value(*bytes.get(i + 2)?)?;
    Some(hi << 4 | lo)
}

/// Whether `path` is already what [`rewrite`] would make of it. Conservative: a
/// `false` costs an allocation, never a wrong answer, since [`normalize`] compares.
pub(super) fn is_normal(bytes: &[u8], options: PathNormalization) -> bool {
    if bytes.first() != Some(&b'/') {
        return false;
    }
    if options.trailing_slash && bytes.len() > 1 && bytes.ends_with(b"/") {
        return false;
    }
    let mut i = 0;
    let mut segment_start = 1;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'/' => {
                if i > 0 && !segment_is_plain(&bytes[segment_start..i], options) {
                    return false;
                }
                if options.merge_slashes && bytes.get(i + 1) == Some(&b'/') {
                    return false;
                }
                segment_start = i + 1;
            }
            b'%' if options.rfc3986 || options.lowercase => match escape_at(bytes, i) {
                Some(v)
                    if !(options.rfc3986 && (is_unreserved(v) || is_control(v) || v >= 0x80))
                        && !(options.reject_ambiguous && is_ambiguous_escape(v))
                        && !bytes[i + 1..i + 3].iter().any(u8::is_ascii_lowercase) =>
                {
                    i += 2;
                }
                Some(_) => return false,
                None if options.rfc3986 => return false,
                None => {}
            },
            b'A'..=b'Z' if options.lowercase => return false,
            // Path parameters are checked by `rewrite`, where segments are whole.
            b';' if options.reject_ambiguous => return false,
            _ if options.rfc3986 && !(is_unreserved(b) || is_pchar_delim(b) || b == b'%') => {
                return false;
            }
            _ => {}
        }
        i += 1;
    }
    segment_is_plain(&bytes[segment_start..], options)
}

/// Whether an escape of `v` is refused under `reject-ambiguous`: a delimiter that
/// upstreams read each their own way (`/`, `\`, `;`), or a space, which `rewrite`
/// checks where segments are whole.
fn is_ambiguous_escape(v: u8) -> bool {
    matches!(v, b'/' | b'\\' | b';' | b' ')
}

/// Whether a raw segment is no dot segment [`rewrite`] would remove.
fn segment_is_plain(segment: &[u8], options: PathNormalization) -> bool {
    !(options.rfc3986 && matches!(segment, b"." | b".."))
}

/// The normalised path, built afresh.
pub(super) fn rewrite(path: &str, options: PathNormalization) -> Result<String, InvalidPath> {
    let bytes = path.as_bytes();
    let Some(rest) = bytes.strip_prefix(b"/") else {
        return Err(InvalidPath::NotAbsolute);
    };
    let mut out = String::with_capacity(path.len() + 2);
    // Where each segment written to `out` starts (its '/'), for `..` to drop it.
    let mut starts: Vec<usize> = Vec::new();
    // Whether the path ends in a slash: after an empty last segment, or a dot segment.
    let mut trailing = false;
    let mut offset = 1;
    let mut segments = rest.split(|&b| b == b'/').peekable();
    while let Some(raw) = segments.next() {
        let last = segments.peek().is_none();
        let start = out.len();
        out.push('/');
        segment_into(raw, offset, options, &mut out)?;
        let written = &out[start + 1..];
        if options.reject_ambiguous {
            check_unambiguous(written, offset)?;
        }
        offset += raw.len() + 1;
        if written.is_empty() {
            if last {
                out.truncate(start);
                trailing = true;
            } else if options.merge_slashes {
                out.truncate(start);
            } else {
                // An empty segment, kept: a `..` after it drops it.
                starts.push(start);
                trailing = false;
            }
            continue;
        }
        if options.rfc3986 && (written == "." || written == "..") {
            let up = written == "..";
            out.truncate(start);
            if up {
                let previous = starts.pop().ok_or(InvalidPath::AboveRoot)?;
                out.truncate(previous);
            }
            trailing = last;
            continue;
        }
        starts.push(start);
        trailing = false;
    }
    if options.trailing_slash {
        while out.ends_with('/') {
            out.pop();
        }
    } else if trailing {
        out.push('/');
    }
    if out.is_empty() {
        out.push('/');
    }
    if options.reject_ambiguous {
        check_compatibility(&out)?;
    }
    Ok(out)
}

/// Refuses a normalised segment (at byte `at` of the request's path) that upstreams
/// read each their own way: one padded with a space, which some trim, or one whose
/// name before its `;` path parameters is empty, `.` or `..`, which an upstream that
/// strips the parameters reads as an empty or a dot segment (`..;` climbs there).
fn check_unambiguous(segment: &str, at: usize) -> Result<(), InvalidPath> {
    if segment.starts_with("%20") || segment.ends_with("%20") {
        return Err(InvalidPath::PaddedSegment { at });
    }
    if let Some((name, _)) = segment.split_once(';')
        && matches!(name, "" | "." | "..")
    {
        return Err(InvalidPath::ParametersOnDotSegment { at });
    }
    Ok(())
}

/// Refuses a normalised path that holds a character NFKC changes: some upstreams fold
/// the fullwidth `ｃ` (or a ligature, a non-breaking space) into what it looks like, so
/// that `/v1/ｃharges` is `/v1/charges` to them and another path to the rules.
fn check_compatibility(path: &str) -> Result<(), InvalidPath> {
    use unicode_normalization::UnicodeNormalization;
    let bytes = path.as_bytes();
    // Only escapes of UTF-8 (validated by `segment_into`) can hold such a character.
    if !bytes.windows(2).any(|w| w[0] == b'%' && w[1] >= b'8') {
        return Ok(());
    }
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match escape_at(bytes, i).filter(|_| bytes[i] == b'%') {
            Some(v) => {
                decoded.push(v);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    let text = std::str::from_utf8(&decoded).expect("escapes checked as UTF-8");
    if text.nfkc().eq(text.chars()) {
        return Ok(());
    }
    // The character to name: the first that NFKC changes on its own, else (a sequence
    // that it composes) the first that is not ASCII.
    let character = text
        .chars()
        .find(|&c| std::iter::once(c).nfkc().ne(std::iter::once(c)))
        .or_else(|| text.chars().find(|c| !c.is_ascii()))
        .expect("only non-ASCII characters change under NFKC");
    Err(InvalidPath::CompatibilityCharacter { character })
}

/// Writes one segment (the bytes between two slashes, starting at byte `offset` of the
/// path) to `out`, normalised.
fn segment_into(
    raw: &[u8],
    offset: usize,
    options: PathNormalization,
    out: &mut String,
) -> Result<(), InvalidPath> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let push_escape = |out: &mut String, v: u8| {
        out.push('%');
        out.push(HEX[usize::from(v >> 4)] as char);
        out.push(HEX[usize::from(v & 0xF)] as char);
    };
    let letter = |b: u8| {
        if options.lowercase {
            b.to_ascii_lowercase() as char
        } else {
            b as char
        }
    };
    if !options.rfc3986 {
        // Only lower-casing touches a segment here: letters outside escapes.
        let mut segment = raw.to_vec();
        let mut i = 0;
        while i < segment.len() {
            if segment[i] == b'%' && escape_at(&segment, i).is_some() {
                i += 3;
            } else {
                if options.lowercase {
                    segment[i].make_ascii_lowercase();
                }
                i += 1;
            }
        }
        out.push_str(std::str::from_utf8(&segment).expect("lower-casing ASCII keeps UTF-8"));
        return Ok(());
    }
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        let at = offset + i;
        if b == b'%' {
            let v = escape_at(raw, i).ok_or(InvalidPath::BrokenEscape { at })?;
            if is_control(v) {
                return Err(InvalidPath::ControlCharacter { at });
            }
            if options.reject_ambiguous && matches!(v, b'/' | b'\\' | b';') {
                return Err(InvalidPath::EncodedDelimiter {
                    at,
                    delimiter: char::from(v),
                });
            }
            if is_unreserved(v) {
                out.push(letter(v));
                i += 3;
            } else if v < 0x80 {
                push_escape(out, v);
                i += 3;
            } else {
                // The escapes of one UTF-8 character, checked whole and kept encoded.
                let len = encoded_utf8_len(raw, i).ok_or(InvalidPath::NotUtf8 { at })?;
                for _ in 0..len {
                    push_escape(out, escape_at(raw, i).expect("checked"));
                    i += 3;
                }
            }
        } else if is_unreserved(b) || is_pchar_delim(b) {
            out.push(letter(b));
            i += 1;
        } else if b == b'\\' {
            return Err(InvalidPath::Backslash { at });
        } else if is_control(b) {
            return Err(InvalidPath::ControlCharacter { at });
        } else {
            // Not allowed in a URI path: encoded, as RFC 3987 §3.1 maps an IRI.
            push_escape(out, b);
            i += 1;
        }
    }
    Ok(())
}
