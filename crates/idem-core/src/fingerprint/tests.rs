//! Tests of the fingerprint: what makes two requests one, and that the fingerprints
//! stores already hold keep matching.

use super::*;
use crate::MAX_JSON_DEPTH;
use proptest::prelude::{Just, Strategy, any, prop_oneof};
use serde_json::Value;
use std::io::Write as _;

// The reference: a `serde_json::Value` written with sorted keys, which is what the
// fingerprints that stores already hold were computed from. The bodies whose canonical
// bytes must not change are checked against it.
fn remove_pointer(value: &mut Value, pointer: &[String]) {
    let Some((last, parents)) = pointer.split_last() else {
        return;
    };
    let mut cur = value;
    for token in parents {
        cur = match cur {
            Value::Object(map) => match map.get_mut(token) {
                Some(v) => v,
                None => return,
            },
            Value::Array(items) => {
                match token.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(v) => v,
                    None => return,
                }
            }
            _ => return,
        };
    }
    match cur {
        Value::Object(map) => {
            map.remove(last);
        }
        Value::Array(items) => {
            if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < items.len()) {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// Writes `value` with object keys sorted by their UTF-8 bytes and no whitespace. Keys
/// are sorted here rather than relying on `serde_json::Map`'s order, which another crate
/// in the build may switch to insertion order.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_string(s, out),
        Value::Number(n) => {
            // One spelling per value: 1, 1.0 and 1e0 all become the same bytes. Written
            // in place (`Display` into the buffer), not through a `String` each.
            match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => write!(out, "{u}"),
                (None, Some(i), _) => write!(out, "{i}"),
                (None, None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e19 => {
                    write!(out, "{f:.0}")
                }
                (None, None, Some(f)) => write!(out, "{f:e}"),
                _ => write!(out, "{n}"),
            }
            .expect("writing to a Vec")
        }
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Null => out.extend_from_slice(b"null"),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is canonical (one spelling per string), and its
    // writer appends to the buffer without a `String` of its own.
    serde_json::to_writer(&mut *out, s).expect("a string always serialises");
}

fn reference(body: &[u8], ignored: &[Vec<String>]) -> Option<Vec<u8>> {
    let mut value = serde_json::from_slice::<Value>(body).ok()?;
    for pointer in ignored {
        remove_pointer(&mut value, pointer);
    }
    let mut out = Vec::new();
    write_canonical(&value, &mut out);
    Some(out)
}

fn canonical(body: &[u8], ignored: &[Vec<String>]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    crate::canonical::canonicalize(body, ignored, &mut out)
        .ok()
        .map(|_| out)
}

/// JSON values whose numbers a double holds exactly and whose objects never repeat
/// a key: the bodies whose canonical bytes must be what they always were.
fn exact_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Only the doubles whose `Value` spelling kept the value of serde_json's
        // text for them: a `Value` writes the double it read, and serde_json's default
        // parser misreads about one in ten 17-digit doubles by a unit in the last
        // place; an integral double from 2^53 to 10^19 was written as its binary
        // value; and where two 17-digit texts name one double, Rust's `{:e}` may
        // pick the other. Those bodies' fingerprints differ from the reference's, on purpose;
        // `canonical`'s own tests pin the new spelling of numbers.
        any::<f64>().prop_filter_map("the Value spelling kept the value", |f| {
            let n = serde_json::Number::from_f64(f)?;
            let text = n.to_string();
            (reference(text.as_bytes(), &[]) == canonical(text.as_bytes(), &[]))
                .then_some(Value::Number(n))
        }),
        (-1e6f64..1e6).prop_map(|f| Value::from((f * 100.0).round() / 100.0)),
        any::<String>().prop_map(Value::String),
        "[a-z\\\"/\u{0}-\u{1f}\u{7f}\u{e9}\u{1f600}]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("[a-c]{1,2}|[\\u{0}-\\u{10ffff}]{0,3}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `value` as JSON text, spelled in one of several equivalent ways chosen by
/// `seed`: whitespace, `\u` escapes (surrogate pairs past the BMP), and integers a
/// double holds exactly written with a fraction or an exponent.
fn spell(value: &Value, seed: &mut u64, out: &mut Vec<u8>) {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    for _ in 0..next() % 3 {
        out.push([b' ', b'\n', b'\t', b'\r'][(next() % 4) as usize]);
    }
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                spell(item, seed, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                spell(&Value::String(k.clone()), seed, out);
                out.push(b':');
                spell(v, seed, out);
            }
            out.push(b'}');
        }
        Value::String(s) => {
            out.push(b'"');
            for c in s.chars() {
                if next() % 4 == 0 {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        write!(out, "\\u{unit:04X}").unwrap();
                    }
                } else {
                    let escaped = serde_json::to_string(&c.to_string()).unwrap();
                    out.extend_from_slice(&escaped.as_bytes()[1..escaped.len() - 1]);
                }
            }
            out.push(b'"');
        }
        Value::Number(n) => match n.as_i64().filter(|i| i.unsigned_abs() < 1 << 53) {
            // Small enough that serde_json reads the scaled digits exactly; past
            // 2^53 of them it may not ("-77947587844713.000" came back as a
            // fraction, which the reference writes).
            Some(i) if i.unsigned_abs() < 1 << 43 && next() % 2 == 0 => {
                write!(out, "{i}.000").unwrap()
            }
            Some(i) if i.unsigned_abs() < 1 << 46 && next() % 2 == 0 => {
                write!(out, "{}e-2", i * 100).unwrap()
            }
            _ => serde_json::to_writer(&mut *out, n).unwrap(),
        },
        other => serde_json::to_writer(&mut *out, other).unwrap(),
    }
}

