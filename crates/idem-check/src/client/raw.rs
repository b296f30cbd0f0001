//! Reading an HTTP/1.1 answer from a connection the checker wrote its request on by
//! hand (with `Connection: close`): the head parsed by `httparse`, the body by its
//! `Content-Length`, its chunks, or the connection's end.

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::Answer;

/// The most a head may take.
const MAX_HEAD: usize = 64 * 1024;
/// The most a body may take.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Reads one answer (informational 1xx heads skipped) and when its head was read.
pub(super) async fn read_answer<R: AsyncRead + Unpin>(
    io: &mut R,
    method: &Method,
) -> Result<(Answer, Instant), String> {
    let mut buf = Vec::new();
    let mut read_at = Instant::now();
    loop {
        if let Some((status, headers, len)) = parse_head(&buf)? {
            buf.drain(..len);
            if (100..200).contains(&status) {
                continue;
            }
            let head = read_at;
            let body = read_body(io, buf, &headers, status, method).await?;
            let answer = Answer {
                status,
                headers,
                body,
                received: Instant::now(),
                request_id: None,
            };
            return Ok((answer, head));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("the answer's head is over {MAX_HEAD} bytes"));
        }
        if !fill(io, &mut buf).await? {
            return Err("the connection closed before an answer".to_owned());
        }
        read_at = Instant::now();
    }
}

/// Reads more into `buf`; `false` at the connection's end.
async fn fill<R: AsyncRead + Unpin>(io: &mut R, buf: &mut Vec<u8>) -> Result<bool, String> {
    let mut chunk = [0u8; 8192];
    let n = io
        .read(&mut chunk)
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n > 0)
}

/// The status, headers and length of a complete head at the start of `buf`.
fn parse_head(buf: &[u8]) -> Result<Option<(u16, HeaderMap, usize)>, String> {
    let mut fields = [httparse::EMPTY_HEADER; 128];
    let mut res = httparse::Response::new(&mut fields);
    let len = match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("the answer is no HTTP/1.1: {e}")),
    };
    let mut headers = HeaderMap::new();
    for h in res.headers.iter() {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) {
            headers.append(n, v);
        }
    }
    Ok(Some((res.code.unwrap_or(0), headers, len)))
}

async fn read_body<R: AsyncRead + Unpin>(
    io: &mut R,
    mut buf: Vec<u8>,
    headers: &HeaderMap,
    status: u16,
    method: &Method,
) -> Result<Bytes, String> {
    if *method == Method::HEAD || status == 204 || status == 304 {
        return Ok(Bytes::new());
    }
    let chunked = headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .any(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .to_ascii_lowercase()
                .contains("chunked")
        });
    let length = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    loop {
        if chunked {
            if let Some(body) = dechunk(&buf)? {
                return Ok(Bytes::from(body));
            }
        } else if let Some(len) = length
            && buf.len() >= len
        {
            buf.truncate(len);
            return Ok(Bytes::from(buf));
        }
        if buf.len() > MAX_BODY {
            return Err(format!("the answer's body is over {MAX_BODY} bytes"));
        }
        if !fill(io, &mut buf).await? {
            if chunked || length.is_some() {
                return Err("the connection closed in the middle of the answer's body".to_owned());
            }
            return Ok(Bytes::from(buf));
        }
    }
}

/// The body of a chunked transfer, once its last chunk is in `data` (trailers ignored).
fn dechunk(mut data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = String::from_utf8_lossy(&data[..eol]);
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| format!("a chunk size {size:?} is no hexadecimal number"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(Some(out));
        }
        if data.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(wire: &[u8]) -> Result<(Answer, Instant), String> {
        let mut io = wire;
        read_answer(&mut io, &Method::POST).await
    }

    #[tokio::test]
    async fn reads_a_sized_answer_after_an_informational_one() {
        let (a, _) = read(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 5\r\n\
              Idempotent-Replayed: true\r\n\r\nhello and more",
        )
        .await
        .unwrap();
        assert_eq!(a.status, 201);
        assert_eq!(&a.body[..], b"hello");
        assert!(a.replay_marker());
    }

    #[tokio::test]
    async fn reads_a_chunked_answer_and_one_that_ends_with_the_connection() {
        let (a, _) = read(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
        assert_eq!(&a.body[..], b"abcde");
        let (a, _) = read(b"HTTP/1.1 409 Conflict\r\n\r\n{\"x\":1}")
            .await
            .unwrap();
        assert_eq!(a.status, 409);
        assert_eq!(&a.body[..], b"{\"x\":1}");
    }

    #[tokio::test]
    async fn a_cut_answer_is_an_error() {
        assert!(
            read(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc")
                .await
                .is_err()
        );
        assert!(read(b"HTTP/1.1 200 OK\r\ncontent-").await.is_err());
        assert!(read(b"garbage\r\n\r\n").await.is_err());
    }
}
