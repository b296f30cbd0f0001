use super::*;

fn canonical(body: &str) -> Option<String> {
    let mut out = Vec::new();
    canonicalize(body.as_bytes(), &[], &mut out)
        .ok()
        .map(|_| String::from_utf8(out).unwrap())
}

#[test]
fn numbers_are_spelled_by_exact_value() {
    let cases = [
        ("0", "0"),
        ("-0", "-0"),
        ("0.000", "0"),
        ("-0e10", "-0"),
        ("1", "1"),
        ("1.0", "1"),
        ("1e0", "1"),
        ("10e-1", "1"),
        ("0.1e1", "1"),
        ("1E+2", "100"),
        ("100.00", "100"),
        ("1.5", "1.5e0"),
        ("15e-1", "1.5e0"),
        ("-0.25e-3", "-2.5e-4"),
        ("0.1", "1e-1"),
        ("1e19", "1e19"),
        ("9999999999999999999", "9999999999999999999"),
        ("10000000000000000000", "10000000000000000000"),
        ("18446744073709551615", "18446744073709551615"),
        ("18446744073709551616", "1.8446744073709551616e19"),
        ("-9223372036854775808", "-9223372036854775808"),
        ("-10000000000000000000", "-1e19"),
        ("9007199254740993.0", "9007199254740993"),
        (
            "123456789012345678901234567890",
            "1.2345678901234567890123456789e29",
        ),
        ("0.10000000000000000001", "1.0000000000000000001e-1"),
        ("1e400", "1e400"),
        ("-1e-400", "-1e-400"),
        ("1e000000000000000000002", "100"),
    ];
    for (text, want) in cases {
        assert_eq!(canonical(text).as_deref(), Some(want), "{text}");
    }
}

