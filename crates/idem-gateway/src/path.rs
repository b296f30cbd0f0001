//! Path normalisation at the edge (SPEC S14): one spelling per resource before any rule
//! sees the request.
//!
//! `/v1/charges`, `/v1//charges`, `/v1/%63harges`, `/v1/./charges` and
//! `/v1/x/../charges` name one resource to an upstream that normalises its paths, as
//! most do. Were the gateway to route, scope and forward the raw path, each spelling
//! would be a new endpoint under the same key (one more execution each), and would
//! slip past a `[[route]]` rule's `require_key` and `ignore`. So the listener
//! normalises the path once, before route matching, scoping and forwarding, and the
//! upstream receives the normalised path: the gateway and the upstream agree on which
//! resource a request names. The query is left as it is.
//!
//! What [`normalize`] does, item by item of [`PathNormalization`] (by default
//! `rfc3986,merge-slashes`, as Envoy's `normalize_path` and `merge_slashes`):
//!
//! - `rfc3986`, RFC 3986 §6.2.2: percent-escapes of unreserved characters (`A-Z a-z
//!   0-9 - . _ ~`) are decoded (`%63` is `c`, `%2e` is `.`), the hex of every other
//!   escape is upper-cased (`%2f` is `%2F`), and then dot segments are removed (`.`
//!   and `..`, encoded ones included, since decoding comes first). Characters that RFC
//!   3986 does not allow in a path at all (`"`, `{`, `}`, `|`, `^`, `[`, `]`, a space,
//!   anything not ASCII) are percent-encoded, byte by byte of their UTF-8, as RFC 3987
//!   §3.1 maps an IRI to a URI, so that the raw and the encoded spelling are one.
//! - `merge-slashes`: repeated slashes are one (`/v1//charges` is `/v1/charges`),
//!   merged before dot segments are removed, as a POSIX path is read
//!   (`/a//../b` is `/b`).
//! - `trailing-slash` (opt-in, an equivalence RFC 3986 does not make but many APIs
//!   do): `/v1/charges/` is `/v1/charges`; the root stays `/`.
//! - `lowercase` (opt-in, likewise): ASCII letters are lower-cased; percent-escapes
//!   keep their upper-case hex.
//! - `none` leaves every path as it came.
//!
//! What is never changed, and what is refused with [`InvalidPath`] (a 400 problem
//! `invalid-path` at the gateway, nothing reserved, nothing forwarded), whenever any
//! item is on:
//!
//! - `%2F` and `%5C` stay encoded: an encoded slash or backslash is part of a segment,
//!   never a separator, exactly as RFC 3986 says of reserved characters.
//! - A path that does not start with `/`.
//! - With `rfc3986`: a `..` that would climb above the root (`/../v1/charges`); a `%`
//!   not followed by two hex digits (`%G1`, a trailing `%4`); an escape of a control
//!   character (`%00` to `%1F`, `%7F`), which no resource name needs and which upstreams
//!   written in C truncate at or write into their logs; escapes of bytes that are not
//!   UTF-8 (`%FF`, or the overlong `%C0%AE` that a lax decoder reads as `.`), which
//!   upstreams decode each their own way (an error, U+FFFD, a raw byte), so that two
//!   such paths could be one resource to them and two to the gateway, or a dot segment
//!   the gateway never saw; and a raw backslash, which
//!   some upstreams read as a slash and others as a character, so no one spelling can
//!   stand for it (send `%5C`).
//!
//! Decoding only ever yields unreserved characters, so a decoded path is always valid
//! in a URI, never forms a new escape and never a new separator. The work is one pass
//! over the path (linear in its length, whatever it holds), and a path that is already
//! normal (the common case) is returned borrowed, without allocating. Normalising is
//! idempotent: `normalize(normalize(p)) == normalize(p)`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// Which normalisations the gateway applies to request paths (`--path-normalization`):
/// by default `rfc3986` and `merge-slashes`; see the [module docs](self).
///
/// ```
/// use idem_gateway::path::PathNormalization;
///
/// let default = PathNormalization::default();
/// assert_eq!(default.to_string(), "rfc3986,merge-slashes");
/// let all: PathNormalization = "rfc3986,merge-slashes,trailing-slash,lowercase".parse().unwrap();
/// assert!(all.trailing_slash() && all.lowercase());
/// assert!("none".parse::<PathNormalization>().unwrap().is_none());
/// assert!("none,lowercase".parse::<PathNormalization>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathNormalization {
    rfc3986: bool,
    merge_slashes: bool,
    trailing_slash: bool,
    lowercase: bool,
}

