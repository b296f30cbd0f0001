//! The edge under hostile clients: connections and file descriptors, bodies that break
//! off on pass-through traffic, and early answers to clients that send their whole body
//! before they read.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Gateway, Http, Upstream, metric, metrics, new_key, read_message};

/// Reads until the peer closes; `Err` if it reset the connection instead.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> std::io::Result<Vec<u8>> {
    let mut got = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut got))
        .await
        .expect("the gateway never closed the connection")?;
    Ok(got)
}

/// The "done when": idle admin sockets beyond the process's file descriptors
/// cannot starve the proxy. 300 idle admin connections under a limit of 256: the admin
/// listener accepts only its own few, the rest wait in the kernel's backlog holding no
/// descriptor of the gateway's, and a keyed request on the proxy is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_sockets_at_the_fd_limit_leave_the_proxy_answering() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start_with_fd_limit(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "0"],
        "-n 256",
    )
    .await;
    let admin = gw.admin.unwrap();
    let mut idle = Vec::new();
    for _ in 0..300 {
        let s = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(admin))
            .await
            .expect("the kernel completes the handshake from its backlog")
            .unwrap();
        idle.push(s);
    }
    // Whatever the admin listener took, it has taken by now.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let key = new_key();
    let http = Http::new();
    // A starved proxy never answers; ten seconds tell that from a loaded machine.
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        http.post(&gw.url("/v1/charges"), &key, "{}", &[]),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer within ten seconds:\n{}", gw.logs()));
    assert_eq!(answer.status, 201);
    assert_eq!(up.started(&key), 1);
    assert!(
        !gw.logs().contains("accept failed"),
        "the proxy ran out of descriptors:\n{}",
        gw.logs()
    );
    drop(idle);
}

/// At start the soft open-file limit is raised to the hard one, and the proxy's
/// connection cap derived from it; the log says both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_fd_limit_is_raised_to_the_hard_one_and_the_cap_derived_from_it() {
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The memory store on every run: the cap below leaves no descriptors for a
    // store's connections, as only the memory store has none.
    let gw = Gateway::start_with_fd_limit(
        &up.url(),
        dir.path(),
        &["--store", crate::common::MEMORY_KEPT, "--admin", "0"],
        "-Sn 256",
    )
    .await;
    let logs = gw.logs();
    assert!(
        logs.contains(&format!("open_file_limit={hard}")),
        "raised to {hard}:\n{logs}"
    );
    let derived = idem_gateway::serve::default_max_connections(hard, 0, true);
    assert!(
        logs.contains(&format!("max_connections={derived}")),
        "{derived}:\n{logs}"
    );
    let http = Http::new();
    let text = metrics(&http, &gw).await;
    assert_eq!(
        metric(&text, "idem_connections_max{listener=\"proxy\"}"),
        Some(derived as u64),
        "{text}"
    );
}

/// The admin listener has the proxy's `--client-timeout` when it is under 5 s: a
/// connection that sends
/// nothing, and one that idles after a request, are closed after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_connections_are_closed_after_the_client_timeout() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--admin",
            "0",
            "--client-timeout",
            "2s",
        ],
    )
    .await;
    let admin = gw.admin.unwrap();

    let mut silent = TcpStream::connect(admin).await.unwrap();
    let got = read_until_closed(&mut silent, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));

    let mut kept = TcpStream::connect(admin).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_message(&mut kept).await.expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, b"ok\n");
    let rest = read_until_closed(&mut kept, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}

/// Idle admin connections cannot lock out the probes: with the default 30 s
/// `--client-timeout`, 40 silent connections (more than the admin listener's 32
/// places) are cut after the admin listener's own 5 s bound, so `/readyz` and
/// `/metrics` answer within it (12 s allowed here, well under the 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_connections_do_not_lock_out_the_probes() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "0"],
    )
    .await;
    let admin = gw.admin.unwrap();
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(admin).await.unwrap());
    }
    // Let the admin listener take the first 32 into its places.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let http = Http::new();
    for path in ["/readyz", "/metrics"] {
        let probe = tokio::time::timeout(
            Duration::from_secs(12),
            http.send("GET", &gw.admin_url(path), &[], ""),
        )
        .await
        .unwrap_or_else(|_| panic!("{path} locked out by idle admin connections"));
        assert_eq!(probe.status, 200, "{path}: {probe:?}");
    }
    drop(idle);
}

