//! The canonical form of JSON bodies behind `Fingerprint::compute` (SPEC S4).

use idem_core::fuzzing::canonical_json;
use idem_core::{Fingerprint, FingerprintOptions};

use crate::input::first_line;

/// How much longer than its body a canonical form may be. Only numbers grow: `1e18`
/// (4 bytes) is written `1000000000000000000` (19).
const MAX_GROWTH: usize = 5;

/// `data` as a JSON body; when it starts with `/`, its first line is a JSON pointer to
/// ignore and the rest is the body.
///
/// # Panics
///
/// When the body is JSON here but not to serde_json or the other way round (beyond the
/// documented exceptions: numbers past a double's range, exponents of more than 12
/// digits, nesting past serde_json's 128 levels); when a body that is not JSON here is
/// fingerprinted where a pointer is ignored, rather than refused; when the canonical form is not its own canonical form or changes with
/// whitespace between its tokens, is more than
/// 5 times the body, or fingerprints differently from the body; when a
/// JSON media type's parameters or case change the fingerprint; when JSON and raw
/// bytes fingerprint alike; or when leaving a pointer out makes the form longer or not
/// canonical.
pub fn fingerprint_json(data: &[u8]) {
    let (pointer, body) = match data.first() {
        Some(b'/') => first_line(data),
        _ => (&[][..], data),
    };
    let plain = FingerprintOptions::default();
    let ignoring = std::str::from_utf8(pointer)
        .ok()
        .and_then(|p| plain.clone().ignore_pointer(p).ok());
    let fp = |content_type: &str, body: &[u8], options: &FingerprintOptions| {
        Fingerprint::compute(
            "POST",
            "POST /v1/charges",
            Some(content_type),
            body,
            options,
        )
    };

    let canonical = canonical_json(body, &plain);
    same_acceptance(body, canonical.is_some());
    let Some(canonical) = canonical else {
        // Not JSON: hashed as the bytes it is, whatever the media type says.
        assert_eq!(
            fp("application/json", body, &plain),
            fp("text/plain", body, &plain)
        );
        if let Some(options) = &ignoring {
            assert_eq!(canonical_json(body, options), None);
            // Where a field is left out, such a body is refused, not hashed as bytes.
            let checked = Fingerprint::compute_checked(
                "POST",
                "POST /v1/charges",
                Some("application/json"),
                body,
                options,
            );
            assert_eq!(checked.is_err(), !idem_core::is_blank(body));
        }
        return;
    };

    assert!(
        canonical.len() <= MAX_GROWTH * body.len(),
        "{} bytes canonical from {} bytes: {:?}",
        canonical.len(),
        body.len(),
        String::from_utf8_lossy(body)
    );
    assert_eq!(
        canonical_json(&canonical, &plain).as_ref(),
        Some(&canonical),
        "not a fixed point: {:?}",
        String::from_utf8_lossy(&canonical)
    );
    let spaced = spaced(&canonical);
    assert_eq!(
        canonical_json(&spaced, &plain).as_ref(),
        Some(&canonical),
        "whitespace changed {:?}",
        String::from_utf8_lossy(&spaced)
    );
    let fingerprint = fp("application/json", body, &plain);
    assert_eq!(fingerprint, fp("application/json", &canonical, &plain));
    assert_eq!(
        fingerprint,
        fp("Application/JSON; charset=utf-8", body, &plain)
    );
    assert_eq!(fingerprint, fp("application/problem+json", body, &plain));
    assert_ne!(fingerprint, fp("text/plain", body, &plain));

    if let Some(options) = &ignoring {
        let without = canonical_json(body, options).expect("still JSON with a pointer left out");
        assert!(without.len() <= canonical.len());
        assert_eq!(canonical_json(&without, &plain).as_ref(), Some(&without));
        assert_eq!(
            fp("application/json", body, options),
            fp("application/json", &canonical, options),
            "pointer {:?}",
            String::from_utf8_lossy(pointer)
        );
    }
}

/// `canonical` (which has no whitespace) with insignificant whitespace around every
/// token: what another client's serializer might send for the same value.
fn spaced(canonical: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(canonical.len() * 2 + 2);
    out.push(b'\n');
    let (mut in_string, mut escaped) = (false, false);
    for &b in canonical {
        if in_string {
            out.push(b);
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                out.push(b);
            }
            b'{' | b'[' | b',' | b':' | b'}' | b']' => out.extend_from_slice(&[b' ', b, b'\t']),
            _ => out.push(b),
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Asserts that `body` is JSON here (`accepted`) exactly when serde_json parses it,
/// except where the fingerprint's docs say they part.
fn same_acceptance(body: &[u8], accepted: bool) {
    let parsed = serde_json::from_slice::<serde_json::Value>(body);
    // serde_json refuses numbers beyond a double's range, which are canonical here.
    let out_of_range = parsed
        .as_ref()
        .is_err_and(|e| e.to_string().starts_with("number out of range"));
    // serde_json stops at 128 levels of nesting; idem reads up to 10000.
    let deep = parsed
        .as_ref()
        .is_err_and(|e| e.to_string().starts_with("recursion limit exceeded"));
    // An exponent of more significant digits than the canonical form takes leaves the
    // body raw, though serde_json reads it (as 0 or out of range).
    let huge_exponent = body
        .split(|b| matches!(b, b'e' | b'E'))
        .skip(1)
        .any(|rest| {
            let rest = rest
                .strip_prefix(b"-")
                .or(rest.strip_prefix(b"+"))
                .unwrap_or(rest);
            let digits = rest.iter().take_while(|b| b.is_ascii_digit());
            digits.skip_while(|&&b| b == b'0').count() > 12
        });
    if !out_of_range && !huge_exponent && !deep {
        assert_eq!(
            accepted,
            parsed.is_ok(),
            "serde_json says {:?} for {:?}",
            parsed.err(),
            String::from_utf8_lossy(body)
        );
    }
}
