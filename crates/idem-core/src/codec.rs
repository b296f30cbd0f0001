//! A compact, binary-safe encoding of stored response headers, shared by the stores
//! that keep them in one column or one hash field, and the mapping of an answer's
//! [`ResponseMeta`] into that header block and back.
//!
//! # The header block
//!
//! A store keeps an answer's headers and its metadata in one block
//! ([`encode_response_headers`]): the HTTP headers, then one entry per metadata field
//! under a name that starts with a colon, which no HTTP field name can: the sealing key
//! id under [`SEALED_HEADER`] (first), the reference under [`REFERENCE_HEADER`], the
//! trace context under [`TRACE_PARENT_HEADER`], each trailer under [`TRAILER_PREFIX`]
//! and its name, and, for a store with no place of its own for it, the ambiguity reason
//! under [`AMBIGUOUS_HEADER`]. Records written before [`ResponseMeta`] existed kept
//! their metadata among the headers under these same names, so
//! [`decode_response_headers`] reads them, old and new, into the same fields.

use bytes::Bytes;

use crate::{Ambiguity, ResponseMeta, StoreError, StoredResponse};

/// The name under which the header block keeps [`ResponseMeta::reference`].
pub const REFERENCE_HEADER: &str = ":reference";

/// The name under which the header block keeps [`ResponseMeta::trace_parent`].
pub const TRACE_PARENT_HEADER: &str = ":traceparent";

/// The prefix, before the trailer's name, under which the header block keeps each of
/// [`ResponseMeta::trailers`].
pub const TRAILER_PREFIX: &str = ":trailer:";

/// The name under which the header block keeps [`ResponseMeta::ambiguity`] (by its
/// [`Ambiguity::as_str`]) when the store has no column or field of its own for it.
pub const AMBIGUOUS_HEADER: &str = ":ambiguous";

/// The name under which the header block keeps [`ResponseMeta::sealed_by`].
pub const SEALED_HEADER: &str = ":sealed";

/// The header block of `response`: its headers and its metadata (see the
/// [module docs](self)). The ambiguity reason is in it only when `with_ambiguity`: a
/// store that keeps the reason in a column of its own (so that its listing finds it by
/// an index) leaves it out, and passes the column back to [`decode_response_headers`].
pub fn encode_response_headers(response: &StoredResponse, with_ambiguity: bool) -> Vec<u8> {
    encode_headers(&header_list(response, with_ambiguity))
}

/// `response`'s headers and metadata as one list of named values, in the block's
/// order (see the [module docs](self)).
pub(crate) fn header_list(response: &StoredResponse, with_ambiguity: bool) -> Vec<(String, Bytes)> {
    let meta = &response.meta;
    let mut list = Vec::with_capacity(response.headers.len() + 2 + meta.trailers.len());
    let text = |s: &str| Bytes::copy_from_slice(s.as_bytes());
    if let Some(id) = &meta.sealed_by {
        list.push((SEALED_HEADER.to_owned(), text(id)));
    }
    list.extend(response.headers.iter().cloned());
    if let Some(reference) = &meta.reference {
        list.push((REFERENCE_HEADER.to_owned(), text(reference)));
    }
    if let Some(tp) = &meta.trace_parent {
        list.push((TRACE_PARENT_HEADER.to_owned(), text(tp)));
    }
    for (name, value) in &meta.trailers {
        list.push((format!("{TRAILER_PREFIX}{name}"), value.clone()));
    }
    if let (true, Some(reason)) = (with_ambiguity, meta.ambiguity) {
        list.push((
            AMBIGUOUS_HEADER.to_owned(),
            Bytes::from_static(reason.as_str().as_bytes()),
        ));
    }
    list
}

/// The headers and metadata a header block holds, as [`encode_response_headers`] wrote
/// it or as a record written before [`ResponseMeta`] existed held them. `ambiguity` is
/// the reason a store keeps in a column of its own, by its [`Ambiguity::as_str`]; when
/// it is `None`, the block's own (an older record's) counts. A name starting with a
/// colon that this build does not know is skipped: it is no HTTP header.
pub fn decode_response_headers(
    block: &[u8],
    ambiguity: Option<&str>,
) -> Result<(Vec<(String, Bytes)>, ResponseMeta), StoreError> {
    let (headers, mut meta) = split_header_list(decode_headers(block)?);
    if let Some(reason) = ambiguity {
        meta.ambiguity = Ambiguity::parse(reason);
    }
    Ok((headers, meta))
}