/// Issue 54: 48 idle sockets on the admin port (a leaky scraper, a noisy neighbour),
/// more than its places, used to hold `/healthz` off until their timeout (4.7 s), past
/// Kubernetes' 1 s probe timeout. At its cap the admin listener now closes its
/// longest-idle connection to admit a new one, so the probe is answered within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_within_a_second_with_48_idle_admin_connections() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "0"],
    )
    .await;
    let admin = gw.admin.unwrap();
    let mut idle = Vec::new();
    for _ in 0..48 {
        idle.push(TcpStream::connect(admin).await.unwrap());
    }
    let http = Http::new();
    let probe = tokio::time::timeout(
        Duration::from_secs(1),
        http.send("GET", &gw.admin_url("/healthz"), &[], ""),
    )
    .await
    .expect("/healthz answers within Kubernetes' 1 s probe timeout");
    assert_eq!(probe.status, 200, "{probe:?}");
    drop(idle);
}

/// `--max-connections 4`: a fifth connection is not accepted while four are open; it
/// is served once one of them closes, and `/metrics` shows the cap and the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_a_further_connection_waits_until_one_closes() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--admin",
            "0",
            "--client-timeout",
            "60s",
            "--max-connections",
            "4",
        ],
    )
    .await;
    let http = Http::new();
    let get = b"GET /v1/things HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(get).await.unwrap();
        let (head, _) = read_message(&mut s).await.expect("served");
        assert!(head.starts_with("HTTP/1.1 201"), "{head}");
        open.push(s);
    }
    let text = metrics(&http, &gw).await;
    assert_eq!(
        metric(&text, "idem_connections_open{listener=\"proxy\"}"),
        Some(4),
        "{text}"
    );
    assert_eq!(
        metric(&text, "idem_connections_max{listener=\"proxy\"}"),
        Some(4),
        "{text}"
    );
    // The listener reached its cap with the fourth, and waits.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metric(
        &metrics(&http, &gw).await,
        "idem_connection_waits_total{listener=\"proxy\"}",
    ) < Some(1)
    {
        assert!(tokio::time::Instant::now() < deadline, "no wait counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut fifth = TcpStream::connect(gw.addr).await.unwrap();
    fifth.write_all(get).await.unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), fifth.read(&mut byte))
            .await
            .is_err(),
        "the fifth connection was served while four were open"
    );
    assert_eq!(up.total(), 4);

    drop(open.pop());
    let (head, _) = tokio::time::timeout(Duration::from_secs(10), read_message(&mut fifth))
        .await
        .expect("the fifth connection is served once one closes")
        .expect("an answer");
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    assert_eq!(up.total(), 5);
    let text = metrics(&http, &gw).await;
    assert_eq!(
        metric(&text, "idem_connections_open{listener=\"proxy\"}"),
        Some(4),
        "{text}"
    );
    assert_eq!(
        metric(&text, "idem_connections_max{listener=\"admin\"}"),
        Some(32),
        "{text}"
    );
    assert!(!gw.logs().contains("accept failed"), "{}", gw.logs());
}

/// Upstream failures counted so far, of every kind.
fn upstream_errors(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("idem_upstream_errors_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// What the gateway answered on `s` before it closed: the status line, or `None` when
/// it closed (or reset) without an answer.
async fn status_line_or_close(s: &mut TcpStream) -> Option<String> {
    let got = match read_until_closed(s, Duration::from_secs(10)).await {
        Ok(got) => got,
        Err(_) => return None,
    };
    let text = String::from_utf8_lossy(&got).into_owned();
    (!text.is_empty()).then(|| text.lines().next().unwrap().to_owned() + "\n" + &text)
}

/// A pass-through request whose chunked body breaks (a chunk size that is no number)
/// is the client's fault: a 400 `body-unreadable`, never the 504 that tells the client
/// to retry with the same key, and no upstream error in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_chunk_on_a_pass_through_request_is_the_clients_fault() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "0"],
    )
    .await;
    let http = Http::new();
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(
        b"POST /v1/uploads HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
          5\r\nhello\r\nzz\r\nmore\r\n",
    )
    .await
    .unwrap();
    // The client is still there to read it.
    let answer = status_line_or_close(&mut s)
        .await
        .expect("an answer before the close");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("https://idem.dev/problems/body-unreadable"),
        "{answer}"
    );
    let text = metrics(&http, &gw).await;
    assert_eq!(upstream_errors(&text), 0, "{text}");
}

