//! RFC 8785, the JSON Canonicalization Scheme (JCS): the canonical form some protocols
//! sign or hash JSON in ([`FingerprintOptions::jcs`](crate::FingerprintOptions::jcs)).
//!
//! The body is parsed as the default form parses it (`canonical.rs`); what differs is
//! how it is written: numbers as IEEE 754 doubles in ECMAScript's notation, members
//! sorted by their names' UTF-16 code units, strings with only the escapes JSON needs.

use std::borrow::Cow;

use crate::canonical::{Document, Node, parse};
use crate::json::unreadable::UnreadableJson;

/// Appends the JCS form of `body` to `out`, leaving out the values at the `ignored`
/// pointers. Returns the name repeated within an object, as
/// [`canonical::canonicalize`](crate::canonical::canonicalize) does, or why `body` is
/// not JSON idem reads or holds a number beyond a double's range (JCS has no spelling
/// for it), with `out` unchanged.
pub(crate) fn canonicalize(
    body: &[u8],
    ignored: &[Vec<String>],
    out: &mut Vec<u8>,
) -> Result<Option<String>, UnreadableJson> {
    let Document {
        mut root,
        duplicate,
    } = parse(body, ignored)?;
    let start = out.len();
    match write(body, &mut root, out) {
        Ok(()) => Ok(duplicate.map(Cow::into_owned)),
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Writes `root`, parsed from `body`, in JCS's form, with a stack of its own (the tree
/// may be [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH) deep).
fn write(body: &[u8], root: &mut Node<'_>, out: &mut Vec<u8>) -> Result<(), UnreadableJson> {
    /// What is left to write, last first.
    enum Step<'n, 'a> {
        Value(&'n mut Node<'a>),
        Member(&'n str, &'n mut Node<'a>),
        Byte(u8),
    }
    let mut todo = vec![Step::Value(root)];
    while let Some(step) = todo.pop() {
        let node = match step {
            Step::Byte(b) => {
                out.push(b);
                continue;
            }
            Step::Member(name, value) => {
                write_string(name, out);
                out.push(b':');
                value
            }
            Step::Value(value) => value,
        };
        match node {
            Node::Null => out.extend_from_slice(b"null"),
            Node::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Node::Number(text) => {
                // The text is checked against JSON's grammar; Rust's parse rounds it to
                // the nearest double, as ECMAScript's does.
                let Some(value) = std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.parse::<f64>().ok())
                    .filter(|v| v.is_finite())
                else {
                    // The text lies in the body: its offset is how far in it starts.
                    let at = (text.as_ptr() as usize).saturating_sub(body.as_ptr() as usize);
                    return Err(UnreadableJson::BeyondDouble { at });
                };
                write_number(value, out);
            }
            Node::String(s) => write_string(s, out),
            Node::Array(items) => {
                out.push(b'[');
                todo.push(Step::Byte(b']'));
                for (i, item) in items.iter_mut().enumerate().rev() {
                    todo.push(Step::Value(item));
                    if i > 0 {
                        todo.push(Step::Byte(b','));
                    }
                }
            }
            Node::Object(entries) => {
                // By UTF-16 code units (RFC 8785 §3.2.3); stable, so repeated names
                // (which I-JSON forbids) keep the body's order.
                entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                out.push(b'{');
                todo.push(Step::Byte(b'}'));
                for (i, (k, v)) in entries.iter_mut().enumerate().rev() {
                    todo.push(Step::Member(k, v));
                    if i > 0 {
                        todo.push(Step::Byte(b','));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A string as ECMAScript's `JSON.stringify` writes it (RFC 8785 §3.2.2.2): `"` and `\`
/// escaped, the controls below U+0020 as `\b`, `\t`, `\n`, `\f`, `\r` or `\u00xx`
/// (lower-case hex), everything else as its UTF-8.
fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// A finite double as ECMAScript's `Number.prototype.toString` writes it (RFC 8785
/// §3.2.2.3): the shortest digits that read back as the same double, in plain notation
/// from 1e-6 up to 1e21 and in exponent notation (`1e+21`, `1.5e-7`) outside it; `-0`
/// as `0`.
fn write_number(value: f64, out: &mut Vec<u8>) {
    if value == 0.0 {
        out.push(b'0');
        return;
    }
    if value < 0.0 {
        out.push(b'-');
    }
    // `{:e}` writes the shortest round-tripping digits: `d[.ddd]e<exp>`.
    let sci = format!("{:e}", value.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // The value is 0.digits × 10^n.
    let n = exp.parse::<i64>().expect("{:e} writes an integer exponent") + 1;
    let digits = even_of_a_tie(value.abs(), digits, n);
    let k = digits.len() as i64;
    let text = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        format!("{int}.{frac}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let sign = if n - 1 < 0 { '-' } else { '+' };
        let e = (n - 1).abs();
        match digits.split_at(1) {
            (d, "") => format!("{d}e{sign}{e}"),
            (d, rest) => format!("{d}.{rest}e{sign}{e}"),
        }
    };
    out.extend_from_slice(text.as_bytes());
}

/// ECMAScript's choice where two shortest spellings are equally close to the value
/// (it lies exactly halfway between them): the one whose last digit is even. Rust's
/// shortest spelling may be the other. `digits` is `0.digits × 10^n`.
fn even_of_a_tie(value: f64, digits: String, n: i64) -> String {
    let last = digits.as_bytes()[digits.len() - 1];
    if (last - b'0').is_multiple_of(2) {
        return digits;
    }
    let head = &digits[..digits.len() - 1];
    for other in [last - 1, last + 1] {
        if !other.is_ascii_digit() {
            continue;
        }
        let candidate = format!("{head}{}", other as char);
        if format!("0.{candidate}e{n}").parse::<f64>() != Ok(value) {
            continue;
        }
        // Halfway exactly: the value's exact decimal expansion (a double's has at most
        // 767 significant digits) is the lower of the two followed by a 5.
        let low = last.min(other) as char;
        let exact = format!("{value:.800e}");
        let (mantissa, exp) = exact.split_once('e').expect("{:e} writes an exponent");
        let expansion: String = mantissa.chars().filter(|c| *c != '.').collect();
        let halfway = exp.parse::<i64>() == Ok(n - 1)
            && expansion.trim_end_matches('0') == format!("{head}{low}5");
        if halfway {
            return candidate;
        }
    }
    digits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jcs(body: &str) -> String {
        let mut out = Vec::new();
        assert!(
            canonicalize(body.as_bytes(), &[], &mut out).is_ok(),
            "{body}"
        );
        String::from_utf8(out).unwrap()
    }

    fn number(bits: u64) -> String {
        let mut out = Vec::new();
        write_number(f64::from_bits(bits), &mut out);
        String::from_utf8(out).unwrap()
    }

    /// RFC 8785 Appendix B: IEEE 754 doubles and their canonical spellings.
    #[test]
    fn numbers_are_written_as_the_rfcs_appendix_b_writes_them() {
        let vectors: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, want) in vectors {
            assert_eq!(number(bits), want, "{bits:#018x}");
        }
    }

    /// RFC 8785 §3.2.2: the example input and its canonical form.
    #[test]
    fn the_rfcs_example_is_canonicalised_as_it_says() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        assert_eq!(
            jcs(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    /// RFC 8785 §3.2.3: members sorted by UTF-16 code units, so an emoji (a surrogate
    /// pair from U+D83D) sorts before U+FB33, where UTF-8 byte order puts it after.
    #[test]
    fn members_sort_by_utf16_code_units() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let want = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
                    \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
                    \"\u{1f600}\":\"Emoji: Grinning Face\",\
                    \"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(jcs(input), want);
    }

    #[test]
    fn numbers_beyond_a_double_are_no_jcs_and_the_output_is_left_as_it_was() {
        let mut out = b"kept".to_vec();
        assert_eq!(
            canonicalize(b"[1, 1e400]", &[], &mut out),
            Err(UnreadableJson::BeyondDouble { at: 4 })
        );
        assert_eq!(out, b"kept");
        assert_eq!(
            canonicalize(b"not json", &[], &mut out),
            Err(UnreadableJson::Syntax { at: 0 })
        );
    }

    #[test]
    fn ignored_pointers_are_left_out() {
        let mut out = Vec::new();
        let ignored = vec![vec!["sent_at".to_owned()]];
        assert!(canonicalize(br#"{"b":1,"sent_at":"x","a":2}"#, &ignored, &mut out).is_ok());
        assert_eq!(out, br#"{"a":2,"b":1}"#);
    }

    #[test]
    fn jcs_compares_json_as_rfc_8785_writes_it() {
        let jcs = crate::FingerprintOptions::default().jcs();
        let plain = crate::FingerprintOptions::default();
        let fp = |body: &str, opts: &crate::FingerprintOptions| {
            crate::Fingerprint::compute(
                "POST",
                "POST /x",
                Some("application/json"),
                body.as_bytes(),
                opts,
            )
        };
        // Reordered, respaced, respelled numbers: one request under JCS.
        assert_eq!(
            fp(r#"{"b": 4.50, "a": 1E30}"#, &jcs),
            fp(r#"{"a":1e+30,"b":4.5}"#, &jcs)
        );
        // JCS reads numbers as doubles: digits past a double's precision do not count,
        // where the default form keeps every digit.
        let (a, b) = (r#"{"n": 0.1}"#, r#"{"n": 0.10000000000000000001}"#);
        assert_eq!(fp(a, &jcs), fp(b, &jcs));
        assert_ne!(fp(a, &plain), fp(b, &plain));
        // Different values stay different, and JCS is its own comparison.
        assert_ne!(fp(r#"{"n": 1}"#, &jcs), fp(r#"{"n": 2}"#, &jcs));
        assert_ne!(fp(r#"{"n": 1}"#, &jcs), fp(r#"{"n": 1}"#, &plain));
        assert!(jcs.is_jcs() && !plain.is_jcs());
    }
}
