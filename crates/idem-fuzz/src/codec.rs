//! The record codec (`idem_core::codec`): stored response headers in one column or
//! hash field.

use bytes::Bytes;
use idem_core::codec::{decode_headers, encode_headers};

/// `data` both as a stored header block and, split at its NUL bytes, as the names and
/// values of headers to store.
///
/// # Panics
///
/// When a block decodes but does not encode back to the same bytes; when headers do
/// not decode back to themselves; or when a truncated block, or one with a byte after
/// it, decodes at all.
pub fn record_codec(data: &[u8]) {
    // What a store read back, whatever it holds: refused, or exactly what was written.
    if let Ok(headers) = decode_headers(data) {
        assert_eq!(encode_headers(&headers), data, "{headers:?}");
    }

    let mut fields = data.split(|&b| b == 0);
    let mut headers = Vec::new();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        let name = String::from_utf8_lossy(name).into_owned();
        headers.push((name, Bytes::copy_from_slice(value)));
    }
    let block = encode_headers(&headers);
    match decode_headers(&block) {
        Ok(decoded) => assert_eq!(decoded, headers),
        Err(e) => panic!("{headers:?} do not decode: {e}"),
    }
    for cut in [0, block.len() / 2, block.len() - 1] {
        assert!(decode_headers(&block[..cut]).is_err(), "cut at {cut}");
    }
    let longer = [&block[..], b"\0"].concat();
    assert!(decode_headers(&longer).is_err());
}