/// A pass-through upload abandoned halfway (the client sends part of what its
/// `Content-Length` announced, then stops sending) is the client's fault too: a 400 if
/// the gateway still answers on the half-closed connection, else a close, and no
/// upstream error either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_abandoned_halfway_on_a_pass_through_request_is_the_clients_fault() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "0"],
    )
    .await;
    let http = Http::new();
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST /v1/uploads HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nonly a part")
        .await
        .unwrap();
    // Give the gateway time to forward the head and the part: the upstream is reading
    // the body when it breaks off.
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.shutdown().await.unwrap();
    if let Some(answer) = status_line_or_close(&mut s).await {
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    let text = metrics(&http, &gw).await;
    assert_eq!(upstream_errors(&text), 0, "{text}");
}

/// A connection whose send buffer is small, as over a real network: a body much larger
/// cannot sit in the client's kernel while the gateway reads none of it.
async fn connect_with_small_send_buffer(addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(64 * 1024).unwrap();
    socket.connect(addr).await.unwrap()
}

/// Writes `len` bytes of body to `s` in 64 KiB writes; the bytes written before the
/// first write that failed.
async fn write_body(s: &mut TcpStream, len: usize) -> Result<(), usize> {
    let chunk = vec![b'x'; 64 * 1024];
    let mut written = 0;
    while written < len {
        let n = chunk.len().min(len - written);
        if s.write_all(&chunk[..n]).await.is_err() {
            return Err(written);
        }
        written += n;
    }
    Ok(())
}

/// The client of the issue: it writes a 3 MiB body under a 64 KiB limit before it
/// reads anything (as Python's `http.client` does). The gateway answers 413 early and
/// reads the rest away, so the client's writes all succeed and it reads the 413, not
/// a reset; nothing went upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_413_is_read_by_a_client_that_writes_its_whole_body_first() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--body-limit", "64KiB"],
    )
    .await;
    let len = 3 * 1024 * 1024;
    let key = new_key();
    let mut s = connect_with_small_send_buffer(gw.addr).await;
    s.write_all(
        format!(
            "POST /v1/charges HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\n\
             content-type: application/octet-stream\r\ncontent-length: {len}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let written = tokio::time::timeout(Duration::from_secs(10), write_body(&mut s, len))
        .await
        .expect("the gateway reads the body away");
    let (head, body) = tokio::time::timeout(Duration::from_secs(10), read_message(&mut s))
        .await
        .expect("an answer in time")
        .expect("the 413, not a reset");
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(
        String::from_utf8_lossy(&body).contains("https://idem.dev/problems/body-too-large"),
        "{head}"
    );
    assert_eq!(written, Ok(()), "every write went through");
    assert_eq!(up.total(), 0);
}

/// The same for the 400s answered from the head alone: a missing key (under
/// `--require-key`) and an invalid one, on requests with a body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_400s_are_read_by_a_client_that_writes_its_whole_body_first() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--require-key"],
    )
    .await;
    let len = 1024 * 1024;
    for (key_header, problem) in [
        ("", "missing-key"),
        ("idempotency-key: \"not a key\r\n", "invalid-key"),
    ] {
        let mut s = connect_with_small_send_buffer(gw.addr).await;
        s.write_all(
            format!(
                "POST /v1/charges HTTP/1.1\r\nhost: x\r\n{key_header}\
                 content-length: {len}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let written = tokio::time::timeout(Duration::from_secs(10), write_body(&mut s, len))
            .await
            .expect("the gateway reads the body away");
        let (head, body) = tokio::time::timeout(Duration::from_secs(10), read_message(&mut s))
            .await
            .expect("an answer in time")
            .unwrap_or_else(|| panic!("the {problem} 400, not a reset"));
        assert!(head.starts_with("HTTP/1.1 400"), "{head}");
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.contains(&format!("https://idem.dev/problems/{problem}")),
            "{body}"
        );
        assert_eq!(
            written,
            Ok(()),
            "every write of the {problem} request went through"
        );
    }
    assert_eq!(up.total(), 0);
}