/// The list items, in the order they are shown.
const ITEMS: [&str; 4] = ["rfc3986", "merge-slashes", "trailing-slash", "lowercase"];

impl PathNormalization {
    /// No normalisation: paths are routed, scoped and forwarded as they came.
    pub const NONE: PathNormalization = PathNormalization {
        rfc3986: false,
        merge_slashes: false,
        trailing_slash: false,
        lowercase: false,
    };

    /// The options a list names: `rfc3986`, `merge-slashes`, `trailing-slash`,
    /// `lowercase` (any case, repeats ignored, blank items skipped), or `none` alone.
    pub fn from_items<I, S>(items: I) -> Result<PathNormalization, PathNormalizationError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut options = PathNormalization::NONE;
        let mut none = false;
        let mut any = false;
        for item in items {
            let item = item.as_ref().trim();
            if item.is_empty() {
                continue;
            }
            any = true;
            match item.to_ascii_lowercase().as_str() {
                "none" => none = true,
                "rfc3986" => options.rfc3986 = true,
                "merge-slashes" => options.merge_slashes = true,
                "trailing-slash" => options.trailing_slash = true,
                "lowercase" => options.lowercase = true,
                _ => {
                    return Err(PathNormalizationError(format!(
                        "{item:?} is not a normalisation (give a list of {}, or none)",
                        ITEMS.join(", ")
                    )));
                }
            }
        }
        if !any {
            return Err(PathNormalizationError(
                "the list is empty; give rfc3986,merge-slashes (the default), or none to \
                 turn normalisation off"
                    .into(),
            ));
        }
        if none && !options.is_none() {
            return Err(PathNormalizationError(
                "none turns normalisation off and cannot be given with other items".into(),
            ));
        }
        Ok(options)
    }

    /// Whether nothing is normalised.
    pub fn is_none(self) -> bool {
        self == PathNormalization::NONE
    }

    /// RFC 3986 §6.2.2: percent-encoding and dot-segment normalisation.
    pub fn rfc3986(self) -> bool {
        self.rfc3986
    }

    /// Repeated slashes are one.
    pub fn merge_slashes(self) -> bool {
        self.merge_slashes
    }

    /// A trailing slash is dropped.
    pub fn trailing_slash(self) -> bool {
        self.trailing_slash
    }

    /// ASCII letters are lower-cased.
    pub fn lowercase(self) -> bool {
        self.lowercase
    }
}

impl Default for PathNormalization {
    /// `rfc3986,merge-slashes`.
    fn default() -> Self {
        PathNormalization {
            rfc3986: true,
            merge_slashes: true,
            trailing_slash: false,
            lowercase: false,
        }
    }
}

impl FromStr for PathNormalization {
    type Err = PathNormalizationError;

    /// A comma-separated list, as `--path-normalization` takes it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PathNormalization::from_items(s.split(','))
    }
}

impl fmt::Display for PathNormalization {
    /// The list as `--path-normalization` takes it, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            return f.write_str("none");
        }
        let on = [
            self.rfc3986,
            self.merge_slashes,
            self.trailing_slash,
            self.lowercase,
        ];
        let names: Vec<&str> = ITEMS
            .iter()
            .zip(on)
            .filter_map(|(name, on)| on.then_some(*name))
            .collect();
        f.write_str(&names.join(","))
    }
}

