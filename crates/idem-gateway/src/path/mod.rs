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
//! `rfc3986,merge-slashes,reject-ambiguous`: Envoy's `normalize_path` and
//! `merge_slashes`, and the refusals of Tomcat's and Spring Security's defaults):
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
//! - `reject-ambiguous` (needs `rfc3986`): refuses, with [`InvalidPath`], the spellings
//!   that upstream frameworks read each their own way, so that no one normal spelling
//!   can stand for them: an escaped `/`, `\\` or `;` (`%2F`, `%5C`, `%3B`: Tomcat
//!   refuses the first two, WSGI servers decode them into separators, Spring strips
//!   `;` before it decodes and Jetty after); a segment that starts or ends with a
//!   space (`/v1/charges%20`, which Spring's older matchers trimmed); a segment whose
//!   name before its `;` path parameters is empty, `.` or `..` (`/v1/x/..;/charges`
//!   is `/v1/charges` to Tomcat, which strips the parameters and then the dot
//!   segment); and a character that Unicode compatibility normalisation (NFKC)
//!   changes (the fullwidth `ｃ` of `/v1/ｃharges`, a ligature, a non-breaking space),
//!   which some upstreams fold into the ASCII it looks like. Path parameters of named
//!   segments (`/v1/charges;jsessionid=x`) pass: route rules match as if they were not
//!   there (see [`crate::route`]).
//! - `none` leaves every path as it came.
//!
//! What is never changed, and what is refused with [`InvalidPath`] (a 400 problem
//! `invalid-path` at the gateway, nothing reserved, nothing forwarded), whenever any
//! item is on:
//!
//! - Without `reject-ambiguous`, `%2F`, `%5C` and `%3B` stay encoded: an encoded
//!   slash, backslash or semicolon is part of a segment, never a delimiter, exactly as
//!   RFC 3986 says of reserved characters.
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

mod rewrite;

use rewrite::{is_normal, rewrite};

/// Which normalisations the gateway applies to request paths (`--path-normalization`):
/// by default `rfc3986`, `merge-slashes` and `reject-ambiguous`; the module's docs say
/// what each does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PathNormalization {
    rfc3986: bool,
    merge_slashes: bool,
    trailing_slash: bool,
    lowercase: bool,
    reject_ambiguous: bool,
}

/// The list items, in the order they are shown.
const ITEMS: [&str; 5] = [
    "rfc3986",
    "merge-slashes",
    "trailing-slash",
    "lowercase",
    "reject-ambiguous",
];

impl PathNormalization {
    /// No normalisation: paths are routed, scoped and forwarded as they came.
    pub const NONE: PathNormalization = PathNormalization {
        rfc3986: false,
        merge_slashes: false,
        trailing_slash: false,
        lowercase: false,
        reject_ambiguous: false,
    };

    /// The options a list names: `rfc3986`, `merge-slashes`, `trailing-slash`,
    /// `lowercase`, `reject-ambiguous` (any case, repeats ignored, blank items
    /// skipped), or `none` alone.
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
                "reject-ambiguous" => options.reject_ambiguous = true,
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
                "the list is empty; give rfc3986,merge-slashes,reject-ambiguous (the \
                 default), or none to turn normalisation off"
                    .into(),
            ));
        }
        if none && !options.is_none() {
            return Err(PathNormalizationError(
                "none turns normalisation off and cannot be given with other items".into(),
            ));
        }
        if options.reject_ambiguous && !options.rfc3986 {
            return Err(PathNormalizationError(
                "reject-ambiguous reads escapes as rfc3986 decodes them, and needs it in the \
                 list too"
                    .into(),
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
}

impl Default for PathNormalization {
    /// `rfc3986,merge-slashes,reject-ambiguous`.
    fn default() -> Self {
        PathNormalization {
            rfc3986: true,
            merge_slashes: true,
            trailing_slash: false,
            lowercase: false,
            reject_ambiguous: true,
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
            self.reject_ambiguous,
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
    /// The escape at this byte offset encodes a delimiter (`%2F`, `%5C`, `%3B`), which
    /// upstreams keep, decode into a delimiter or refuse, each their own way.
    #[error(
        "the escape at byte {at} encodes {delimiter:?}, which upstreams read either as a \
         delimiter or as a character"
    )]
    EncodedDelimiter {
        /// The byte offset of the escape's `%`.
        at: usize,
        /// The character it encodes.
        delimiter: char,
    },
    /// The segment at this byte offset starts or ends with a space, which some
    /// upstreams trim.
    #[error("the segment at byte {at} starts or ends with a space, which some upstreams trim")]
    PaddedSegment {
        /// The byte offset of the segment's first byte.
        at: usize,
    },
    /// The segment at this byte offset has `;` path parameters after an empty, `.` or
    /// `..` name, which upstreams that strip the parameters read as a dot segment or
    /// an empty one.
    #[error(
        "the segment at byte {at} has path parameters after an empty, '.' or '..' name, \
         which upstreams that strip them (Tomcat, Spring) read as a dot or empty segment"
    )]
    ParametersOnDotSegment {
        /// The byte offset of the segment's first byte.
        at: usize,
    },
    /// The path holds a character that Unicode compatibility normalisation (NFKC)
    /// changes (a fullwidth letter, a ligature, a non-breaking space).
    #[error(
        "the path holds {character:?} (U+{code:04X}), which Unicode compatibility \
         normalisation (NFKC) spells otherwise, as some upstreams read it",
        code = u32::from(*character)
    )]
    CompatibilityCharacter {
        /// The first such character.
        character: char,
    },
}

/// The path normalised as `options` say (see the module's docs): borrowed when it is
/// already normal, an error when it cannot be normalised. `options` of
/// [`PathNormalization::NONE`] return every path as it is.
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
pub(crate) fn normalize_uri(
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

#[cfg(test)]
mod tests;
