use super::*;
use crate::codec::encode_response_headers;
use crate::{FingerprintOptions, ReserveRequest, Tenant};

const K1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const K2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

/// The lease of attempt `token` on `key`'s record, reserved for the body `body`.
fn lease_on(key: &str, body: &str, token: u64) -> Lease {
    let fp = Fingerprint::compute(
        "POST",
        "/v1/charges",
        None,
        body.as_bytes(),
        &FingerprintOptions::default(),
    );
    ReserveRequest::new(
        crate::testing::scope_of(Tenant::new("t"), "/v1/charges", key),
        fp,
    )
    .lease_for(FencingToken::from_u64(token), 1)
}

/// What an answer recorded on `key` for the body `{}` by attempt 1 is bound to.
fn bound(key: &str) -> Lease {
    lease_on(key, "{}", 1)
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
    let sealed = keys.seal(SealBinding::of_lease(&bound("a")), &answer);
    assert!(is_sealed(&sealed));
    assert_eq!(sealed.status, 201);
    assert_eq!(sealed.http_headers().count(), 0, "no HTTP header is left");
    assert_eq!(sealed.reference(), None, "the reference is sealed too");
    assert_eq!(
        sealed.body.len(),
        SEAL_OVERHEAD + answer.body.len() + encode_response_headers(&answer, true).len()
    );
    assert!(!sealed.body.windows(6).any(|w| w == b"secret"));
    assert_eq!(
        keys.open(SealBinding::of_lease(&bound("a")), sealed.clone())
            .unwrap(),
        answer
    );
    assert_eq!(
        keys.seal(SealBinding::of_lease(&bound("a")), &sealed),
        sealed,
        "sealed once only"
    );
    // Two seals of one answer differ: a fresh nonce each time.
    assert_ne!(
        keys.seal(SealBinding::of_lease(&bound("a")), &answer).body,
        sealed.body
    );
    assert!(matches!(
        keys.open(SealBinding::of_lease(&bound("b")), sealed),
        Err(StoreError::Sealed(_))
    ));
}

#[test]
fn plain_answers_pass_and_truncated_ones_are_refused() {
    let keys = RecordKeys::new([("k1", [1; 32])]).unwrap();
    let plain = StoredResponse::new(200, "recorded before sealing");
    assert_eq!(
        keys.open(SealBinding::of_lease(&bound("a")), plain.clone())
            .unwrap(),
        plain
    );
    let mut short = keys.seal(
        SealBinding::of_lease(&bound("a")),
        &StoredResponse::new(200, ""),
    );
    short.body = short.body.slice(..SEAL_OVERHEAD - 1);
    let e = keys
        .open(SealBinding::of_lease(&bound("a")), short)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown version") || e.contains("bytes"), "{e}");
}

#[test]
fn an_answer_opens_only_for_the_request_and_attempt_it_was_recorded_for() {
    let keys = RecordKeys::new([("k1", [1; 32])]).unwrap();
    let answer = StoredResponse::new(201, "ch_1");
    let recorded = lease_on("a", r#"{"amount":100}"#, 7);
    let sealed = keys.seal(SealBinding::of_lease(&recorded), &answer);
    assert_eq!(
        keys.open(SealBinding::of_lease(&recorded), sealed.clone())
            .unwrap(),
        answer
    );
    // Copied into the same key's record for another payload, or into a later life of
    // the record (another attempt's token, the same payload): it does not open.
    for (other, what) in [
        (lease_on("a", r#"{"amount":999}"#, 7), "another payload"),
        (lease_on("a", r#"{"amount":100}"#, 8), "another attempt"),
        (lease_on("b", r#"{"amount":100}"#, 7), "another key"),
    ] {
        let e = keys
            .open(SealBinding::of_lease(&other), sealed.clone())
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not open"), "{what}: {e}");
    }
}

/// `response` sealed as version 1 of the format sealed it: bound to scope, status and
/// key id only.
fn seal_unbound(keys: &RecordKeys, lease: &Lease, response: &StoredResponse) -> StoredResponse {
    let mut sealed = keys.seal(SealBinding::of_lease(lease), response);
    let key = &keys.keys[0];
    let mut body = sealed.body.to_vec();
    body[0] = UNBOUND_VERSION;
    let nonce = XNonce::try_from(&body[1..1 + NONCE_LEN]).unwrap();
    let end = body.len() - TAG_LEN;
    let tag = Tag::try_from(&body[end..]).unwrap();
    // Open under version 2's binding, then seal again under version 1's.
    let aad = associated_data(
        VERSION,
        SealBinding::of_lease(lease),
        response.status,
        &key.id,
    );
    key.cipher
        .decrypt_inout_detached(&nonce, &aad, (&mut body[1 + NONCE_LEN..end]).into(), &tag)
        .unwrap();
    let aad = associated_data(
        UNBOUND_VERSION,
        SealBinding::of_lease(lease),
        response.status,
        &key.id,
    );
    let tag = key
        .cipher
        .encrypt_inout_detached(&nonce, &aad, (&mut body[1 + NONCE_LEN..end]).into())
        .unwrap();
    body[end..].copy_from_slice(&tag);
    sealed.body = Bytes::from(body);
    sealed
}

#[test]
fn version_1_answers_open_only_under_the_migration_setting() {
    let keys = RecordKeys::new([("k1", [1; 32])]).unwrap();
    let answer = StoredResponse::new(201, "ch_old").with_header("location", "/v1/charges/ch_old");
    let lease = bound("a");
    let old = seal_unbound(&keys, &lease, &answer);
    let e = keys
        .open(SealBinding::of_lease(&lease), old.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("version 1"), "{e}");
    assert_eq!(
        keys.open_with(SealBinding::of_lease(&lease), old.clone(), true)
            .unwrap(),
        answer
    );
    // Bound to its scope still: copied into another key's record, it does not open.
    assert!(
        keys.open_with(SealBinding::of_lease(&bound("b")), old, true)
            .is_err()
    );
}
