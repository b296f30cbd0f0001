//! The clients: one raw HTTP/1.1 request per connection (`Connection: close`), so that
//! a client that hangs up, or a connection the network breaks, loses exactly one
//! answer; every request and what came back is recorded.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::history::{Outcome, Recorder, Request};

/// How one request is sent.
#[derive(Debug, Clone, Copy)]
pub struct Send<'a> {
    /// The gateway's index, for the history.
    pub gateway: usize,
    /// Its address.
    pub addr: SocketAddr,
    /// The key.
    pub key: &'a str,
    /// The JSON body (the same for every request of the key).
    pub body: &'a str,
    /// How long the upstream takes (a header outside the fingerprint).
    pub delay_ms: u64,
    /// When the client hangs up without reading the answer (a lost answer), if ever.
    pub hang_up: Option<Duration>,
    /// How long the client waits for the whole answer.
    pub timeout: Duration,
}

/// Sends one request, records it in `recorder`, and returns what came back.
pub async fn send(recorder: &Recorder, s: Send<'_>) -> Outcome {
    let sent = recorder.now();
    let request = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: gateway\r\nIdempotency-Key: {}\r\n\
         Content-Type: application/json\r\nx-nemesis-delay-ms: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{}",
        s.key,
        s.delay_ms,
        s.body.len(),
        s.body
    );
    let exchange = async {
        let mut stream = TcpStream::connect(s.addr).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        if let Some(after) = s.hang_up {
            tokio::time::sleep(after).await;
            let _ = stream.set_zero_linger();
            return None;
        }
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        parse(&raw)
    };
    let outcome = tokio::time::timeout(s.timeout, exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(Outcome::Lost);
    recorder.request(Request {
        key: s.key.to_owned(),
        gateway: s.gateway,
        sent,
        ended: recorder.now(),
        outcome: outcome.clone(),
    });
    outcome
}

/// An answer read whole (up to the connection's end): its status, its body (by its
/// `Content-Length`, or de-chunked) and whether it is a replay; `None` when cut short.
fn parse(raw: &[u8]) -> Option<Outcome> {
    let (status, headers, body) = parse_full(raw)?;
    let replayed = headers
        .iter()
        .any(|(n, v)| n == "idempotent-replayed" && v == "true");
    Some(Outcome::Answer {
        status,
        body,
        replayed,
    })
}

/// An answer as [`get`] returns it: its status, headers (names lower-cased) and body.
pub type RawAnswer = (u16, Vec<(String, String)>, Bytes);

/// An answer's status, headers (names lower-cased) and body; `None` when cut short.
fn parse_full(raw: &[u8]) -> Option<RawAnswer> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = response.parse(raw).ok()? else {
        return None;
    };
    let headers: Vec<(String, String)> = response
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).trim().to_owned(),
            )
        })
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_ascii_lowercase())
    };
    let rest = &raw[head..];
    let body = if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        dechunk(rest)?
    } else {
        let len: usize = header("content-length")?.parse().ok()?;
        Bytes::copy_from_slice(rest.get(..len)?)
    };
    Some((response.code?, headers, body))
}

/// `GET path` on a fresh connection to `addr`, with the run's admin token: the
/// answer's status, headers (names lower-cased) and body; `None` when none came whole
/// within `timeout`.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<RawAnswer> {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        crate::gateway::ADMIN_TOKEN
    );
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        parse_full(&raw)
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// A chunked body, whole; `None` when it ends before its last chunk.
fn dechunk(mut rest: &[u8]) -> Option<Bytes> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body.into());
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_by_length_or_chunks_and_cut_ones_do_not() {
        let whole = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(
            parse(whole),
            Some(Outcome::Answer {
                status: 201,
                body: Bytes::from_static(b"{}"),
                replayed: false
            })
        );
        let chunked = b"HTTP/1.1 200 OK\r\nIdempotent-Replayed: true\r\n\
            Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n";
        assert_eq!(
            parse(chunked),
            Some(Outcome::Answer {
                status: 200,
                body: Bytes::from_static(b"abc"),
                replayed: true
            })
        );
        assert_eq!(
            parse(b"HTTP/1.1 201 Created\r\nContent-Length: 9\r\n\r\n{}"),
            None
        );
        assert_eq!(parse(b"HTTP/1.1 201 Cre"), None);
    }
}
