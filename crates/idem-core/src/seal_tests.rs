use super::*;
use crate::{Endpoint, Key, Tenant};

const K1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const K2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn scope(key: &str) -> Scope {
    Scope::from_parts(
        Tenant::new("t"),
        Some(Endpoint::new("POST", "/v1/charges")),
        Key::new(key).unwrap(),
    )
}

#[test]
fn a_key_file_is_lines_of_id_and_hex_the_first_current() {
    let keys = RecordKeys::parse(&format!("\n# comment\n  k2 : {K2}  \r\nk1:{K1}\n")).unwrap();
    assert_eq!(keys.current_id(), "k2");
    assert_eq!(keys.ids().collect::<Vec<_>>(), ["k2", "k1"]);
    let shown = format!("{keys:?}");
    assert!(shown.contains("k2") && !shown.contains("2222"), "{shown}");
}

#[test]
fn bad_key_files_say_which_line_and_never_the_key() {
    let cases = [
        ("".to_owned(), "holds no key"),
        ("# only a comment\n".to_owned(), "holds no key"),
        (format!("k1 {K1}"), "line 1: no ':'"),
        (
            format!("k1:{K1}\nk1:{K2}"),
            "line 2: the key id \"k1\" is used twice",
        ),
        (format!("\nbad id:{K1}"), "line 2: the key id \"bad id\""),
        (format!(":{K1}"), "the key id \"\""),
        ("k1:abcd".to_owned(), "line 1: the key is 4 characters"),
        (format!("k1:{}", &K1[..63]), "63 characters"),
        (format!("k1:{}zz", &K1[..62]), "not 64 hex digits"),
        (format!("{}:{K1}", "k".repeat(33)), "1 to 32 letters"),
    ];
    for (text, wanted) in cases {
        let e = RecordKeys::parse(&text).unwrap_err().to_string();
        assert!(e.contains(wanted), "{text:?}: {e}");
        assert!(!e.contains("1111") && !e.contains("2222"), "{e}");
    }
}

#[test]
fn sealing_hides_headers_and_body_and_opens_byte_for_byte() {
    let keys = RecordKeys::new([("k1", [1; 32])]).unwrap();
    let answer = StoredResponse::new(201, "secret body")
        .with_header("location", "/v1/secret")
        .with_reference("/v1/secret/ref");
    let sealed = keys.seal(&scope("a"), &answer);
    assert!(is_sealed(&sealed));
    assert_eq!(sealed.status, 201);
    assert_eq!(sealed.http_headers().count(), 0, "no HTTP header is left");
    assert_eq!(sealed.reference(), None, "the reference is sealed too");
    assert_eq!(
        sealed.body.len(),
        SEAL_OVERHEAD + answer.body.len() + encode_headers(&answer.headers).len()
    );
    assert!(!sealed.body.windows(6).any(|w| w == b"secret"));
    assert_eq!(keys.open(&scope("a"), sealed.clone()).unwrap(), answer);
    assert_eq!(keys.seal(&scope("a"), &sealed), sealed, "sealed once only");
    // Two seals of one answer differ: a fresh nonce each time.
    assert_ne!(keys.seal(&scope("a"), &answer).body, sealed.body);
    assert!(matches!(
        keys.open(&scope("b"), sealed),
        Err(StoreError::Sealed(_))
    ));
}

#[test]
fn plain_answers_pass_and_truncated_ones_are_refused() {
    let keys = RecordKeys::new([("k1", [1; 32])]).unwrap();
    let plain = StoredResponse::new(200, "recorded before sealing");
    assert_eq!(keys.open(&scope("a"), plain.clone()).unwrap(), plain);
    let mut short = keys.seal(&scope("a"), &StoredResponse::new(200, ""));
    short.body = short.body.slice(..SEAL_OVERHEAD - 1);
    let e = keys.open(&scope("a"), short).unwrap_err().to_string();
    assert!(e.contains("unknown version") || e.contains("bytes"), "{e}");
}