/// A `--path-normalization` list that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PathNormalizationError(String);

/// Why a path cannot be normalised; the gateway answers it with a 400 problem
/// `invalid-path` and forwards nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidPath {
    /// The path does not start with `/` (an asterisk-form or authority-form target).
    #[error("the path must start with '/'")]
    NotAbsolute,
    /// A `%` at this byte offset is not followed by two hex digits.
    #[error("the '%' at byte {at} does not start a percent-escape of two hex digits")]
    BrokenEscape {
        /// The byte offset of the `%`.
        at: usize,
    },
    /// The character at this byte offset, raw or percent-encoded, is a control
    /// character (0x00 to 0x1F, or 0x7F).
    #[error("byte {at} is a control character (such as %00), which no path may carry")]
    ControlCharacter {
        /// The byte offset of the character or of its escape's `%`.
        at: usize,
    },
    /// The percent-escapes from this byte offset on encode bytes that are not UTF-8
    /// (`%FF`, an overlong `%C0%AE`), which upstreams decode each their own way.
    #[error(
        "the percent-escapes at byte {at} do not encode UTF-8 (such as %FF, or %C0%AE), \
         which upstreams decode each their own way"
    )]
    NotUtf8 {
        /// The byte offset of the first escape's `%`.
        at: usize,
    },
    /// A raw backslash at this byte offset.
    #[error(
        "byte {at} is a backslash, which upstreams read either as a slash or as a \
         character; send it encoded as %5C"
    )]
    Backslash {
        /// The byte offset of the backslash.
        at: usize,
    },
    /// A `..` segment would climb above the root.
    #[error("a '..' segment climbs above the root")]
    AboveRoot,
}

/// The path normalised as `options` say (see the [module docs](self)): borrowed when it
/// is already normal, an error when it cannot be normalised. `options` of
/// [`PathNormalization::NONE`] return every path as it is.
///
/// ```
/// use idem_gateway::path::{InvalidPath, PathNormalization, normalize};
///
/// let options = PathNormalization::default();
/// for spelling in ["/v1/charges", "/v1//charges", "/v1/%63harges", "/v1/./charges", "/v1/x/../charges"] {
///     assert_eq!(normalize(spelling, options).unwrap(), "/v1/charges");
/// }
/// assert_eq!(normalize("/v1/a%2fb", options).unwrap(), "/v1/a%2Fb");
/// assert_eq!(normalize("/../v1", options), Err(InvalidPath::AboveRoot));
/// ```
pub fn normalize(path: &str, options: PathNormalization) -> Result<Cow<'_, str>, InvalidPath> {
    if options.is_none() {
        return Ok(Cow::Borrowed(path));
    }
    if is_normal(path.as_bytes(), options) {
        return Ok(Cow::Borrowed(path));
    }
    let normal = rewrite(path, options)?;
    Ok(if normal == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(normal)
    })
}

/// A request target with its path normalised (see [`normalize`]), for the listener to
/// put in place of the request's before any rule sees it: `None` when the path is
/// already normal (nothing is allocated then). The query is kept as it came, and so
/// are an absolute-form target's scheme and authority (`POST http://host/v1//x`
/// becomes `http://host/v1/x`; the proxy forwards only the path and query anyway).
///
/// ```
/// use idem_gateway::path::{PathNormalization, normalize_uri};
///
/// let uri: http::Uri = "/v1/./charges?expand=%2e".parse().unwrap();
/// let normal = normalize_uri(&uri, PathNormalization::default()).unwrap().unwrap();
/// assert_eq!(normal, "/v1/charges?expand=%2e");
/// let normal: http::Uri = "/v1/charges".parse().unwrap();
/// assert_eq!(normalize_uri(&normal, PathNormalization::default()), Ok(None));
/// ```
pub fn normalize_uri(
    uri: &http::Uri,
    options: PathNormalization,
) -> Result<Option<http::Uri>, InvalidPath> {
    let Cow::Owned(path) = normalize(uri.path(), options)? else {
        return Ok(None);
    };
    let target = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    // A normalised path holds only characters of the request's own path, unreserved
    // characters, `/` and percent-escapes, all of which a request target may.
    parts.path_and_query = Some(
        http::uri::PathAndQuery::try_from(target).expect("a normalised path is a valid target"),
    );
    Ok(Some(
        http::Uri::from_parts(parts).expect("the request's own URI with a valid path"),
    ))
}

