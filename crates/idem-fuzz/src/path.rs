//! The gateway's `path::normalize`: the spelling of a request path (SPEC S14).

use idem_gateway::fuzzing::path::{PathNormalization, normalize};

/// The first byte picks the options (its four low bits: `rfc3986`, `merge-slashes`,
/// `trailing-slash`, `lowercase`); the rest, when it is UTF-8, is the path.
///
/// # Panics
///
/// When a normalised path is not normal itself (normalising is idempotent, and a second
/// pass borrows); when it does not start with `/`; when it keeps a `.` or `..` segment
/// under `rfc3986`, or `//` under `merge-slashes`; when, under `rfc3986`, it holds a byte
/// a URI path may not hold raw (a control character, a space, a backslash, non-ASCII);
/// when it is more than three times the input's length (each input byte becomes at most
/// one escape); or when no options return the path as it came.
pub fn path_normalize(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(path) = std::str::from_utf8(rest) else {
        return;
    };
    let names = ["rfc3986", "merge-slashes", "trailing-slash", "lowercase"];
    let items: Vec<&str> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| selector & (1 << i) != 0)
        .map(|(_, name)| *name)
        .collect();
    let options = if items.is_empty() {
        PathNormalization::NONE
    } else {
        PathNormalization::from_items(items).expect("known items")
    };
    let Ok(normal) = normalize(path, options) else {
        return;
    };
    if options.is_none() {
        assert_eq!(normal, path, "no options change nothing");
        return;
    }
    let again = normalize(&normal, options).expect("a normal path normalises");
    assert_eq!(again, normal, "normalising twice changed {path:?}");
    assert!(
        matches!(again, std::borrow::Cow::Borrowed(_)),
        "a normal path was rewritten: {normal:?}"
    );
    assert!(normal.starts_with('/'), "{path:?} became {normal:?}");
    assert!(
        normal.len() <= 3 * path.len().max(1),
        "{path:?} grew to {normal:?}"
    );
    // Only RFC 3986's normalisation encodes or refuses what a URI path may not hold;
    // merging slashes alone, or case, leaves the other bytes as they came (a request
    // line cannot carry them raw anyway).
    if options.rfc3986() {
        assert!(
            normal.bytes().all(|b| b.is_ascii_graphic() && b != b'\\'),
            "{path:?} became {normal:?}, which a URI path may not hold raw"
        );
    }
    if options.merge_slashes() {
        assert!(!normal.contains("//"), "{path:?} became {normal:?}");
    }
    if options.rfc3986() {
        assert!(
            !normal.split('/').any(|s| s == "." || s == ".."),
            "{path:?} kept a dot segment: {normal:?}"
        );
    }
}
