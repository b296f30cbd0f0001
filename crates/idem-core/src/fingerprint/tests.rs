//! Tests of the fingerprint: what makes two requests one, and that the fingerprints
//! stores already hold keep matching.

use super::*;
use crate::MAX_JSON_DEPTH;

mod reference;

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