/// RFC 3986's unreserved characters: an escape of one is decoded.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// What a path segment may hold unencoded besides unreserved characters (RFC 3986
/// `pchar`: sub-delims, `:` and `@`).
fn is_pchar_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@'
    )
}

fn is_control(b: u8) -> bool {
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
fn escape_at(bytes: &[u8], i: usize) -> Option<u8> {
    let hi = hex_value(*bytes.get(i + 1)?)?;
    let lo = hex_value(*bytes.get(i + 2)?)?;
    Some(hi << 4 | lo)
}

/// Whether `path` is already what [`rewrite`] would make of it. Conservative: a
/// `false` costs an allocation, never a wrong answer, since [`normalize`] compares.
fn is_normal(bytes: &[u8], options: PathNormalization) -> bool {
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
                        && !bytes[i + 1..i + 3].iter().any(u8::is_ascii_lowercase) =>
                {
                    i += 2;
                }
                Some(_) => return false,
                None if options.rfc3986 => return false,
                None => {}
            },
            b'A'..=b'Z' if options.lowercase => return false,
            _ if options.rfc3986 && !(is_unreserved(b) || is_pchar_delim(b) || b == b'%') => {
                return false;
            }
            _ => {}
        }
        i += 1;
    }
    segment_is_plain(&bytes[segment_start..], options)
}

/// Whether a raw segment is no dot segment [`rewrite`] would remove.
fn segment_is_plain(segment: &[u8], options: PathNormalization) -> bool {
    !(options.rfc3986 && matches!(segment, b"." | b".."))
}

