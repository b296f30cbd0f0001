//! The gateway's `forwarded`: a client's `Forwarded` and `X-Forwarded-For` values.

use http::{HeaderMap, HeaderValue, header};
use idem_gateway::fuzzing::forwarded::{self, add_forwarded};

/// `data`, when it is a header value, as a client's `Forwarded` and `X-Forwarded-For`.
///
/// # Panics
///
/// When `is_valid` disagrees with `parse`; or when, after the gateway appends its hop,
/// the `Forwarded` value it sends does not parse, does not end with the gateway's own
/// element, or holds more elements than the client's plus one (a broken client value
/// must be dropped, never let the gateway's element end up inside a client's quote);
/// and likewise for `X-Forwarded-For`.
pub fn forwarded_parse(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let text = value.to_str().ok();
    let parsed = text.map(forwarded::parse);
    if let (Some(text), Some(parsed)) = (text, &parsed) {
        assert_eq!(forwarded::is_valid(text), parsed.is_ok(), "{text:?}");
    }
    let client_elements = match &parsed {
        Some(Ok(elements)) => elements.len(),
        _ => 0,
    };

    let mut headers = HeaderMap::new();
    headers.insert(header::FORWARDED, value.clone());
    headers.insert("x-forwarded-for", value);
    let host = HeaderValue::from_static("api.example");
    add_forwarded(&mut headers, Some([127, 0, 0, 1].into()), Some(&host));

    let sent = headers[header::FORWARDED]
        .to_str()
        .expect("the gateway writes ASCII");
    let elements = forwarded::parse(sent).unwrap_or_else(|e| {
        panic!("the gateway sent a Forwarded that does not parse: {sent:?}: {e:?}")
    });
    assert!(
        elements.len() <= client_elements + 1,
        "{data:?} became {sent:?}"
    );
    assert!(
        sent.ends_with("for=127.0.0.1;proto=http;host=\"api.example\""),
        "the gateway's element is not last: {sent:?}"
    );
    let xff = headers["x-forwarded-for"].to_str().expect("ASCII");
    assert!(
        forwarded::x_forwarded_for_is_valid(xff),
        "the gateway sent an X-Forwarded-For that does not parse: {xff:?}"
    );
    assert!(xff.ends_with("127.0.0.1"), "{xff:?}");
}