fn same_acceptance(body: &[u8]) -> Result<(), proptest::test_runner::TestCaseError> {
    let parsed = serde_json::from_slice::<Value>(body);
    let out_of_range = parsed
        .as_ref()
        .is_err_and(|e| e.to_string().starts_with("number out of range"));
    // serde_json stops at 128 levels of nesting; idem reads up to 10000.
    let deep = parsed
        .as_ref()
        .is_err_and(|e| e.to_string().starts_with("recursion limit exceeded"));
    // An exponent of more significant digits than `canonical` takes leaves the body
    // raw, though serde_json reads it (as 0 or out of range).
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
        proptest::prop_assert_eq!(
            canonical(body, &[]).is_some(),
            parsed.is_ok(),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

    /// Upgrades keep fingerprints: wherever the `Value`-based reference is exact,
    /// the canonical bytes are the same, ignored pointers included.
    #[test]
    fn canonical_bytes_are_what_they_were(value in exact_json(), seed in any::<u64>()) {
        let mut body = Vec::new();
        spell(&value, &mut (seed | 1), &mut body);
        let ignored = [vec!["a".to_owned()], vec!["b".to_owned(), "0".to_owned()],
            vec!["1".to_owned(), "c".to_owned()]];
        for ignored in [&ignored[..0], &ignored[..]] {
            let want = reference(&body, ignored);
            proptest::prop_assert!(want.is_some(), "{}", String::from_utf8_lossy(&body));
            proptest::prop_assert_eq!(canonical(&body, ignored), want,
                "{}", String::from_utf8_lossy(&body));
        }
    }

    /// Whatever the bytes, a body is JSON here exactly when serde_json parses it,
    /// except for numbers beyond a double's range, which serde_json refuses.
    #[test]
    fn json_is_what_serde_json_accepts(value in exact_json(), seed in any::<u64>(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0..3u8), 1..4))
    {
        let mut body = Vec::new();
        spell(&value, &mut (seed | 1), &mut body);
        for (at, byte, how) in edits {
            let at = at % (body.len() + 1);
            match how {
                0 => body.insert(at, byte),
                1 if at < body.len() => { body.remove(at); }
                _ if at < body.len() => body[at] = byte,
                _ => {}
            }
        }
        same_acceptance(&body)?;
    }

    #[test]
    fn arbitrary_bytes_are_json_when_serde_json_says(
        body in proptest::collection::vec(
            proptest::prop_oneof![any::<u8>(), proptest::sample::select(b"{}[]\",:\\ 0123456789.eE+-tfnu".to_vec())],
            0..64,
        )
    ) {
        same_acceptance(&body)?;
    }
}