#[test]
fn strings_are_decoded_then_escaped_one_way() {
    assert_eq!(
        canonical(r#"["\u0041\/\ud83d\ude00", "é\u00e9", "\u001f\t"]"#).as_deref(),
        Some("[\"A/\u{1f600}\",\"éé\",\"\\u001f\\t\"]")
    );
}

#[test]
fn repeated_keys_are_kept_in_their_order() {
    assert_eq!(
        canonical(r#"{"b":0,"a":2,"a":1}"#).as_deref(),
        Some(r#"{"a":2,"a":1,"b":0}"#)
    );
    let mut out = Vec::new();
    let ignored = [vec!["a".to_owned()], vec!["c".to_owned(), "x".to_owned()]];
    let body = br#"{"a":1,"c":{"x":1,"y":2},"a":2,"c":{"x":3}}"#;
    assert_eq!(
        canonicalize(body, &ignored, &mut out),
        Ok(Some("a".to_owned()))
    );
    assert_eq!(out, br#"{"c":{"y":2},"c":{}}"#);
}

#[test]
fn a_name_repeated_in_one_object_is_found_after_unescaping() {
    let duplicate = |body: &str| {
        let mut out = Vec::new();
        canonicalize(body.as_bytes(), &[], &mut out).expect(body)
    };
    assert_eq!(
        duplicate(r#"{"amount":100,"amount":1}"#).as_deref(),
        Some("amount")
    );
    assert_eq!(duplicate(r#"{"a":1,"\u0061":2}"#).as_deref(), Some("a"));
    assert_eq!(
        duplicate(r#"{"x":[{"k":{"b":1,"c":2,"b":3}}]}"#).as_deref(),
        Some("b")
    );
    // The same name in different objects is no repetition.
    assert_eq!(duplicate(r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#), None);
    assert_eq!(duplicate(r#"{"a":1,"A":2,"a ":3}"#), None);
    // An ignored pointer does not hide it: the upstream still reads the body.
    let mut out = Vec::new();
    let ignored = [vec!["sent_at".to_owned()]];
    let found = canonicalize(br#"{"sent_at":1,"sent_at":2}"#, &ignored, &mut out);
    assert_eq!(found, Ok(Some("sent_at".to_owned())));
}

#[test]
fn what_is_not_json_is_refused() {
    for body in [
        "",
        " ",
        "{",
        "[1,]",
        "[1 2]",
        "{\"a\"}",
        "{\"a\":1,}",
        "{1:2}",
        "01",
        "1.",
        ".5",
        "+1",
        "1e",
        "1e+",
        "-",
        "nul",
        "tru",
        "\"abc",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\u0041\"",
        "\"\u{1f}\"",
        "1 2",
        "\u{feff}1",
        "[1]]",
        "NaN",
        "Infinity",
    ] {
        assert_eq!(canonical(body), None, "{body:?}");
    }
    let mut out = Vec::new();
    assert!(canonicalize(b"\"\xff\"", &[], &mut out).is_err());
    assert!(out.is_empty(), "nothing is written for a refused body");
}

#[test]
fn exponents_past_twelve_digits_are_refused() {
    assert_eq!(canonical("1e9999999999999"), None);
    assert_eq!(canonical("[1e-0000000000009999999999999]"), None);
    assert_eq!(
        canonical("1e999999999999").as_deref(),
        Some("1e999999999999")
    );
    let mut out = Vec::new();
    assert_eq!(
        canonicalize(b"[0, -1e9999999999999]", &[], &mut out),
        Err(UnreadableJson::LongExponent { at: 4 })
    );
}

/// Why a body is refused, and where: what the layer's 400 says.
#[test]
fn a_refusal_says_why_and_at_which_byte() {
    let why = |body: &[u8]| parse(body, &[]).map(|_| ()).unwrap_err();
    assert_eq!(why(br#"{"a": 1,}"#), UnreadableJson::Syntax { at: 8 });
    assert_eq!(why(b"[1] x"), UnreadableJson::Syntax { at: 4 });
    assert_eq!(why(b"[1"), UnreadableJson::Syntax { at: 2 });
    assert_eq!(why(b"\"\\u12x4\""), UnreadableJson::Syntax { at: 5 });
    assert_eq!(
        why(b"{\"caf\xe9\": 1}"),
        UnreadableJson::InvalidUtf8 { at: 5 }
    );
    assert_eq!(
        why(b"[\"a\\n\xff\"]"),
        UnreadableJson::InvalidUtf8 { at: 5 }
    );
    for (body, at) in [
        (r#"["\ud800"]"#, 2),
        (r#"["ok", "x\udc00"]"#, 9),
        (r#"{"\ud83d\u0041": 1}"#, 2),
        (r#"["\ud83d"#, 2),
    ] {
        assert_eq!(
            why(body.as_bytes()),
            UnreadableJson::LoneSurrogate { at },
            "{body}"
        );
    }
    // A pair is one character.
    assert_eq!(
        canonical(r#""\ud83d\ude00""#).as_deref(),
        Some("\"\u{1f600}\"")
    );
}

#[test]
fn nesting_is_read_up_to_go_s_limit_with_a_stack_of_its_own() {
    let nested = |n: usize| "[".repeat(n) + &"]".repeat(n);
    let deepest = canonical(&nested(MAX_JSON_DEPTH)).expect("10000 levels are read");
    assert_eq!(deepest, nested(MAX_JSON_DEPTH));
    assert_eq!(
        parse(nested(MAX_JSON_DEPTH + 1).as_bytes(), &[])
            .map(|_| ())
            .unwrap_err(),
        UnreadableJson::TooDeep { at: MAX_JSON_DEPTH }
    );
    // Objects too, written and dropped without the thread's stack: on a thread of
    // 128 KiB, a frame per level would overflow long before 10000 levels.
    let levels = MAX_JSON_DEPTH - 1;
    let objects = "{\"a\":".repeat(levels) + "[1,2]" + &"}".repeat(levels);
    let ignored = [vec!["a".to_owned(), "a".to_owned()]];
    std::thread::Builder::new()
        .stack_size(128 * 1024)
        .spawn(move || {
            assert_eq!(canonical(&objects).as_deref(), Some(&*objects));
            let mut out = Vec::new();
            assert!(canonicalize(objects.as_bytes(), &ignored, &mut out).is_ok());
            assert_eq!(out, b"{\"a\":{}}");
            let mut out = Vec::new();
            assert!(crate::jcs::canonicalize(objects.as_bytes(), &[], &mut out).is_ok());
            assert_eq!(out, objects.as_bytes());
            // A megabyte of `[`: refused at the limit, whatever follows.
            let hostile = vec![b'['; 1 << 20];
            assert_eq!(
                parse(&hostile, &[]).map(|_| ()).unwrap_err(),
                UnreadableJson::TooDeep { at: MAX_JSON_DEPTH }
            );
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
}
