//! HTTP/2 clients that never open their flow-control window: a raw `h2` client that
//! sets `SETTINGS_INITIAL_WINDOW_SIZE` to 0, answers pings (its connection task does)
//! and never sends `WINDOW_UPDATE`. Under the client timeout such a stream is reset and
//! its upstream connection released, its connection closed once every stream on it is
//! stuck so, the answer bytes one connection holds are bounded, and such clients at the
//! connection cap do not lock a new client out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::common::{Gateway, Http, Upstream, new_key};

/// The gateway's client timeout in these tests.
const CLIENT_TIMEOUT: &str = "2s";

/// Far past the client timeout, yet far short of the upstream timeout (60 s) that
/// would end a stuck stream's upstream call on its own.
const WITHIN: Duration = Duration::from_secs(20);

/// An HTTP/1.1 upstream that answers every request with `len` bytes and counts the
/// connections the gateway holds open to it.
struct CountingUpstream {
    addr: std::net::SocketAddr,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingUpstream {
    async fn start(len: usize) -> CountingUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let counted = open.clone();
        let body = Bytes::from(vec![b'x'; len]);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    return;
                };
                let open = counted.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    open.fetch_add(1, Ordering::SeqCst);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
                         content-length: {}\r\n\r\n",
                        body.len()
                    );
                    // One answer per request head, until the gateway hangs up.
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        match tcp.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let sent = async {
                                tcp.write_all(head.as_bytes()).await?;
                                tcp.write_all(&body).await
                            };
                            if sent.await.is_err() {
                                open.fetch_sub(1, Ordering::SeqCst);
                                return;
                            }
                        }
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        CountingUpstream { addr, open, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP/2 connection (h2c, prior knowledge) whose client never lets the gateway
/// send a byte of any answer body: initial window 0, never a `WINDOW_UPDATE`. Its
/// connection task answers pings, and ends when the gateway closes the connection.
async fn shut_window_client(
    addr: std::net::SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("an HTTP/2 handshake with prior knowledge");
    (send, tokio::spawn(conn))
}

/// What became of one stream of a client that never reads.
#[derive(Debug)]
struct Stuck {
    status: u16,
    /// How the body ended: `None` if it never did within the bound, `Some(true)` if
    /// with a reset (or the connection's end), `Some(false)` if it ended cleanly.
    reset: Option<bool>,
}

/// Opens a stream for `req` (with `body`, if any) on `send` and returns a task that
/// waits, at most `WITHIN` after the answer's head, for the body to end.
async fn open_stream(
    send: &mut h2::client::SendRequest<Bytes>,
    req: http::Request<()>,
    body: Option<Bytes>,
) -> tokio::task::JoinHandle<Result<Stuck, h2::Error>> {
    let ready = send
        .clone()
        .ready()
        .await
        .expect("the connection takes streams");
    *send = ready;
    let (answer, mut stream) = send
        .send_request(req, body.is_none())
        .expect("a stream opens");
    if let Some(body) = body {
        stream.send_data(body, true).unwrap();
    }
    tokio::spawn(async move {
        let res = answer.await?;
        let status = res.status().as_u16();
        let mut body = res.into_body();
        let reset = match tokio::time::timeout(WITHIN, body.data()).await {
            Err(_) => None,
            Ok(Some(Err(_))) => Some(true),
            Ok(Some(Ok(_)) | None) => Some(false),
        };
        Ok(Stuck { status, reset })
    })
}

fn get(gw: &Gateway, path: &str) -> http::Request<()> {
    http::Request::get(gw.url(path)).body(()).unwrap()
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The resident set of process `pid`, in KiB.
fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_keeps_its_window_shut_is_reset_and_its_upstream_released() {
    const STREAMS: usize = 20;
    let up = CountingUpstream::start(300 * 1024).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--client-timeout", CLIENT_TIMEOUT],
    )
    .await;
    let (mut send, conn) = shut_window_client(gw.addr).await;
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        streams.push(open_stream(&mut send, get(&gw, "/v1/report"), None).await);
    }
    // Every stream has its answer under way: each holds an upstream connection.
    wait_until("every stream reached the upstream", WITHIN, || {
        up.open() == STREAMS
    })
    .await;
    let started = Instant::now();
    for stream in streams {
        let stuck = stream.await.unwrap().expect("the answer's head arrives");
        assert_eq!(stuck.status, 200);
        assert_eq!(
            stuck.reset,
            Some(true),
            "the stream is reset once its window stayed shut for the client timeout"
        );
    }
    wait_until("the upstream connections were released", WITHIN, || {
        up.open() == 0
    })
    .await;
    // Every stream on it was stuck: the connection is closed too.
    let closed = tokio::time::timeout(WITHIN, conn).await;
    assert!(
        closed.is_ok(),
        "the connection whose every stream was stuck is closed"
    );
    println!(
        "{STREAMS} stuck streams reset, their upstream connections released and the \
         connection closed {:?} after the last answer's head (client timeout {CLIENT_TIMEOUT})",
        started.elapsed()
    );
    // The gateway serves the same answer to a client that reads it.
    let read = Http::new()
        .send("GET", &gw.url("/v1/report"), &[], "")
        .await;
    assert_eq!(read.status, 200);
    assert_eq!(read.body.len(), 300 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_to_a_client_that_never_reads_hold_bounded_memory() {
    const STREAMS: usize = 50;
    const ANSWER: usize = 2 * 1024 * 1024;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}/idem.db", dir.path().display());
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", &store, "--client-timeout", CLIENT_TIMEOUT],
    )
    .await;
    let key = new_key();
    let size = ANSWER.to_string();
    let first = Http::new()
        .post(
            &gw.url("/v1/exports"),
            &key,
            "{}",
            &[("x-test-body-bytes", &size)],
        )
        .await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), ANSWER);
    // A replay read whole first, so that what is measured is the stuck streams'.
    let warm = Http::new()
        .post(
            &gw.url("/v1/exports"),
            &key,
            "{}",
            &[("x-test-body-bytes", &size)],
        )
        .await;
    assert!(warm.replayed());
    let before = vm_rss_kib(gw.pid());

    let (mut send, _conn) = shut_window_client(gw.addr).await;
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let req = http::Request::post(gw.url("/v1/exports"))
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .header("x-test-body-bytes", &size)
            .body(())
            .unwrap();
        streams.push(open_stream(&mut send, req, Some(Bytes::from_static(b"{}"))).await);
    }
    // Measure while the first replays are stuck, well within the client timeout.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let during = vm_rss_kib(gw.pid());
    let grown = during.saturating_sub(before);
    println!(
        "{STREAMS} stuck replays of a {} MiB answer: VmRSS {} MiB before, {} MiB while \
         stuck (+{} MiB)",
        ANSWER >> 20,
        before >> 10,
        during >> 10,
        grown >> 10,
    );
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for stream in streams {
        let stuck = stream.await.unwrap().expect("the answer's head arrives");
        *statuses.entry(stuck.status).or_default() += 1;
        assert_eq!(stuck.reset, Some(true), "every stuck stream is reset");
    }
    let after = vm_rss_kib(gw.pid());
    println!(
        "VmRSS {} MiB after the resets; answers {statuses:?}",
        after >> 10
    );
    assert_eq!(up.total(), 1, "no replay called the upstream");
    // Each waited for room in its connection's budget, then replayed, then was reset.
    assert_eq!(
        statuses,
        [(201, STREAMS)].into(),
        "every stream got the replay in its turn"
    );
    // Without a bound the 50 replays grew it by 100 MiB; the default budget is 16 MiB.
    assert!(
        grown < 48 * 1024,
        "the stuck replays grew the gateway by {} MiB",
        grown >> 10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_at_the_connection_cap_do_not_lock_out_a_new_one() {
    const CAP: usize = 4;
    let up = CountingUpstream::start(300 * 1024).await;
    let dir = tempfile::tempdir().unwrap();
    let cap = CAP.to_string();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--client-timeout",
            CLIENT_TIMEOUT,
            "--max-connections",
            &cap,
        ],
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..CAP {
        let (mut send, conn) = shut_window_client(gw.addr).await;
        let stream = open_stream(&mut send, get(&gw, "/v1/report"), None).await;
        clients.push((send, conn, stream));
    }
    wait_until("every client's stream reached the upstream", WITHIN, || {
        up.open() == CAP
    })
    .await;
    // The cap is full of clients that never read; a new one is served once the
    // client timeout has cut them.
    let started = Instant::now();
    let served = tokio::time::timeout(
        WITHIN,
        Http::new().send("GET", &gw.url("/v1/report"), &[], ""),
    )
    .await
    .expect("a new client is served while the cap is full of clients that never read");
    assert_eq!(served.status, 200);
    assert_eq!(served.body.len(), 300 * 1024);
    println!(
        "a new client was served {:?} after {CAP} never-reading clients filled --max-connections {CAP}",
        started.elapsed()
    );
    drop(clients);
}