/// The normalised path, built afresh.
fn rewrite(path: &str, options: PathNormalization) -> Result<String, InvalidPath> {
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
        offset += raw.len() + 1;
        let written = &out[start + 1..];
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
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn options(list: &str) -> PathNormalization {
        list.parse().unwrap()
    }

    fn norm(path: &str) -> Result<Cow<'_, str>, InvalidPath> {
        normalize(path, PathNormalization::default())
    }

    #[test]
    fn spellings_of_one_resource_are_one_path() {
        for spelling in [
            "/v1/charges",
            "/v1//charges",
            "/v1/%63harges",
            "/v1/./charges",
            "/v1/x/../charges",
            "/v1/%2E/charges",
            "/v1/x/%2e%2e/charges",
            "/v1/x/.%2E/charges",
            "//v1///charges",
            "/v1/%63%68%61%72%67%65%73",
            "/v1/a//..//charges",
        ] {
            assert_eq!(norm(spelling).unwrap(), "/v1/charges", "{spelling}");
        }
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for path in [
            "/",
            "/v1/charges",
            "/v1/orders/42/capture",
            "/v1/a%2Fb",
            "/v1/a:b@c;d=e,f!$&'()*+",
            "/v1/%C3%A9",
            "/v1/charges/",
        ] {
            assert!(
                matches!(norm(path), Ok(Cow::Borrowed(p)) if p == path),
                "{path}: {:?}",
                norm(path)
            );
        }
        assert!(matches!(
            normalize("/V1/Charges", options("trailing-slash")),
            Ok(Cow::Borrowed(_))
        ));
        // The common paths take the fast check alone, which allocates nothing.
        for path in [
            "/",
            "/v1/charges",
            "/v1/orders/42/capture",
            "/v1/a%2Fb",
            "/v1/x;y=z",
        ] {
            assert!(
                is_normal(path.as_bytes(), PathNormalization::default()),
                "{path}"
            );
        }
    }

    #[test]
    fn escapes_of_reserved_characters_stay_and_are_upper_cased() {
        assert_eq!(norm("/v1/a%2fb").unwrap(), "/v1/a%2Fb");
        assert_eq!(norm("/v1/a%5cb").unwrap(), "/v1/a%5Cb");
        assert_eq!(norm("/v1/%2f%2f").unwrap(), "/v1/%2F%2F");
        assert_eq!(norm("/v1/a%3ab").unwrap(), "/v1/a%3Ab");
        assert_eq!(norm("/v1/%25").unwrap(), "/v1/%25");
        assert_eq!(norm("/v1/%2541").unwrap(), "/v1/%2541", "decoded once only");
        assert_eq!(norm("/v1/%c3%a9").unwrap(), "/v1/%C3%A9");
    }

    #[test]
    fn characters_no_uri_allows_are_encoded() {
        assert_eq!(norm("/v1/{id}").unwrap(), "/v1/%7Bid%7D");
        assert_eq!(norm("/v1/\"a|b^c\"").unwrap(), "/v1/%22a%7Cb%5Ec%22");
        assert_eq!(norm("/v1/[x]").unwrap(), "/v1/%5Bx%5D");
        assert_eq!(norm("/v1/é").unwrap(), "/v1/%C3%A9");
        assert_eq!(norm("/v1/a b").unwrap(), "/v1/a%20b");
        assert_eq!(norm("/v1/é").unwrap(), norm("/v1/%c3%a9").unwrap());
    }

    #[test]
    fn paths_that_cannot_be_normalised_are_refused() {
        for (path, error) in [
            ("/..", InvalidPath::AboveRoot),
            ("/../v1/charges", InvalidPath::AboveRoot),
            ("/v1/../../charges", InvalidPath::AboveRoot),
            ("/%2e%2e/v1", InvalidPath::AboveRoot),
            ("/v1/%G1", InvalidPath::BrokenEscape { at: 4 }),
            ("/v1/%4", InvalidPath::BrokenEscape { at: 4 }),
            ("/v1/%", InvalidPath::BrokenEscape { at: 4 }),
            ("/v1/a%2", InvalidPath::BrokenEscape { at: 5 }),
            (
                "/v1/charges%00.json",
                InvalidPath::ControlCharacter { at: 11 },
            ),
            ("/v1/%0a", InvalidPath::ControlCharacter { at: 4 }),
            ("/v1/%7F", InvalidPath::ControlCharacter { at: 4 }),
            ("/v1/a\tb", InvalidPath::ControlCharacter { at: 5 }),
            ("/v1\\charges", InvalidPath::Backslash { at: 3 }),
            ("/v1/%FF", InvalidPath::NotUtf8 { at: 4 }),
            ("/v1/%C0%AE%C0%AE/x", InvalidPath::NotUtf8 { at: 4 }),
            ("/v1/a%C3", InvalidPath::NotUtf8 { at: 5 }),
            ("/v1/%C3/%A9", InvalidPath::NotUtf8 { at: 4 }),
            ("/v1/%ED%A0%80", InvalidPath::NotUtf8 { at: 4 }),
            ("/v1/%80", InvalidPath::NotUtf8 { at: 4 }),
            ("*", InvalidPath::NotAbsolute),
            ("", InvalidPath::NotAbsolute),
            ("v1/charges", InvalidPath::NotAbsolute),
        ] {
            assert_eq!(norm(path), Err(error.clone()), "{path}");
        }
        assert!(
            InvalidPath::BrokenEscape { at: 4 }
                .to_string()
                .contains("byte 4"),
        );
    }

    #[test]
    fn dot_segments_follow_rfc3986() {
        assert_eq!(norm("/v1/charges/.").unwrap(), "/v1/charges/");
        assert_eq!(norm("/v1/charges/..").unwrap(), "/v1/");
        assert_eq!(norm("/v1/..").unwrap(), "/");
        assert_eq!(norm("/.").unwrap(), "/");
        assert_eq!(norm("/v1/.hidden/..x").unwrap(), "/v1/.hidden/..x");
        assert_eq!(norm("/v1/.../x").unwrap(), "/v1/.../x");
    }

    #[test]
    fn each_item_alone() {
        let rfc = options("rfc3986");
        assert_eq!(normalize("/v1//./charges", rfc).unwrap(), "/v1//charges");
        assert_eq!(normalize("/v1//../charges", rfc).unwrap(), "/v1/charges");
        let merge = options("merge-slashes");
        assert_eq!(normalize("/v1//./%63", merge).unwrap(), "/v1/./%63");
        assert_eq!(normalize("/v1/%G1", merge).unwrap(), "/v1/%G1");
        let trailing = options("trailing-slash");
        assert_eq!(normalize("/v1/charges/", trailing).unwrap(), "/v1/charges");
        assert_eq!(normalize("/v1/charges//", trailing).unwrap(), "/v1/charges");
        assert_eq!(normalize("/", trailing).unwrap(), "/");
        let lower = options("lowercase");
        assert_eq!(
            normalize("/V1/Charges%2f", lower).unwrap(),
            "/v1/charges%2f"
        );
        let all = options("rfc3986,merge-slashes,trailing-slash,lowercase");
        assert_eq!(
            normalize("/V1//Charges/%41/.", all).unwrap(),
            "/v1/charges/a"
        );
        assert_eq!(normalize("/V1/%2f/", all).unwrap(), "/v1/%2F");
    }

    #[test]
    fn none_leaves_every_path_as_it_came() {
        for path in ["/v1//charges", "/../x", "/%G1", "*", "/v1\\x", ""] {
            assert!(matches!(
                normalize(path, PathNormalization::NONE),
                Ok(Cow::Borrowed(p)) if p == path
            ));
        }
    }

    #[test]
    fn lists_parse_and_refuse_what_they_cannot_use() {
        assert_eq!(
            options("rfc3986,merge-slashes"),
            PathNormalization::default()
        );
        assert_eq!(
            options(" RFC3986 , merge-slashes,,"),
            PathNormalization::default()
        );
        assert_eq!(options("none"), PathNormalization::NONE);
        assert_eq!(options("NONE").to_string(), "none");
        assert_eq!(
            options("lowercase,trailing-slash").to_string(),
            "trailing-slash,lowercase"
        );
        for (list, says) in [
            ("rfc3986,slashes", "\"slashes\" is not a normalisation"),
            ("none,rfc3986", "cannot be given with other items"),
            ("", "the list is empty"),
            (" , ", "the list is empty"),
        ] {
            let e = list.parse::<PathNormalization>().unwrap_err();
            assert!(e.to_string().contains(says), "{list:?}: {e}");
        }
    }

    /// Long paths cost one pass: a path of many dot segments or slashes is not
    /// quadratic (it would take minutes at this length if it were).
    #[test]
    fn long_paths_are_one_pass() {
        let n = 60_000;
        let climbing = format!("{}{}", "/a".repeat(n), "/..".repeat(n));
        assert_eq!(norm(&climbing).unwrap(), "/");
        let slashes = format!("/v1{}charges", "/".repeat(n));
        assert_eq!(norm(&slashes).unwrap(), "/v1/charges");
        let escapes = "/%61".repeat(n);
        assert_eq!(norm(&escapes).unwrap(), "/a".repeat(n));
    }

    /// Every percent-escape of `bytes` decoded.
    fn decode_all(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match escape_at(bytes, i).filter(|_| bytes[i] == b'%') {
                Some(v) => {
                    out.push(v);
                    i += 3;
                }
                None => {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
        }
        out
    }

    /// Paths made of the pieces that normalisation cares about.
    fn hostile_path() -> impl Strategy<Value = String> {
        const PIECES: [&str; 29] = [
            "/",
            "//",
            ".",
            "..",
            "%2e",
            "%2E",
            "%2f",
            "%5c",
            "%41",
            "%7e",
            "%c3%a9",
            "%25",
            "%",
            "%4",
            "%00",
            "\\",
            "é",
            "{",
            "a",
            "B",
            "z9",
            "-_~",
            ":@",
            "!$&'()*+,;=",
            "%3A",
            "%g1",
            "%C3",
            "%ff",
            "%C0%AE",
        ];
        let piece = proptest::sample::select(&PIECES[..]);
        proptest::collection::vec(piece, 0..12).prop_map(|pieces| format!("/{}", pieces.concat()))
    }

    fn any_options() -> impl Strategy<Value = PathNormalization> {
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(r, m, t, l)| {
            PathNormalization {
                rfc3986: r,
                merge_slashes: m,
                trailing_slash: t,
                lowercase: l,
            }
        })
    }

    proptest! {
        /// normalize(normalize(p)) == normalize(p), and a normalised path is borrowed
        /// when normalised again.
        #[test]
        fn normalizing_is_idempotent(path in hostile_path(), options in any_options()) {
            if let Ok(once) = normalize(&path, options) {
                let twice = normalize(&once, options);
                prop_assert_eq!(twice.as_deref(), Ok(&*once));
                prop_assert!(matches!(twice, Ok(Cow::Borrowed(_))), "{:?}", twice);
            }
        }

        /// Under RFC 3986 normalisation the result holds only what a URI path may
        /// (unreserved, sub-delims, `:`, `@`, `/` and upper-case escapes of other
        /// bytes), no dot segment, and with merged slashes no empty segment.
        #[test]
        fn normalised_paths_are_plain_uri_paths(path in hostile_path()) {
            if let Ok(normal) = normalize(&path, PathNormalization::default()) {
                let bytes = normal.as_bytes();
                prop_assert!(bytes.starts_with(b"/"));
                let mut i = 0;
                while i < bytes.len() {
                    let b = bytes[i];
                    if b == b'%' {
                        let v = escape_at(bytes, i);
                        prop_assert!(v.is_some_and(|v| !is_unreserved(v) && !is_control(v)));
                        prop_assert!(!bytes[i + 1..i + 3].iter().any(u8::is_ascii_lowercase));
                        i += 3;
                    } else {
                        prop_assert!(is_unreserved(b) || is_pchar_delim(b) || b == b'/', "{}", normal);
                        i += 1;
                    }
                }
                prop_assert!(!normal.contains("//"), "{}", normal);
                prop_assert!(std::str::from_utf8(&decode_all(bytes)).is_ok(), "{}", normal);
                for segment in normal.split('/') {
                    prop_assert!(segment != "." && segment != "..", "{}", normal);
                }
            }
        }

        /// Any request target http accepts is normalised without a panic, keeps its
        /// query, and is what `normalize` makes of its path.
        #[test]
        fn request_targets_are_rewritten_whole(
            path in hostile_path(),
            query in proptest::option::of(proptest::sample::select(&["", "a=%2e", "b=/../x"][..])),
            options in any_options(),
        ) {
            let target = match query {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            if let Ok(uri) = target.parse::<http::Uri>() {
                match normalize_uri(&uri, options) {
                    Ok(Some(normal)) => {
                        prop_assert_eq!(normal.query(), uri.query());
                        let expected = normalize(uri.path(), options);
                        prop_assert_eq!(Ok(normal.path()), expected.as_deref());
                    }
                    Ok(None) => prop_assert!(matches!(normalize(uri.path(), options), Ok(Cow::Borrowed(_)))),
                    Err(e) => prop_assert_eq!(Err(e), normalize(uri.path(), options)),
                }
            }
        }

        /// The fast check never calls a path normal that rewriting would change.
        #[test]
        fn the_fast_check_agrees_with_rewriting(path in hostile_path(), options in any_options()) {
            if !options.is_none() && is_normal(path.as_bytes(), options) {
                let rewritten = rewrite(&path, options);
                prop_assert_eq!(rewritten.as_deref(), Ok(path.as_str()));
            }
        }
    }
}
