//! Tests of path normalisation: each item, what is refused, and that normalising is
//! idempotent and leaves a URI-safe path.

use super::rewrite::{escape_at, is_control, is_pchar_delim, is_unreserved};
use super::*;
use proptest::prelude::*;

fn options(list: &str) -> PathNormalization {
    list.parse().unwrap()
}

fn norm(path: &str) -> Result<Cow<'_, str>, InvalidPath> {
    normalize(path, PathNormalization::default())
}

#[test]
fn a_target_keeps_its_query_and_a_normal_one_is_none() {
    let uri: http::Uri = "/v1/./charges?expand=%2e".parse().unwrap();
    let normal = normalize_uri(&uri, PathNormalization::default())
        .unwrap()
        .unwrap();
    assert_eq!(normal, "/v1/charges?expand=%2e");
    let normal: http::Uri = "/v1/charges".parse().unwrap();
    assert_eq!(
        normalize_uri(&normal, PathNormalization::default()),
        Ok(None)
    );
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
        "/v1/a:b@c;d=e,f!$&'()*+",
        "/v1/%C3%A9",
        "/v1/charges/",
        "/v1/charges;jsessionid=x",
        "/v1/a%20b",
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
    for path in ["/", "/v1/charges", "/v1/orders/42/capture", "/v1/a:b@c"] {
        assert!(
            is_normal(path.as_bytes(), PathNormalization::default()),
            "{path}"
        );
    }
    // Without reject-ambiguous, escaped delimiters and parameters are normal too.
    for path in ["/v1/a%2Fb", "/v1/x;y=z"] {
        assert!(
            is_normal(path.as_bytes(), options("rfc3986,merge-slashes")),
            "{path}"
        );
    }
}

/// `reject-ambiguous` (on by default) refuses the spellings upstream frameworks read
/// each their own way, and lets their plain neighbours through.
#[test]
fn ambiguous_spellings_are_refused() {
    for (path, error) in [
        (
            "/v1%2Fcharges",
            InvalidPath::EncodedDelimiter {
                at: 3,
                delimiter: '/',
            },
        ),
        (
            "/v1/a%5cb",
            InvalidPath::EncodedDelimiter {
                at: 5,
                delimiter: '\\',
            },
        ),
        (
            "/v1/charges%3Bx",
            InvalidPath::EncodedDelimiter {
                at: 11,
                delimiter: ';',
            },
        ),
        ("/v1/charges%20", InvalidPath::PaddedSegment { at: 4 }),
        ("/v1/%20charges/x", InvalidPath::PaddedSegment { at: 4 }),
        ("/v1/ charges", InvalidPath::PaddedSegment { at: 4 }),
        (
            "/v1/x/..;/charges",
            InvalidPath::ParametersOnDotSegment { at: 6 },
        ),
        (
            "/v1/x/%2E;/charges",
            InvalidPath::ParametersOnDotSegment { at: 6 },
        ),
        (
            "/v1/charges/;x",
            InvalidPath::ParametersOnDotSegment { at: 12 },
        ),
        ("/;x", InvalidPath::ParametersOnDotSegment { at: 1 }),
        (
            "/v1/%EF%BD%83harges",
            InvalidPath::CompatibilityCharacter { character: 'ｃ' },
        ),
        (
            "/v1/ｃharges",
            InvalidPath::CompatibilityCharacter { character: 'ｃ' },
        ),
        (
            "/v1/%EF%AC%81le",
            InvalidPath::CompatibilityCharacter { character: 'ﬁ' },
        ),
        (
            "/v1/a%C2%A0b",
            InvalidPath::CompatibilityCharacter {
                character: '\u{a0}',
            },
        ),
        // A decomposed é, which NFKC composes.
        (
            "/v1/e%CC%81",
            InvalidPath::CompatibilityCharacter {
                character: '\u{301}',
            },
        ),
    ] {
        assert_eq!(norm(path), Err(error.clone()), "{path}");
        assert!(
            normalize(path, options("rfc3986,merge-slashes")).is_ok(),
            "{path} passes without reject-ambiguous"
        );
    }
    for path in [
        "/v1/a%20b",
        "/v1/charges;jsessionid=x",
        "/v1;a=b/charges",
        "/v1/%C3%A9",
        "/v1/%E6%97%A5",
        "/v1/a;b/..",
    ] {
        assert!(norm(path).is_ok(), "{path}: {:?}", norm(path));
    }
}

#[test]
fn escapes_of_reserved_characters_stay_and_are_upper_cased() {
    let keep = options("rfc3986,merge-slashes");
    assert_eq!(normalize("/v1/a%2fb", keep).unwrap(), "/v1/a%2Fb");
    assert_eq!(normalize("/v1/a%5cb", keep).unwrap(), "/v1/a%5Cb");
    assert_eq!(normalize("/v1/%2f%2f", keep).unwrap(), "/v1/%2F%2F");
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
        ("/../v1", InvalidPath::AboveRoot),
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
    let default = PathNormalization::default();
    assert_eq!(
        default.to_string(),
        "rfc3986,merge-slashes,reject-ambiguous"
    );
    let all = options("rfc3986,merge-slashes,trailing-slash,lowercase");
    assert!(all.trailing_slash && all.lowercase && !all.reject_ambiguous);
    assert!(options("none").is_none());
    assert!("none,lowercase".parse::<PathNormalization>().is_err());
    assert!(
        "merge-slashes,reject-ambiguous"
            .parse::<PathNormalization>()
            .is_err()
    );
    assert_eq!(
        options("rfc3986,merge-slashes,reject-ambiguous"),
        PathNormalization::default()
    );
    assert_eq!(
        options(" RFC3986 , merge-slashes,,Reject-Ambiguous"),
        PathNormalization::default()
    );
    assert!("reject-ambiguous".parse::<PathNormalization>().is_err());
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
    const PIECES: [&str; 35] = [
        "%3b",
        ";x",
        "%20",
        " ",
        "%EF%BD%83",
        "ｃ",
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
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(r, m, t, l, a)| PathNormalization {
            rfc3986: r,
            merge_slashes: m,
            trailing_slash: t,
            lowercase: l,
            reject_ambiguous: r && a,
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