/// Reading a rejected body away is bounded: a client that goes on sending past the
/// bound has its connection closed, well before it has sent 64 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_rejected_body_away_is_bounded() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--body-limit", "64KiB"],
    )
    .await;
    let len = 64 * 1024 * 1024;
    let mut s = connect_with_small_send_buffer(gw.addr).await;
    s.write_all(
        format!(
            "POST /v1/charges HTTP/1.1\r\nhost: x\r\nidempotency-key: {}\r\n\
             content-length: {len}\r\n\r\n",
            new_key()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let written = tokio::time::timeout(Duration::from_secs(30), write_body(&mut s, len))
        .await
        .expect("the gateway stops reading, or closes, in time");
    assert!(
        written.is_err(),
        "the gateway read all of a 64 MiB body it had rejected"
    );
    assert_eq!(up.total(), 0);
}

/// A client that asks for a large answer and never reads it cannot hold its connection
/// (and its place under the cap) for ever: once the gateway's writes to it have made
/// no progress for the client timeout, the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_disconnected_after_the_client_timeout() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--admin",
            "0",
            "--client-timeout",
            "3s",
        ],
    )
    .await;
    let http = Http::new();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stalled = socket.connect(gw.addr).await.unwrap();
    stalled
        .write_all(b"GET /v1/exports HTTP/1.1\r\nhost: x\r\nx-test-body-bytes: 67108864\r\n\r\n")
        .await
        .unwrap();
    let open = |text: &str| metric(text, "idem_connections_open{listener=\"proxy\"}");
    // The client timeout leaves a loaded machine's metrics polls time to see the
    // connection open before it closes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen_open = false;
    loop {
        let n = open(&metrics(&http, &gw).await);
        seen_open |= n == Some(1);
        if seen_open && n == Some(0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the connection of a client that reads nothing is still open ({n:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It was closed, not finished: far less than the answer was sent.
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf)).await
    {
        if n == 0 {
            break;
        }
        got += n;
    }
    assert!(got < 64 * 1024 * 1024, "read {got} bytes");
}

/// Every error of the admin listener is an RFC 9457 problem with a type under
/// `https://idem.dev/problems/`: a missing token (401), a key query it cannot use
/// (400), a listing it cannot use (400), no record (404), no route (404) and a method
/// the route does not take (405).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_errors_are_problems() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "0"],
        &[("IDEM_ADMIN_TOKEN", "s3cret")],
    )
    .await;
    let http = Http::new();
    let auth = [("authorization", "Bearer s3cret")];
    /// A request (method, path, headers) and the problem it gets (status, slug).
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], u16, &'a str);
    let cases: [Case; 8] = [
        ("GET", "/metrics", &[], 401, "admin-token-required"),
        ("DELETE", "/keys?key=k", &[], 401, "admin-token-required"),
        ("GET", "/keys?key=nope", &auth, 404, "no-record"),
        ("DELETE", "/keys?key=nope", &auth, 404, "no-record"),
        ("DELETE", "/keys", &auth, 400, "bad-key-query"),
        ("GET", "/keys?key=k&bogus=1", &auth, 400, "bad-key-query"),
        ("GET", "/keys?state=weird", &auth, 400, "bad-listing"),
        ("GET", "/nowhere", &auth, 404, "no-admin-route"),
    ];
    for (method, path, headers, status, slug) in cases {
        let a = http.send(method, &gw.admin_url(path), headers, "").await;
        assert_eq!(a.status, status, "{method} {path}: {a:?}");
        assert_eq!(
            a.header("content-type"),
            Some("application/problem+json"),
            "{method} {path}"
        );
        let body = a.json();
        assert_eq!(body["type"], format!("https://idem.dev/problems/{slug}"));
        assert_eq!(body["status"], status);
        assert!(
            body["title"].is_string() && body["detail"].is_string(),
            "{body}"
        );
        if status == 401 {
            assert_eq!(a.header("www-authenticate"), Some("Bearer"));
        }
    }
    let a = http
        .send("POST", &gw.admin_url("/metrics"), &auth, "")
        .await;
    assert_eq!(a.status, 405, "{a:?}");
    assert_eq!(
        a.problem_type(),
        "https://idem.dev/problems/admin-method-not-allowed"
    );
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert!(
        a.header("allow").is_some_and(|v| v.contains("GET")),
        "{a:?}"
    );
}