/// Keyed requests multiplexed on one HTTP/2 connection, most of them waiting on the
/// store with their reservation, never crowd out an executed answer: the reservations
/// of two requests fill the default budget (two of the 8 MiB response limit), and yet
/// every small answer executed meanwhile is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_never_refuse_small_executed_answers_on_one_connection() {
    const KEYS: usize = 200;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &[]).await;
    // One client, one HTTP/2 connection: every request multiplexes on it.
    let http = Http::speaking(crate::common::Proto::H2c);
    let url = gw.url("/v1/charges");
    let mut tasks = Vec::new();
    let keys: Vec<String> = (0..KEYS).map(|_| new_key()).collect();
    for (i, key) in keys.iter().enumerate() {
        let (http, url, key) = (http.clone(), url.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let body = format!(r#"{{"order":{i}}}"#);
            http.post(&url, &key, &body, &[("x-test-delay-ms", "5")])
                .await
                .status
        }));
    }
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for t in tasks {
        *statuses.entry(t.await.unwrap()).or_default() += 1;
    }
    assert_eq!(
        statuses,
        [(201, KEYS)].into(),
        "every execution was answered"
    );
    assert_eq!(up.total(), KEYS);
    for k in &keys {
        assert_eq!(up.started(k), 1);
    }
}