/// A list [`header_list`] made (or a record of an older build held), split into the
/// HTTP headers and the metadata.
pub(crate) fn split_header_list(
    list: Vec<(String, Bytes)>,
) -> (Vec<(String, Bytes)>, ResponseMeta) {
    let mut meta = ResponseMeta::default();
    let mut headers = Vec::with_capacity(list.len());
    let text = |value: &Bytes| std::str::from_utf8(value).ok().map(str::to_owned);
    for (name, value) in list {
        if !name.starts_with(':') {
            headers.push((name, value));
        } else if let Some(trailer) = name.strip_prefix(TRAILER_PREFIX) {
            meta.trailers.push((trailer.to_owned(), value));
        } else {
            match name.as_str() {
                REFERENCE_HEADER => meta.reference = text(&value),
                TRACE_PARENT_HEADER => meta.trace_parent = text(&value),
                SEALED_HEADER => meta.sealed_by = text(&value),
                AMBIGUOUS_HEADER => {
                    meta.ambiguity = text(&value).as_deref().and_then(Ambiguity::parse);
                }
                _ => {}
            }
        }
    }
    (headers, meta)
}

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

/// The bytes the header block of a record written before the ambiguity reason had a
/// column of its own holds for `reason`: the entry [`AMBIGUOUS_HEADER`] and the reason
/// made. A store's migration finds such records by them (a SQL `instr` or `position`),
/// to carry the reason into its column. Only a header value holding these very bytes
/// (the entry's name, a colon first, its length and the reason) could be taken for one,
/// and would list its record as ambiguous, nothing worse.
pub fn encoded_ambiguity(reason: Ambiguity) -> Vec<u8> {
    let entry = encode_headers(&[(
        AMBIGUOUS_HEADER.to_owned(),
        Bytes::from_static(reason.as_str().as_bytes()),
    )]);
    // Without the block's count of entries.
    entry[2..].to_vec()
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
    fn metadata_round_trips_through_the_header_block() {
        let response = StoredResponse::new(201, "")
            .with_header("location", "/v1/things/1")
            .with_reference("/v1/things/1")
            .with_trace_parent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .with_trailer("grpc-status", "0")
            .with_ambiguity(Ambiguity::UpstreamTimeout);
        let (headers, meta) =
            decode_response_headers(&encode_response_headers(&response, true), None).unwrap();
        assert_eq!((&headers, &meta), (&response.headers, &response.meta));
        // Without the reason in the block, the column's counts.
        let block = encode_response_headers(&response, false);
        let (_, meta) = decode_response_headers(&block, None).unwrap();
        assert_eq!(meta.ambiguity, None);
        let (_, meta) = decode_response_headers(&block, Some("upstream_timeout")).unwrap();
        assert_eq!(meta, response.meta);
    }

    #[test]
    fn an_older_records_pseudo_headers_read_as_metadata() {
        // As records were written before `ResponseMeta`: metadata among the headers.
        let old = vec![
            (":sealed".to_owned(), Bytes::from_static(b"k1")),
            ("content-type".to_owned(), Bytes::from_static(b"text/plain")),
            (":reference".to_owned(), Bytes::from_static(b"/r/1")),
            (":trailer:grpc-status".to_owned(), Bytes::from_static(b"0")),
            (":traceparent".to_owned(), Bytes::from_static(b"00-a-b-01")),
            (
                ":ambiguous".to_owned(),
                Bytes::from_static(b"answer_too_large"),
            ),
            (":from-a-later-build".to_owned(), Bytes::from_static(b"x")),
        ];
        let (headers, meta) = decode_response_headers(&encode_headers(&old), None).unwrap();
        assert_eq!(headers, [old[1].clone()]);
        assert_eq!(meta.sealed_by.as_deref(), Some("k1"));
        assert_eq!(meta.reference.as_deref(), Some("/r/1"));
        assert_eq!(meta.trace_parent.as_deref(), Some("00-a-b-01"));
        assert_eq!(
            meta.trailers,
            [("grpc-status".to_owned(), Bytes::from_static(b"0"))]
        );
        assert_eq!(meta.ambiguity, Some(Ambiguity::AnswerTooLarge));
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
