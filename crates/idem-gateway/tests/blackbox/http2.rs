//! HTTP/2 at the listener (h2c with prior knowledge on the plain port): a stream the
//! client resets does not cancel its upstream call (SPEC S7), curl gets a replay, and
//! the HTTP/2 limits and the client timeout hold. The keyed behaviours themselves run
//! over both protocols in `protocol`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{Gateway, Http, Proto, Upstream, new_key};

/// The client connection preface (RFC 9113 §3.4) and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

async fn setup(extra: &[&str]) -> (Upstream, Gateway, tempfile::TempDir) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--store", "memory://"];
    args.extend_from_slice(extra);
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    (up, gw, dir)
}

/// One HTTP/2 connection of its own to `addr`, driven in a task.
async fn h2_connection(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("an HTTP/2 handshake with prior knowledge");
    tokio::spawn(conn);
    send
}

fn keyed_post(gw: &Gateway, key: &str, delay_ms: u64) -> http::Request<Full<Bytes>> {
    http::Request::post(gw.url("/v1/charges"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .header("x-test-delay-ms", delay_ms.to_string())
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .unwrap()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_mid_request_does_not_cancel_the_upstream_call() {
    let (up, gw, _dir) = setup(&[]).await;
    let mut send = h2_connection(gw.addr).await;
    let key = new_key();
    // Dropping a response future resets its stream (RST_STREAM, CANCEL); the
    // connection stays open.
    let answer = send.send_request(keyed_post(&gw, &key, 1000));
    let answer = tokio::spawn(answer);
    wait_until("the upstream started", || up.started(&key) == 1).await;
    answer.abort();
    assert!(answer.await.unwrap_err().is_cancelled());
    assert!(
        up.wait_finished(&key, 1, Duration::from_secs(15)).await,
        "the upstream call completed after the reset"
    );
    // The retry, on the same connection, replays what was recorded.
    send.ready()
        .await
        .expect("the connection outlived the reset");
    let retry = loop {
        let res = send.send_request(keyed_post(&gw, &key, 0)).await.unwrap();
        if res.status() != 409 {
            break res;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.version(), http::Version::HTTP_2);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["n"], 1,
        "the answer of the call the reset left running"
    );
    assert_eq!(up.started(&key), 1, "the upstream ran once");
    assert_eq!(up.total(), 1);
}

/// `curl ARGS… -X POST` with a key; the status and whether it was a replay.
fn curl_post(args: &[&str], url: &str, key: &str) -> (String, bool) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-D", "-", "--max-time", "20"])
        .args(args)
        .args(["-X", "POST", "-H", &format!("Idempotency-Key: {key}")])
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            "{\"amount\":1}",
        ])
        .arg(url)
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    let status = head.lines().next().unwrap_or_default().trim().to_owned();
    (status, head.contains("idempotent-replayed: true"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_with_http2_prior_knowledge_gets_a_replay() {
    let (up, gw, _dir) = setup(&[]).await;
    let key = new_key();
    let url = gw.url("/v1/charges");
    let args = ["--http2-prior-knowledge"];
    let first = tokio::task::spawn_blocking({
        let (url, key) = (url.clone(), key.clone());
        move || curl_post(&args, &url, &key)
    })
    .await
    .unwrap();
    assert_eq!(first, ("http/2 201".to_owned(), false));
    let retry = tokio::task::spawn_blocking({
        let key = key.clone();
        move || curl_post(&args, &url, &key)
    })
    .await
    .unwrap();
    assert_eq!(retry, ("http/2 201".to_owned(), true));
    assert_eq!(up.started(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_limit_wait_for_a_free_one() {
    let (up, gw, _dir) = setup(&["--http2-max-concurrent-streams", "2"]).await;
    let mut send = h2_connection(gw.addr).await;
    // A first request, so that the server's SETTINGS (with the limit) have arrived: a
    // stream opened beyond the limit before then is refused (REFUSED_STREAM).
    let warm = http::Request::get(gw.url("/v1/things"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send.send_request(warm).await.unwrap().status(), 201);
    let keys: Vec<String> = (0..3).map(|_| new_key()).collect();
    let calls: Vec<_> = keys
        .iter()
        .map(|key| {
            let mut send = send.clone();
            let req = keyed_post(&gw, key, 1500);
            tokio::spawn(async move {
                send.ready().await.unwrap();
                send.send_request(req).await.unwrap().status()
            })
        })
        .collect();
    wait_until("two calls at the upstream", || up.total() == 3).await;
    // The server allows two streams at once: the third waits for one of them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(up.total(), 3, "a third stream was let in beyond the limit");
    for call in calls {
        assert_eq!(call.await.unwrap(), 201);
    }
    assert_eq!(up.total(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_list_over_the_limit_is_refused() {
    let (up, gw, _dir) = setup(&["--http2-max-header-list-size", "8KiB"]).await;
    let mut send = h2_connection(gw.addr).await;
    let big = "x".repeat(16 * 1024);
    let req = http::Request::get(gw.url("/v1/things"))
        .header("x-big", big)
        .body(Full::new(Bytes::new()))
        .unwrap();
    match send.send_request(req).await {
        Ok(res) => assert_eq!(res.status(), 431),
        Err(e) => assert!(e.to_string().contains("reset") || e.is_canceled(), "{e}"),
    }
    assert_eq!(up.total(), 0, "nothing was forwarded");
    // A request within it on the same connection is served.
    let mut send = h2_connection(gw.addr).await;
    let ok = http::Request::get(gw.url("/v1/things"))
        .header("x-small", "y".repeat(1024))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send.send_request(ok).await.unwrap().status(), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_streams_is_closed_after_the_client_timeout() {
    let (_up, gw, _dir) = setup(&["--client-timeout", "1s"]).await;
    // Only the preface and SETTINGS, then nothing.
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut read = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), tcp.read_to_end(&mut read))
        .await
        .expect("closed within the client timeout and margin")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    // The server's SETTINGS, its ACK of ours, and a GOAWAY (type 7) before the close.
    assert!(
        frames(&read).contains(&7),
        "a GOAWAY before the close: {:?}",
        frames(&read)
    );
    // Used streams keep a connection open: one idle for less than the timeout between
    // requests is not closed.
    let http = Http::speaking(Proto::H2c);
    for _ in 0..3 {
        let a = http.send("GET", &gw.url("/v1/things"), &[], "").await;
        assert_eq!(a.status, 201);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The types of the HTTP/2 frames in `bytes` (a server's, after no preface).
fn frames(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}
