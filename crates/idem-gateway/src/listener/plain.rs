//! Plain HTTP sent to a TLS listener: answered with a 400 that says so, as nginx does,
//! instead of a TLS alert that an HTTP client shows as a garbled or empty reply.
//!
//! A TLS connection starts with a handshake record, whose first byte is 22; an HTTP/1
//! request starts with its method's first letter, and HTTP/2 with prior knowledge with
//! `PRI`. The first byte is peeked (left in the socket), so a TLS client's handshake is
//! read by the TLS acceptor as if nothing had looked.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The first byte of a TLS handshake record (RFC 8446 §5.1).
const TLS_HANDSHAKE: u8 = 22;

/// The problem type of the answer.
pub(super) const PROBLEM_TYPE: &str = "https://idem.dev/problems/plain-http-to-https-port";

/// At most this much of the plain request is read and dropped after the answer, so
/// that closing the connection does not reset it before the client has read the
/// answer.
const DRAIN_LIMIT: usize = 64 * 1024;

/// How long the rest of the plain request may take to drain.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Whether the connection's first byte (waited for) is plain HTTP's rather than a TLS
/// handshake's. `None` when the connection ended or failed before sending one.
pub(super) async fn starts_plain(stream: &TcpStream) -> Option<bool> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1) => Some(first[0] != TLS_HANDSHAKE && first[0].is_ascii_uppercase()),
        _ => None,
    }
}

/// Answers the plain request on `stream` with the 400 and closes the connection.
pub(super) async fn refuse(mut stream: TcpStream) {
    let body = serde_json::json!({
        "type": PROBLEM_TYPE,
        "title": "Plain HTTP sent to the HTTPS port",
        "status": 400,
        "detail": "this port speaks HTTPS (TLS): send the request to https:// at the same \
                   host and port",
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = vec![0u8; 8 * 1024];
    let mut drained = 0;
    let drain = async {
        while drained < DRAIN_LIMIT {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn a_method_is_plain_and_a_handshake_is_not_and_neither_is_consumed() {
        for (sent, plain) in [
            (&b"GET / HTTP/1.1\r\n"[..], true),
            (b"PRI * HTTP/2.0\r\n", true),
            (&[22, 3, 1, 0, 5], false),
            (b"\x00garbage", false),
        ] {
            let (mut client, server) = pair().await;
            client.write_all(sent).await.unwrap();
            assert_eq!(starts_plain(&server).await, Some(plain), "{sent:?}");
            let mut again = vec![0u8; sent.len()];
            let mut server = server;
            server.read_exact(&mut again).await.unwrap();
            assert_eq!(again, sent, "peeking left the bytes in place");
        }
        let (client, server) = pair().await;
        drop(client);
        assert_eq!(starts_plain(&server).await, None);
    }

    #[tokio::test]
    async fn the_answer_is_a_400_problem_read_whole_before_the_close() {
        let (mut client, server) = pair().await;
        client
            .write_all(b"POST /v1/charges HTTP/1.1\r\nHost: x\r\ncontent-length: 3\r\n\r\nabc")
            .await
            .unwrap();
        let refused = tokio::spawn(refuse(server));
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        refused.await.unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(
            head.contains("content-type: application/problem+json"),
            "{head}"
        );
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["type"], PROBLEM_TYPE);
        assert_eq!(v["status"], 400);
    }
}