fn fp(ct: Option<&str>, body: &[u8], opts: &FingerprintOptions) -> Fingerprint {
    Fingerprint::compute("POST", "POST /v1/charges", ct, body, opts)
}

const JSON: Option<&str> = Some("application/json; charset=utf-8");

#[test]
fn reordered_keys_and_whitespace_match() {
    let o = FingerprintOptions::default();
    assert_eq!(
        fp(JSON, br#"{"a":1,"b":{"y":[1,2],"x":null}}"#, &o),
        fp(
            JSON,
            b"{ \"b\" : {\"x\":null, \"y\":[1, 2]},\n\"a\":1 }",
            &o
        )
    );
}

#[test]
fn number_spellings_match_but_values_differ() {
    let o = FingerprintOptions::default();
    assert_eq!(fp(JSON, br#"{"a":1}"#, &o), fp(JSON, br#"{"a":1.0}"#, &o));
    assert_eq!(fp(JSON, br#"{"a":100}"#, &o), fp(JSON, br#"{"a":1e2}"#, &o));
    assert_ne!(fp(JSON, br#"{"a":100}"#, &o), fp(JSON, br#"{"a":101}"#, &o));
    assert_ne!(fp(JSON, br#"{"a":"1"}"#, &o), fp(JSON, br#"{"a":1}"#, &o));
}

#[test]
fn changed_amount_differs() {
    let o = FingerprintOptions::default();
    assert_ne!(
        fp(JSON, br#"{"amount":100}"#, &o),
        fp(JSON, br#"{"amount":1000}"#, &o)
    );
}

#[test]
fn non_json_is_raw_bytes() {
    let o = FingerprintOptions::default();
    assert_ne!(
        fp(Some("text/plain"), b"a=1&b=2", &o),
        fp(Some("text/plain"), b"b=2&a=1", &o)
    );
    // JSON content under another media type is not normalised.
    assert_ne!(
        fp(Some("text/plain"), br#"{"a":1}"#, &o),
        fp(Some("text/plain"), br#"{ "a":1}"#, &o)
    );
    // Unparseable JSON falls back to bytes rather than failing.
    assert_ne!(fp(JSON, b"{bad", &o), fp(JSON, b"{bad ", &o));
}

/// Issue 61: where the options read a body's fields (an ignored pointer, JCS), a JSON
/// body idem cannot read was hashed as its bytes, with nothing left out; now it is
/// refused. Options that read no field still hash it as bytes.
#[test]
fn unreadable_json_is_refused_where_the_options_read_its_fields() {
    let plain = FingerprintOptions::default();
    let ignoring = plain.clone().ignore_pointer("/sent_at").unwrap();
    let jcs = plain.clone().jcs();
    let check = |body: &[u8], o: &FingerprintOptions| {
        Fingerprint::compute_checked("POST", "POST /v1/charges", JSON, body, o)
    };
    let deep = "[".repeat(MAX_JSON_DEPTH + 1) + &"]".repeat(MAX_JSON_DEPTH + 1);
    let cases: [(&[u8], UnreadableJson); 5] = [
        (
            br#"{"sent_at": 1, "a": "\ud800"}"#,
            UnreadableJson::LoneSurrogate { at: 21 },
        ),
        (
            b"{\"sent_at\": 1, \"a\": \"\xff\"}",
            UnreadableJson::InvalidUtf8 { at: 21 },
        ),
        (
            deep.as_bytes(),
            UnreadableJson::TooDeep { at: MAX_JSON_DEPTH },
        ),
        (
            b"{\"a\": 1e99999999999999}",
            UnreadableJson::LongExponent { at: 6 },
        ),
        (b"{\"a\": 1", UnreadableJson::Syntax { at: 7 }),
    ];
    for (body, why) in cases {
        for o in [&ignoring, &jcs] {
            assert!(o.reads_fields());
            assert_eq!(check(body, o), Err(RefusedJson::Unreadable(why)));
            // `compute`, which cannot refuse, hashes the bytes.
            assert_eq!(fp(JSON, body, o), fp(Some("text/plain"), body, o));
        }
        assert!(!plain.reads_fields());
        assert_eq!(
            check(body, &plain),
            Ok(fp(Some("text/plain"), body, &plain))
        );
        // Not read as JSON by its media type: nothing is meant to apply.
        assert!(Fingerprint::compute_checked("POST", "POST /x", None, body, &ignoring).is_ok());
    }
    // JCS has no form for a number beyond a double's range; the default form does.
    let huge = br#"{"a": 1e400}"#;
    let why = UnreadableJson::BeyondDouble { at: 6 };
    assert_eq!(check(huge, &jcs), Err(RefusedJson::Unreadable(why)));
    assert!(check(huge, &ignoring).is_ok());
    // A blank body has no field to leave out: its bytes, everywhere.
    for blank in [&b""[..], b" \n"] {
        for o in [&plain, &ignoring, &jcs] {
            assert_eq!(check(blank, o), Ok(fp(Some("text/plain"), blank, o)));
        }
    }
    // Up to the limit, nesting is read: respaced, it is the same request.
    let nested = "[".repeat(MAX_JSON_DEPTH) + &"]".repeat(MAX_JSON_DEPTH);
    let spaced = nested.replace("[]", "[ ]");
    assert_eq!(
        check(nested.as_bytes(), &ignoring),
        check(spaced.as_bytes(), &ignoring)
    );
    assert_ne!(
        fp(JSON, nested.as_bytes(), &plain),
        fp(None, nested.as_bytes(), &plain)
    );
}

#[test]
fn method_and_endpoint_are_part_of_it() {
    let o = FingerprintOptions::default();
    let a = Fingerprint::compute("POST", "POST /a", JSON, b"{}", &o);
    let b = Fingerprint::compute("POST", "POST /b", JSON, b"{}", &o);
    let c = Fingerprint::compute("PATCH", "POST /a", JSON, b"{}", &o);
    assert_ne!(a, b);
    assert_ne!(a, c);
}

#[test]
fn ignored_pointers_are_left_out() {
    let o = FingerprintOptions::default()
        .ignore_pointer("/client_sent_at")
        .unwrap()
        .ignore_pointer("/meta/trace~1id")
        .unwrap()
        .ignore_pointer("/items/0/nonce")
        .unwrap();
    assert_eq!(
        fp(
            JSON,
            br#"{"amount":1,"client_sent_at":"t1","meta":{"trace/id":"x","k":1},"items":[{"nonce":1,"v":2}]}"#,
            &o
        ),
        fp(
            JSON,
            br#"{"amount":1,"client_sent_at":"t2","meta":{"trace/id":"y","k":1},"items":[{"nonce":9,"v":2}]}"#,
            &o
        )
    );
    assert_ne!(
        fp(JSON, br#"{"amount":1,"client_sent_at":"t"}"#, &o),
        fp(JSON, br#"{"amount":2,"client_sent_at":"t"}"#, &o)
    );
}

#[test]
fn bad_pointers_are_rejected() {
    let o = FingerprintOptions::default();
    assert!(o.clone().ignore_pointer("").is_err());
    assert!(o.clone().ignore_pointer("a").is_err());
    assert!(o.ignore_pointer("/a~2").is_err());
}

#[test]
fn vendor_json_types_are_normalised() {
    let o = FingerprintOptions::default();
    let ct = Some("application/vnd.api+json");
    assert_eq!(
        fp(ct, br#"{"a":1,"b":2}"#, &o),
        fp(ct, br#"{"b":2,"a":1}"#, &o)
    );
}

/// Stored fingerprints must not change between releases: a retry after an upgrade
/// would meet its own record as a different request (422). These digests are
/// what idem has computed for these inputs from the start; a change to the canonical
/// form breaks them.
#[test]
fn digests_are_stable_across_releases() {
    let o = FingerprintOptions::default();
    let cases: [(Option<&str>, &[u8], &str); 7] = [
        (
            JSON,
            br#"{"amount":100,"currency":"eur","customer":"cus_123"}"#,
            "d29063679644c90bd31f8c9f3cd6b6451c6c1a011db8d726689eda00c87d3e52",
        ),
        (
            JSON,
            br#"{"z":[1,-2,3.5,1e2,-0.25e-3,18446744073709551615,-9223372036854775808],"a":{"y":null,"x":[true,false]}}"#,
            "85e7338ccb8a7d6e978255da0efd90ef23f12f22624c76f5e6d50a9e37d29f52",
        ),
        (
            JSON,
            "{\"s\":\"q\\\"b\\\\s\\/ \\u0001\\t\\n é \\ud83d\\ude00 \\u00e9\"}".as_bytes(),
            "9ccb817ee8080224fffd4596d2ba616b259d1c801e9ef3051b560fbccd821082",
        ),
        (
            JSON,
            br#"[1e300,2.5e-300,1e19,0.1]"#,
            "14b908f47fee26dabc272e11418b4e5976fff5bd38bf900edea15b297faf5a8d",
        ),
        (
            JSON,
            br#""just a string""#,
            "deda447e42ced7f4c92c9c5230674b1056f1239e241af6f5ee419b494ad48561",
        ),
        (
            Some("text/plain"),
            b"amount=100&currency=eur",
            "c9308a41cf7f7eb419cc3962d8871ddc67600c9dc2f3e3006a14ed51cf4ec118",
        ),
        (
            JSON,
            b"{not json",
            "121988106f150b4b10bbb857df33f96a6400c8d8e76b1f3c9bd48fc6a34d1b53",
        ),
    ];
    for (ct, body, want) in cases {
        assert_eq!(
            fp(ct, body, &o).to_hex(),
            want,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

/// The two kinds of body whose fingerprints differ from the reference's, because
/// numbers keep every digit and repeated keys every entry: by the reference, these match
/// `[…,1.2345678901234568e29,…]` and `{"dup":2}` (digests `e8a896c7…` and
/// `4ea8822d…`), and with them other requests. The digests are SHA-256 over the
/// framing above and the canonical bytes in the comments, computed apart from this
/// code.
#[test]
fn digests_that_changed_on_purpose() {
    let o = FingerprintOptions::default();
    // [1e300,2.5e-300,1e19,1.2345678901234567890123456789e29,1e-1]
    assert_eq!(
        fp(
            JSON,
            br#"[1e300,2.5e-300,1e19,123456789012345678901234567890,0.1]"#,
            &o
        )
        .to_hex(),
        "58d316b3e1b95f7ad1acc1b59966fb0d2373ab7c73b867013517f60554b43d84"
    );
    // {"dup":1,"dup":2}
    assert_eq!(
        fp(JSON, br#"{"dup":1,"dup":2}"#, &o).to_hex(),
        "9f4d57d5751e1fec4f464fb7b115a0299d24629067f1672fef79663aae8a7383"
    );
}

#[test]
fn numbers_differing_past_a_double_differ() {
    let o = FingerprintOptions::default();
    for (a, b) in [
        ("12345678901234567890123", "12345678901234567890124"),
        ("0.1", "0.10000000000000000001"),
        ("9007199254740992.0", "9007199254740993.0"),
        ("-9223372036854775809", "-9223372036854775808"),
        ("1e-400", "0"),
        ("394301.33835633675", "394301.3383563367"),
    ] {
        let body = |n: &str| format!(r#"{{"amount":{n}}}"#);
        assert_ne!(
            fp(JSON, body(a).as_bytes(), &o),
            fp(JSON, body(b).as_bytes(), &o),
            "{a} vs {b}"
        );
    }
    for (a, b) in [
        (
            "123456789012345678901234567890",
            "1.2345678901234567890123456789e29",
        ),
        ("1", "10e-1"),
        ("0.5", "5E-1"),
    ] {
        assert_eq!(
            fp(JSON, a.as_bytes(), &o),
            fp(JSON, b.as_bytes(), &o),
            "{a} vs {b}"
        );
    }
}

#[test]
fn repeated_keys_are_not_collapsed() {
    let o = FingerprintOptions::default();
    let a = fp(JSON, br#"{"amount":100,"amount":1}"#, &o);
    assert_ne!(a, fp(JSON, br#"{"amount":1}"#, &o));
    assert_ne!(a, fp(JSON, br#"{"amount":1,"amount":100}"#, &o));
    assert_eq!(a, fp(JSON, br#"{ "amount":100, "amount":1 }"#, &o));
}

fn form(boundary: &str, preamble: &str, file: &str) -> (String, Vec<u8>) {
    let ct = format!("multipart/form-data; boundary={boundary}");
    let body = format!(
        "{preamble}--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n\
         dispute\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; \
         filename=\"inv.txt\"\r\nContent-Type: text/plain\r\n\r\n{file}\r\n--{boundary}--\r\n"
    );
    (ct, body.into_bytes())
}

#[test]
fn multipart_bodies_match_whatever_their_boundary() {
    let o = FingerprintOptions::default();
    let f = |(ct, body): (String, Vec<u8>)| fp(Some(&ct), &body, &o);
    let first = f(form(
        "------------------------d74496d66958873e",
        "",
        "invoice",
    ));
    // curl and requests pick a new boundary for every attempt; a preamble is ignored.
    assert_eq!(first, f(form("2f7a1c0e9b8d4a6f", "", "invoice")));
    assert_eq!(first, f(form("x", "ignored\r\n", "invoice")));
    // A change to any part's content or headers is a different request.
    assert_ne!(first, f(form("x", "", "invoice!")));
    let (ct, body) = form("x", "", "invoice");
    let renamed = String::from_utf8(body)
        .unwrap()
        .replace("inv.txt", "inv2.txt");
    assert_ne!(first, fp(Some(&ct), renamed.as_bytes(), &o));
    // Another multipart subtype is another request.
    let mixed = ct.replace("form-data", "mixed");
    assert_ne!(first, fp(Some(&mixed), &form("x", "", "invoice").1, &o));
    // Without a usable boundary the bytes are hashed as they are.
    let (_, body) = form("x", "", "invoice");
    assert_ne!(
        fp(Some("multipart/form-data"), &body, &o),
        fp(Some("multipart/form-data; boundary=x"), &body, &o)
    );
    assert_eq!(
        fp(Some("multipart/form-data"), &body, &o),
        fp(Some("application/octet-stream"), &body, &o)
    );
}

/// The multipart form's digest, computed apart from this code: SHA-256 over the
/// method and endpoint framing, `multipart`, then each of `multipart/form-data`,
/// part 1's headers and content, part 2's headers and content, every one after its
/// length as a big-endian `u64`.
#[test]
fn multipart_digest_is_stable() {
    let o = FingerprintOptions::default();
    let (ct, body) = form("b", "", "invoice");
    assert_eq!(
        fp(Some(&ct), &body, &o).to_hex(),
        "da809e9f4f9617a869c9eeb4b78258eb45d965a080bd38d3bb61d490c7e22dc4"
    );
}
