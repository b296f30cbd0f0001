//! `Key::parse`: the `Idempotency-Key` header value (SPEC S2).

use idem_core::{Key, KeyError, MAX_KEY_LEN};

/// `data` as one `Idempotency-Key` field value.
///
/// # Panics
///
/// When the key or error differs from SPEC S2's grammar (checked against the small
/// reference reading below); when an error names a position, byte or length the
/// input does not have; when a key does not parse again from its Structured Field
/// spelling, its bare spelling or `Key::new`; when whitespace around the value, or
/// `FromStr`, changes the answer; or when `Key::from_fields` disagrees with `parse`
/// on one field or accepts two.
pub fn key_parse(data: &[u8]) {
    let parsed = Key::parse(data);
    assert_eq!(
        parsed.as_ref().ok().map(Key::as_str),
        reference(data).as_deref(),
        "SPEC S2's grammar disagrees on {data:?}: {parsed:?}"
    );
    match &parsed {
        Ok(key) => check_key(key, data),
        Err(error) => check_error(error, data),
    }

    // Optional whitespace around the value is never part of the key.
    let padded = [b" \t", data, b"\t "].concat();
    match (&parsed, Key::parse(&padded)) {
        (
            Err(KeyError::BadCharacter { position, byte }),
            Err(KeyError::BadCharacter {
                position: p,
                byte: b,
            }),
        ) => assert_eq!((position + 2, *byte), (p, b), "{data:?}"),
        (parsed, padded) => assert_eq!(parsed, &padded, "{data:?}"),
    }

    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(text.parse::<Key>(), parsed, "FromStr on {data:?}");
    }
    assert_eq!(
        Key::from_fields([data]),
        parsed.clone().map(Some),
        "{data:?}"
    );
    assert_eq!(
        Key::from_fields([data, data]),
        Err(KeyError::Repeated { count: 2 }),
        "two fields of {data:?}"
    );
}

fn check_key(key: &Key, data: &[u8]) {
    let s = key.as_str();
    assert!((1..=MAX_KEY_LEN).contains(&s.len()), "{key:?}");
    assert!(s.bytes().all(printable), "{key:?}");
    assert!(s.len() <= data.len(), "{key:?} from {data:?}");
    let sf = key.to_sf_string();
    assert_eq!(Key::parse(sf.as_bytes()).as_ref(), Ok(key), "{sf}");
    assert_eq!(Key::new(s).as_ref(), Ok(key));
    // The bare spelling names it too, where the key can be spelt bare.
    if !s.starts_with('"') && !s.starts_with([' ', '\t']) && !s.ends_with([' ', '\t']) {
        assert_eq!(Key::parse(s.as_bytes()).as_ref(), Ok(key));
    }
}

fn check_error(error: &KeyError, data: &[u8]) {
    match *error {
        KeyError::BadCharacter { position, byte } => {
            assert_eq!(data.get(position), Some(&byte), "{error:?} in {data:?}");
            assert!(!printable(byte), "{error:?}");
        }
        KeyError::TooLong { len } => {
            assert!(len > MAX_KEY_LEN && len <= data.len(), "{error:?}");
        }
        KeyError::Empty | KeyError::BadQuoting { .. } => {}
        ref other => panic!("one field value refused as {other:?}"),
    }
    // The message a client reads in the 400's detail says something.
    assert!(!error.to_string().is_empty());
}

/// SPEC S2 read literally: optional whitespace, then either a quoted string of printable
/// ASCII with `\"` and `\\` escapes only, or bare printable ASCII; 1 to 255 characters
/// once decoded.
fn reference(data: &[u8]) -> Option<String> {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = data.iter().position(|b| !ows(b))?;
    let end = data.iter().rposition(|b| !ows(b))? + 1;
    let value = &data[start..end];
    let mut key = Vec::new();
    if let Some(quoted) = value.strip_prefix(b"\"") {
        let inner = quoted.strip_suffix(b"\"")?;
        let mut bytes = inner.iter();
        while let Some(&b) = bytes.next() {
            match b {
                b'\\' => match bytes.next()? {
                    &e @ (b'"' | b'\\') => key.push(e),
                    _ => return None,
                },
                b'"' => return None,
                b if printable(b) => key.push(b),
                _ => return None,
            }
        }
    } else {
        if !value.iter().copied().all(printable) {
            return None;
        }
        key.extend_from_slice(value);
    }
    (1..=MAX_KEY_LEN)
        .contains(&key.len())
        .then(|| String::from_utf8(key).expect("printable ASCII"))
}

fn printable(b: u8) -> bool {
    (0x20..=0x7e).contains(&b)
}
