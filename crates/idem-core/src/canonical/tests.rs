use super::*;

fn canonical(body: &str) -> Option<String> {
    let mut out = Vec::new();
    canonicalize(body.as_bytes(), &[], &mut out).map(|_| String::from_utf8(out).unwrap())
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
        Some(Some("a".to_owned()))
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
    assert_eq!(found, Some(Some("sent_at".to_owned())));
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
    assert!(canonicalize(b"\"\xff\"", &[], &mut out).is_none());
    assert!(out.is_empty(), "nothing is written for a refused body");
}

#[test]
fn exponents_past_any_double_leave_the_body_raw() {
    assert_eq!(canonical("1e9999999999999"), None);
    assert_eq!(canonical("[1e-0000000000009999999999999]"), None);
    assert_eq!(
        canonical("1e999999999999").as_deref(),
        Some("1e999999999999")
    );
}

#[test]
fn nesting_is_limited_as_serde_json_limits_it() {
    let nested = |n: usize| "[".repeat(n) + &"]".repeat(n);
    assert!(canonical(&nested(MAX_DEPTH)).is_some());
    assert!(canonical(&nested(MAX_DEPTH + 1)).is_none());
    assert!(canonical(&nested(100_000)).is_none(), "no stack overflow");
}
