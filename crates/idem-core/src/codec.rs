//! A compact, binary-safe encoding of stored response headers, shared by the stores
//! that keep them in one column or one hash field.

use bytes::Bytes;

use crate::StoreError;

/// Encodes headers as `count:u16` then, per header, `name_len:u16 name value_len:u32
/// value`, all big-endian.
pub fn encode_headers(headers: &[(String, Bytes)]) -> Vec<u8> {
    let size: usize = headers.iter().map(|(n, v)| 6 + n.len() + v.len()).sum();
    let mut out = Vec::with_capacity(2 + size);
    out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// The bytes [`encode_headers`] writes before the value of a header named `name`: its
/// length, then the name. A store that keeps the encoding in one column finds the
/// records that may hold such a header (a pseudo-header such as
/// [`AMBIGUOUS_HEADER`](crate::AMBIGUOUS_HEADER)) by searching for them, and decodes
/// to be sure: a value could hold the same bytes.
pub fn encoded_header_name(name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + name.len());
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes what [`encode_headers`] wrote.
pub fn decode_headers(mut input: &[u8]) -> Result<Vec<(String, Bytes)>, StoreError> {
    fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], StoreError> {
        if input.len() < n {
            return Err(StoreError::Corrupt("truncated header block".into()));
        }
        let (head, rest) = input.split_at(n);
        *input = rest;
        Ok(head)
    }
    let count = u16::from_be_bytes(take(&mut input, 2)?.try_into().expect("2 bytes"));
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let n = u16::from_be_bytes(take(&mut input, 2)?.try_into().expect("2 bytes")) as usize;
        let name = std::str::from_utf8(take(&mut input, n)?)
            .map_err(|_| StoreError::Corrupt("header name is not UTF-8".into()))?
            .to_owned();
        let v = u32::from_be_bytes(take(&mut input, 4)?.try_into().expect("4 bytes")) as usize;
        headers.push((name, Bytes::copy_from_slice(take(&mut input, v)?)));
    }
    if !input.is_empty() {
        return Err(StoreError::Corrupt("trailing bytes after headers".into()));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_binary_safe() {
        let h = vec![
            (
                "content-type".to_owned(),
                Bytes::from_static(b"application/json"),
            ),
            ("x-bin".to_owned(), Bytes::from_static(&[0, 255, 10, 13])),
            ("location".to_owned(), Bytes::new()),
        ];
        assert_eq!(decode_headers(&encode_headers(&h)).unwrap(), h);
        assert_eq!(decode_headers(&encode_headers(&[])).unwrap(), vec![]);
    }

    #[test]
    fn truncated_input_is_corrupt() {
        let h = vec![("a".to_owned(), Bytes::from_static(b"bc"))];
        let enc = encode_headers(&h);
        for cut in 0..enc.len() {
            assert!(decode_headers(&enc[..cut]).is_err());
        }
    }
}
