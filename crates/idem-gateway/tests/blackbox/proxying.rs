//! The proxy's own duties: forwarded headers, attempt numbers, upstream failures, the
//! admin listener and `idem keys`.

use std::time::Duration;

use crate::common::{
    self, Gateway, Http, Upstream, binary, new_key, over_both_protocols, read_message,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_with_attempt_and_forwarded_headers_and_strips_hop_by_hop() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let http = Http::new();
    let key = new_key();
    let a = http
        .post(
            &gw.url("/v1/charges?expand=customer"),
            &key,
            "{}",
            &[
                ("connection", "x-hop"),
                ("x-hop", "secret"),
                ("idempotency-attempt", "99"),
                ("x-forwarded-for", "203.0.113.7"),
            ],
        )
        .await;
    assert_eq!(a.status, 201);
    let seen = up.seen();
    let h = &seen[0].headers;
    assert_eq!(seen[0].path, "/v1/charges");
    assert_eq!(h["idempotency-key"], key.as_str(), "the key passes through");
    assert_eq!(
        h["idempotency-attempt"], "1",
        "the client cannot forge the attempt"
    );
    assert_eq!(h["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    let fwd = h["forwarded"].to_str().unwrap();
    assert!(fwd.starts_with("for=127.0.0.1;proto=http;host="), "{fwd}");
    assert_eq!(h["x-forwarded-host"], gw.addr.to_string().as_str());
    assert!(
        h.get("x-hop").is_none(),
        "named by Connection, so hop-by-hop"
    );
    // Unkeyed requests carry no attempt number.
    http.send("GET", &gw.url("/v1/charges"), &[], "").await;
    assert!(up.seen()[1].headers.get("idempotency-attempt").is_none());
}

/// A client's `Forwarded` that does not parse (an open quote) is dropped: the upstream
/// sees the gateway's element alone, never inside the client's quoted-string; a valid
/// one, in two fields, is kept as one list before it. `X-Forwarded-For` likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_client_forwarded_is_dropped_before_the_gateways_element() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let http = Http::new();
    let ours = format!("for=127.0.0.1;proto=http;host=\"{}\"", gw.addr);
    // What the client sends; the Forwarded and the X-Forwarded-For the upstream gets.
    type Case<'a> = (&'a [(&'a str, &'a str)], String, &'a str);
    let cases: [Case; 3] = [
        (
            &[
                ("forwarded", r#"for="6.6.6.6"#),
                ("x-forwarded-for", "6.6.6.6, \"evil"),
            ],
            ours.clone(),
            "127.0.0.1",
        ),
        (
            &[
                ("forwarded", r#"for="6.6.6.6\"#),
                ("x-forwarded-for", "6.6.6.6 7.7.7.7"),
            ],
            ours.clone(),
            "127.0.0.1",
        ),
        (
            &[
                ("forwarded", "for=192.0.2.1"),
                ("forwarded", r#"for="[2001:db8::1]""#),
                ("x-forwarded-for", "192.0.2.1"),
                ("x-forwarded-for", "2001:db8::1"),
            ],
            format!(r#"for=192.0.2.1, for="[2001:db8::1]", {ours}"#),
            "192.0.2.1, 2001:db8::1, 127.0.0.1",
        ),
    ];
    for (i, (sent, forwarded, xff)) in cases.iter().enumerate() {
        let key = new_key();
        let a = http.post(&gw.url("/v1/charges"), &key, "{}", sent).await;
        assert_eq!(a.status, 201, "{sent:?}");
        let seen = up.seen();
        let h = &seen[i].headers;
        let got: Vec<_> = h.get_all("forwarded").iter().collect();
        assert_eq!(got, [forwarded.as_str()], "{sent:?}");
        let got: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(got, [*xff], "{sent:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_502_and_releases_the_key() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &format!("http://127.0.0.1:{port}"),
        dir.path(),
        &["--store", "memory://", "--admin", "0", "--admin-open"],
    )
    .await;
    let http = Http::new();
    let key = new_key();
    let a = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(a.status, 502);
    assert_eq!(
        a.problem_type(),
        "https://idem.dev/problems/upstream-unreachable"
    );
    let text = common::metrics(&http, &gw).await;
    assert!(
        text.contains("idem_upstream_errors_total{kind=\"unreachable\"} 1"),
        "counted once: {text}"
    );
    // Released: no record is left, and a retry tries the upstream again (502, not 409).
    let rec = http
        .send(
            "GET",
            &gw.admin_url(&format!("/keys?key={key}&endpoint=POST%20/v1/charges")),
            &[],
            "",
        )
        .await;
    assert_eq!(rec.status, 404, "{rec:?}");
    let b = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(b.status, 502);
    assert_eq!(b.header("access-control-allow-origin"), None);
    // A page on another origin can read why: the gateway made this answer, not the
    // upstream, whose preflight let the request through.
    let c = http
        .post(
            &gw.url("/v1/charges"),
            &key,
            "{}",
            &[("origin", "https://shop.example")],
        )
        .await;
    assert_eq!(c.status, 502);
    assert_eq!(
        c.header("access-control-allow-origin"),
        Some("https://shop.example")
    );
    assert_eq!(c.header("access-control-allow-credentials"), Some("true"));
}

/// Without the layer (`--passthrough`), an unreachable upstream is answered all the
/// same: a 502 in the gateway's profile, counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_gateway_answers_an_unreachable_upstream_in_its_profile() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &format!("http://127.0.0.1:{port}"),
        dir.path(),
        &["--passthrough", "--profile", "stripe", "--admin", "0"],
    )
    .await;
    let http = Http::new();
    let a = http
        .post(&gw.url("/v1/charges"), &new_key(), "{}", &[])
        .await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!(a.json()["error"]["type"], "api_error");
    assert_eq!(
        a.json()["error"]["doc_url"],
        "https://idem.dev/problems/upstream-unreachable"
    );
    let text = common::metrics(&http, &gw).await;
    assert!(
        text.contains("idem_upstream_errors_total{kind=\"unreachable\"} 1"),
        "counted once: {text}"
    );
}

over_both_protocols! {
async fn upstream_timeout_is_504_and_keeps_the_key_in_progress(proto: Proto) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--upstream-timeout",
            "300ms",
            "--admin",
            "0",
            "--admin-open",
        ],
    )
    .await;
    let http = Http::speaking(proto);
    let key = new_key();
    let url = gw.url("/v1/charges");
    let a = http
        // Far past the timeout, so that the timeout ends it even when a loaded machine
        // runs the gateway's timer late.
        .post(&url, &key, "{}", &[("x-test-delay-ms", "5000")])
        .await;
    assert_eq!(a.status, 504);
    assert_eq!(
        a.problem_type(),
        "https://idem.dev/problems/upstream-timeout"
    );
    // Outcome unknown: the retry must not execute while the lease is alive.
    let b = http.post(&url, &key, "{}", &[]).await;
    assert_eq!(b.status, 409, "{b:?}");
    let rec = http
        .send(
            "GET",
            &gw.admin_url(&format!("/keys?key={key}&endpoint=POST%20/v1/charges")),
            &[],
            "",
        )
        .await;
    assert_eq!(rec.status, 200);
    assert_eq!(rec.json()["record"]["state"], "in_progress");
    assert_eq!(up.started(&key), 1);
}
}

/// How [`breaking_upstream`] breaks a connection once it has read the request.
#[derive(Debug, Clone, Copy)]
enum Break {
    /// Closes it without a word.
    Silently,
    /// Sends the status line, headers and part of the announced body, then closes.
    MidBody,
}

/// An upstream that answers in HTTP/1.0 (Python's `http.server` does) must not make
/// the gateway answer its HTTP/1.1 clients in HTTP/1.0 and drop their keep-alive
/// connections: keyed and unkeyed answers come back as HTTP/1.1, one after the other on
/// one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_keep_the_clients_http_version() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = format!("http://{}", listener.local_addr().unwrap());
    let upstream = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            if read_message(&mut conn).await.is_some() {
                let answer = "HTTP/1.0 201 Created\r\ncontent-type: application/json\r\n\
                              content-length: 2\r\n\r\n{}";
                let _ = conn.write_all(answer.as_bytes()).await;
            }
            let _ = conn.shutdown().await;
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up, dir.path(), &["--store", "memory://"]).await;
    let mut client = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    for (i, key) in [Some(new_key()), None, Some(new_key())].iter().enumerate() {
        let key = key
            .as_ref()
            .map_or(String::new(), |k| format!("idempotency-key: {k}\r\n"));
        let request = format!(
            "POST /v1/charges HTTP/1.1\r\nhost: x\r\n{key}content-type: application/json\r\n\
             content-length: 2\r\n\r\n{{}}"
        );
        client.write_all(request.as_bytes()).await.unwrap();
        let (head, body) = read_message(&mut client)
            .await
            .unwrap_or_else(|| panic!("request {i}: the gateway closed the connection"));
        assert!(head.starts_with("HTTP/1.1 201"), "request {i}: {head}");
        assert!(!head.to_lowercase().contains("connection: close"), "{head}");
        assert_eq!(body, b"{}");
    }
    upstream.abort();
}

/// A raw HTTP/1.1 upstream that reads each request whole, notes its
/// `Idempotency-Attempt`, breaks the first connection as `how` says and answers later
/// ones `201` with the attempt number in a JSON body.
async fn breaking_upstream(
    how: Break,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let attempts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            // The head, then as much body as it announces.
            let Some((head, _)) = read_message(&mut conn).await else {
                continue;
            };
            let head = head.to_lowercase();
            let field = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_owned())
            };
            let attempt = field("idempotency-attempt:").unwrap_or_default();
            let first = {
                let mut seen = seen.lock().unwrap();
                seen.push(attempt.clone());
                seen.len() == 1
            };
            let answer = if !first {
                let body = format!(r#"{{"attempt":"{attempt}"}}"#);
                format!(
                    "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                match how {
                    Break::Silently => String::new(),
                    Break::MidBody => "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                         content-length: 100\r\n\r\n{\"id\":"
                        .to_owned(),
                }
            };
            let _ = conn.write_all(answer.as_bytes()).await;
            let _ = conn.shutdown().await;
        }
    });
    (url, attempts, task)
}

over_both_protocols! {
/// SPEC S7 at the proxy: a connection that breaks after the request was sent leaves the
/// outcome unknown. The client hears 504, the key stays in progress (409) while the
/// attempt's lease lives, and then a retry executes as attempt 2, whose answer is the
/// one replayed. Whether the upstream hung up before answering or in the middle of its
/// body makes no difference.
async fn upstream_connection_lost_is_504_then_the_lease_decides(proto: Proto) {
    for how in [Break::Silently, Break::MidBody] {
        let (up, attempts, task) = breaking_upstream(how).await;
        let dir = tempfile::tempdir().unwrap();
        // The lease outlives the next request's round trip on a loaded machine.
        let gw = Gateway::start(&up, dir.path(), &["--store", "memory://", "--lease", "3s"]).await;
        let http = Http::speaking(proto);
        let key = new_key();
        let url = gw.url("/v1/charges");

        let lost = http.post(&url, &key, "{}", &[]).await;
        assert_eq!(lost.status, 504, "{how:?}: {lost:?}");
        assert_eq!(
            lost.problem_type(),
            "https://idem.dev/problems/upstream-connection-lost",
            "{how:?}"
        );
        let blocked = http.post(&url, &key, "{}", &[]).await;
        assert_eq!(
            blocked.status, 409,
            "{how:?}: in progress while the lease lives"
        );

        let taken_over = http.post_once_the_lease_lapses(&url, &key).await;
        assert_eq!(taken_over.status, 201, "{how:?}: {taken_over:?}");
        assert_eq!(taken_over.json()["attempt"], "2", "{how:?}");
        let replay = http.post(&url, &key, "{}", &[]).await;
        assert!(replay.replayed(), "{how:?}");
        assert_eq!(replay.body, taken_over.body, "{how:?}");
        assert_eq!(*attempts.lock().unwrap(), ["1", "2"], "{how:?}");
        task.abort();
    }
}
}

/// A client that does not finish a request head within `--client-timeout` is
/// disconnected, and so is a keep-alive connection left idle that long; a keyed body
/// that does not arrive within it is a 408; a client that keeps sending requests is
/// not disconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_disconnected_after_the_client_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        // Long enough that a loaded machine's scheduling delays never add up to it
        // between two requests of the busy connection below.
        &["--store", "memory://", "--client-timeout", "2s"],
    )
    .await;
    // Reads until the gateway closes the connection; returns what it sent and when.
    let until_closed = |mut s: tokio::net::TcpStream| async move {
        let started = tokio::time::Instant::now();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("the gateway never closed the connection")
            .ok();
        (
            String::from_utf8_lossy(&got).into_owned(),
            started.elapsed(),
        )
    };

    // Half a request head, then nothing.
    let mut slow = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    slow.write_all(b"POST /v1/charges HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let (_, after) = until_closed(slow).await;
    assert!(
        after >= Duration::from_millis(1600),
        "closed after {after:?}"
    );

    // A keyed request's head, then part of its body: 408, nothing forwarded, and the
    // key stays free.
    let key = new_key();
    let mut trickle = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    trickle
        .write_all(
            format!(
                "POST /v1/charges HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\n\
                 content-type: application/json\r\ncontent-length: 20\r\n\r\n{{\"amount\""
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (answer, after) = until_closed(trickle).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("https://idem.dev/problems/body-timeout"),
        "{answer}"
    );
    assert!(
        after >= Duration::from_millis(1600),
        "answered after {after:?}"
    );
    assert_eq!(up.total(), 0, "nothing was forwarded");
    let http = Http::new();
    let retry = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(retry.status, 201, "the key was never reserved");

    // One whole request answered, then the connection idles.
    let mut idle = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    idle.write_all(b"GET /v1/charges HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let (answer, after) = until_closed(idle).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(
        after >= Duration::from_millis(1600),
        "closed after {after:?}"
    );

    // Requests more often than the timeout keep one connection alive: each is
    // answered on it, 3 s after it opened.
    let mut busy = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    for _ in 0..6 {
        busy.write_all(b"GET /v1/charges HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let (head, body) = read_message(&mut busy).await.expect("closed while in use");
        assert!(head.starts_with("HTTP/1.1 201"), "{head}");
        assert!(!body.is_empty(), "the whole answer, as announced: {head}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The value of an unlabelled metric in a Prometheus text exposition, which must
/// have it.
fn metric(text: &str, name: &str) -> u64 {
    common::metric(text, name).unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
}

/// `/metrics` carries the SQLite store's own figures: an executed request is two writes
/// (the reservation and the completion), a replay one (its reserve), and none is left
/// queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_metrics_show_the_sqlite_writer() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "sqlite://idem.db", "--admin", "0"],
    )
    .await;
    let http = Http::new();
    let metrics = || common::metrics(&http, &gw);
    // The sweeper purges once at start: wait for that transaction, so that what
    // follows counts only the request's writes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let before = loop {
        let text = metrics().await;
        if metric(&text, "idem_sqlite_write_transactions_total") >= 1
            && metric(&text, "idem_sqlite_pending_writes") == 0
        {
            break text;
        }
        assert!(tokio::time::Instant::now() < deadline, "no purge at start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(before.contains("# TYPE idem_sqlite_writes_total counter\n"));
    assert!(before.contains("# TYPE idem_sqlite_pending_writes gauge\n"));

    let writes = |text: &str| metric(text, "idem_sqlite_writes_total");
    let key = new_key();
    let a = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(a.status, 201);
    let executed = metrics().await;
    assert_eq!(
        writes(&executed) - writes(&before),
        2,
        "the reservation and the completion"
    );
    let replay = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert!(replay.replayed());
    let after = metrics().await;
    assert_eq!(
        writes(&after) - writes(&executed),
        1,
        "the replay's reserve, which finds the record, goes through the writer too"
    );
    assert_eq!(metric(&after, "idem_sqlite_pending_writes"), 0);
    assert_eq!(
        metric(&after, "idem_sqlite_failed_write_transactions_total"),
        0
    );
    assert!(metric(&after, "idem_sqlite_pool_connections") >= 1);
}

/// The admin token can come from a file (its line end dropped), and a token that is
/// empty, blank, or given twice stops the gateway before it listens, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_file_is_honoured_and_an_empty_token_is_refused_at_start() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, "fr0m-a-file\n").unwrap();
    let token_path = token_file.to_str().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--admin",
            "0",
            "--admin-token-file",
            token_path,
        ],
    )
    .await;
    let http = Http::new();
    let metrics = gw.admin_url("/metrics");
    assert_eq!(http.send("GET", &metrics, &[], "").await.status, 401);
    let wrong = [("authorization", "Bearer fr0m-a-fil")];
    assert_eq!(http.send("GET", &metrics, &wrong, "").await.status, 401);
    let right = [("authorization", "Bearer fr0m-a-file")];
    assert_eq!(http.send("GET", &metrics, &right, "").await.status, 200);
    drop(gw);

    let blank = dir.path().join("blank-token");
    std::fs::write(&blank, "  \n").unwrap();
    let serve = [
        "serve",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "memory://",
    ];
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (&["--admin-token", ""], &[], "empty"),
        (
            &["--admin-token-file", blank.to_str().unwrap()],
            &[],
            "empty",
        ),
        (&[], &[("IDEM_ADMIN_TOKEN", "   ")], "empty"),
        (
            &["--admin-token", "t0k", "--admin-token-file", token_path],
            &[],
            "not both",
        ),
    ];
    for (args, env, says) in cases {
        let mut cmd = tokio::process::Command::new(binary());
        cmd.args(serve).args(["--listen", "127.0.0.1:0"]).args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("IDEM_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied()).kill_on_drop(true);
        // A gateway that started anyway would never exit: bounded.
        let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("{args:?} {env:?}: the gateway started"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?} {env:?}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_serves_probes_metrics_and_keys_behind_a_token() {
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
            "--admin-token",
            "t0k",
        ],
    )
    .await;
    assert!(gw.admin.unwrap().ip().is_loopback());
    let http = Http::new();
    let key = new_key();
    let url = gw.url("/v1/charges");
    http.post(&url, &key, "{}", &[]).await;
    http.post(&url, &key, "{}", &[]).await;
    http.post(&url, &key, r#"{"x":1}"#, &[]).await;
    http.send("GET", &url, &[], "").await;

    assert_eq!(
        http.send("GET", &gw.admin_url("/healthz"), &[], "")
            .await
            .status,
        200
    );
    assert_eq!(
        http.send("GET", &gw.admin_url("/readyz"), &[], "")
            .await
            .status,
        200
    );
    assert_eq!(
        http.send("GET", &gw.admin_url("/metrics"), &[], "")
            .await
            .status,
        401
    );
    let auth = [("authorization", "Bearer t0k")];
    let m = http.send("GET", &gw.admin_url("/metrics"), &auth, "").await;
    let text = String::from_utf8(m.body.to_vec()).unwrap();
    for line in [
        "idem_requests_total{outcome=\"executed\"} 1",
        "idem_requests_total{outcome=\"replayed\"} 1",
        "idem_requests_total{outcome=\"mismatch\"} 1",
        "idem_requests_total{outcome=\"passed_through\"} 1",
        "idem_in_flight_requests 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains("idem_store_call_duration_seconds_count{op=\"reserve\",ok=\"true\"}"));

    let show = gw.admin_url(&format!("/keys?key={key}&endpoint=POST%20/v1/charges"));
    let rec = http.send("GET", &show, &auth, "").await;
    assert_eq!(rec.status, 200);
    assert_eq!(rec.json()["record"]["state"], "completed");
    assert_eq!(rec.json()["record"]["response"]["status"], 201);
    assert_eq!(rec.json()["tenant"], "anonymous");
    assert_eq!(http.send("DELETE", &show, &auth, "").await.status, 200);
    assert_eq!(http.send("GET", &show, &auth, "").await.status, 404);
    // Purged: the key executes again.
    let again = http.post(&url, &key, "{}", &[]).await;
    assert!(!again.replayed());
    assert_eq!(up.started(&key), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_command_shows_and_purges_sqlite_records() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "sqlite://idem.db"]).await;
    let http = Http::new();
    let key = new_key();
    http.post(
        &gw.url("/v1/charges"),
        &key,
        "{}",
        &[("authorization", "Bearer sk_test")],
    )
    .await;
    gw.terminate().await;

    let run = |args: &[&str]| {
        std::process::Command::new(binary())
            .args(args)
            .current_dir(dir.path())
            .env("SK", "Bearer sk_test")
            .output()
            .unwrap()
    };
    let show = run(&[
        "keys",
        "show",
        &key,
        "--tenant-credential-env",
        "SK",
        "--endpoint",
        "POST /v1/charges",
        "--store",
        "sqlite://idem.db",
    ]);
    assert!(show.status.success(), "{show:?}");
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(v["record"]["state"], "completed");
    assert!(v["tenant"].as_str().unwrap().starts_with("hmac-sha256:"));
    assert!(!String::from_utf8_lossy(&show.stdout).contains("sk_test"));

    let wrong_tenant = run(&[
        "keys",
        "show",
        &key,
        "--endpoint",
        "POST /v1/charges",
        "--store",
        "sqlite://idem.db",
    ]);
    assert_eq!(wrong_tenant.status.code(), Some(1));

    let purge = run(&[
        "keys",
        "purge",
        &key,
        "--tenant",
        v["tenant"].as_str().unwrap(),
        "--endpoint",
        "POST /v1/charges",
        "--store",
        "sqlite://idem.db",
    ]);
    assert!(purge.status.success(), "{purge:?}");
    let gone = run(&[
        "keys",
        "show",
        &key,
        "--tenant-credential-env",
        "SK",
        "--endpoint",
        "POST /v1/charges",
        "--store",
        "sqlite://idem.db",
    ]);
    assert_eq!(gone.status.code(), Some(1));
    let expired = run(&["keys", "purge", "--expired", "--store", "sqlite://idem.db"]);
    assert!(expired.status.success());
    assert!(String::from_utf8_lossy(&expired.stdout).contains("purged 0 expired records"));

    // A memory store would be a new, empty one here: refused, pointing at the admin
    // listener, rather than answering "no record".
    for args in [
        &["keys", "show", &key, "--store", "memory://"][..],
        &["keys", "purge", "--expired", "--store", "memory://"][..],
    ] {
        let refused = run(args);
        assert_eq!(refused.status.code(), Some(2), "{refused:?}");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(said.contains("admin listener"), "{said}");
    }
}

/// Gateways in front of two APIs share one SQLite file in two namespaces: the same key
/// and body at the same path execute once at each API, and each API's retry replays its
/// own answer, through either of the gateways that share its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_keep_apart_the_keys_of_apis_that_share_a_store() {
    let (payments, orders) = (Upstream::start().await, Upstream::start().await);
    let dir = tempfile::tempdir().unwrap();
    let args = |namespace| {
        [
            "--store",
            "sqlite://shared.db",
            "--store-namespace",
            namespace,
        ]
    };
    let pay = Gateway::start(&payments.url(), dir.path(), &args("payments")).await;
    let pay_too = Gateway::start(&payments.url(), dir.path(), &args("payments")).await;
    let ord = Gateway::start(&orders.url(), dir.path(), &args("orders")).await;
    let http = Http::new();
    let key = new_key();
    let body = r#"{"amount":5}"#;

    let at_payments = http.post(&pay.url("/v1/things"), &key, body, &[]).await;
    let at_orders = http.post(&ord.url("/v1/things"), &key, body, &[]).await;
    assert_eq!((at_payments.status, at_payments.replayed()), (201, false));
    assert_eq!((at_orders.status, at_orders.replayed()), (201, false));
    let retry = http.post(&pay_too.url("/v1/things"), &key, body, &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, at_payments.body);
    let retry = http.post(&ord.url("/v1/things"), &key, body, &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, at_orders.body);
    assert_eq!((payments.started(&key), orders.started(&key)), (1, 1));

    // A name that cannot be a table name is refused before anything starts.
    let refused = std::process::Command::new(binary())
        .args(["serve", "--upstream", "http://127.0.0.1:1"])
        .args(["--store", "memory://", "--store-namespace", "pay-ments"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("\"pay-ments\" is not a namespace"),
        "{stderr}"
    );
}

over_both_protocols! {
async fn sigterm_lets_in_flight_requests_finish_and_record(proto: Proto) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "sqlite://idem.db"]).await;
    let http = Http::speaking(proto);
    let key = new_key();
    let url = gw.url("/v1/charges");
    let pending = {
        let (http, url, key) = (http.clone(), url.clone(), key.clone());
        tokio::spawn(async move {
            http.post(&url, &key, "{}", &[("x-test-delay-ms", "800")])
                .await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while up.started(&key) == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = gw.terminate().await;
    assert!(status.success(), "{status:?}");
    let a = pending.await.unwrap();
    assert_eq!(a.status, 201, "the in-flight request got its answer");
    // The store was closed: the WAL was folded into idem.db, which alone holds the
    // record, so the file can be copied elsewhere.
    for sidecar in ["idem.db-wal", "idem.db-shm"] {
        assert!(
            !dir.path().join(sidecar).exists(),
            "{sidecar} is left after a clean stop"
        );
    }
    // It was recorded before exit: a new gateway on the same file replays it.
    let gw2 = Gateway::start(&up.url(), dir.path(), &["--store", "sqlite://idem.db"]).await;
    let b = http.post(&gw2.url("/v1/charges"), &key, "{}", &[]).await;
    assert!(b.replayed(), "{b:?}");
    assert_eq!(b.body, a.body);
    assert_eq!(up.started(&key), 1);
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_variables_configure_the_gateway() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let upstream = up.url();
    let gw = Gateway::start_with_env(
        "",
        dir.path(),
        &[],
        &[
            ("IDEM_UPSTREAM", upstream.as_str()),
            ("IDEM_STORE", "memory://"),
            ("IDEM_REQUIRE_KEY", "true"),
            ("IDEM_BODY_LIMIT", "1KiB"),
            // Not a setting: ignored, with a warning that names the one it resembles.
            ("IDEM_TTL_SECONDS", "60"),
        ],
    )
    .await;
    let logs = gw.logs();
    assert!(
        logs.contains("WARN")
            && logs.contains("IDEM_TTL_SECONDS")
            && logs.contains("did you mean IDEM_TTL?"),
        "{logs}"
    );
    let http = Http::new();
    let url = gw.url("/v1/charges");
    assert_eq!(http.send("POST", &url, &[], "{}").await.status, 400);
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(2000));
    assert_eq!(http.post(&url, &new_key(), &big, &[]).await.status, 413);
    assert_eq!(http.post(&url, &new_key(), "{}", &[]).await.status, 201);
    assert!(
        !dir.path().join("idem.db").exists(),
        "IDEM_STORE chose the memory store over the SQLite default"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_no_credentials_or_bodies() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--log-format", "json"],
        &[("IDEM_LOG", "debug")],
    )
    .await;
    let http = Http::new();
    let key = new_key();
    let url = gw.url("/v1/charges");
    let secret = [("authorization", "Bearer sk_live_TOPSECRET")];
    http.post(&url, &key, r#"{"card":"4242-BODYSECRET"}"#, &secret)
        .await;
    http.post(&url, &key, r#"{"card":"4242-BODYSECRET"}"#, &secret)
        .await;
    http.send("GET", &url, &secret, "").await;
    // Lines are flushed as they are written; give the last ones a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logs = gw.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "{logs}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v.get("level").is_some(), "{line}");
    }
    assert!(
        !logs.contains("TOPSECRET"),
        "a credential was logged:\n{logs}"
    );
    assert!(!logs.contains("BODYSECRET"), "a body was logged:\n{logs}");
    assert!(
        logs.contains("\"request\""),
        "the access log is there at debug:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_command_validates_settings_and_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("idem.toml"),
        "upstream = \"http://127.0.0.1:3000\"\nstore = \"memory://\"\n\
         [[route]]\nmethod = \"POST\"\npath = \"/v1/orders/{id}/capture\"\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(binary())
            .args(args)
            .current_dir(dir.path())
            .env_remove("IDEM_UPSTREAM")
            .env_remove("IDEM_STORE")
            .output()
            .unwrap()
    };
    let ok = run(&["check-config", "--config", "idem.toml", "--ttl", "2h"]);
    assert!(ok.status.success(), "{ok:?}");
    let out = String::from_utf8(ok.stdout).unwrap();
    assert!(
        out.contains("[[route]]\nmethod = \"POST\"\npath = \"/v1/orders/{id}/capture\"\n"),
        "{out}"
    );
    assert!(out.contains("\nttl = \"2h\"\n"), "{out}");
    let bad = run(&["check-config", "--config", "idem.toml", "--ttl", "0s"]);
    assert_eq!(bad.status.code(), Some(2));
    let missing = run(&["check-config", "--store", "memory://"]);
    assert_eq!(missing.status.code(), Some(2), "no upstream");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--upstream"));
}

/// A raw HTTP/1.1 upstream for connection upgrades. Every request head it reads is
/// kept. A request with any `Upgrade` header is switched, and the upstream then sends
/// back every byte it reads in upper case until the client closes. `/rogue` is switched
/// whatever the request asked for, and `/other` to `h2c` whatever it asked for.
/// Anything else gets `201`.
async fn upgrading_upstream() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some((head, _)) = read_message(&mut conn).await {
                    seen.lock().unwrap().push(head.clone());
                    let lower = head.to_lowercase();
                    if !lower.contains("\r\nupgrade: ") && !lower.starts_with("get /rogue ") {
                        let answer = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                                      content-length: 2\r\n\r\n{}";
                        conn.write_all(answer.as_bytes()).await.unwrap();
                        continue;
                    }
                    let protocol = if lower.starts_with("get /other ") {
                        "h2c"
                    } else {
                        "websocket"
                    };
                    let switched = format!(
                        "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n\
                         upgrade: {protocol}\r\nx-session: s1\r\n\r\n"
                    );
                    conn.write_all(switched.as_bytes()).await.unwrap();
                    let mut buf = [0u8; 1024];
                    loop {
                        let n = conn.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            let _ = conn.shutdown().await;
                            return;
                        }
                        let upper = buf[..n].to_ascii_uppercase();
                        if conn.write_all(&upper).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, heads)
}

/// Reads from `stream` until `want` bytes came, or it ends.
async fn read_exactly(stream: &mut tokio::net::TcpStream, want: usize) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = vec![0u8; want];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut got))
        .await
        .expect("the tunnel answered in time")
        .expect("the tunnel stayed open");
    got
}

/// A WebSocket-style upgrade on an unkeyed request reaches the upstream with its
/// `Upgrade` header; the upstream's `101` comes back, and from then on bytes flow both
/// ways, past the upstream timeout, until the client closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_upgrades_are_tunnelled_to_the_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, heads) = upgrading_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up,
        dir.path(),
        &[
            "--store",
            "memory://",
            "--upstream-timeout",
            "3s",
            "--admin",
            "127.0.0.1:0",
        ],
    )
    .await;
    let http = Http::new();
    let tunnels = || async {
        let text = http.send("GET", &gw.admin_url("/metrics"), &[], "").await;
        metric(
            &String::from_utf8_lossy(&text.body),
            "idem_upgraded_connections",
        )
    };
    let mut client = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    client
        .write_all(
            b"GET /v1/stream HTTP/1.1\r\nhost: x\r\nconnection: keep-alive, Upgrade\r\n\
              upgrade: WebSocket\r\nx-hop: no\r\n\r\n",
        )
        .await
        .unwrap();
    let (head, body) = read_message(&mut client).await.expect("an answer");
    let lower = head.to_lowercase();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(lower.contains("\r\nupgrade: websocket"), "{head}");
    assert!(lower.contains("\r\nconnection: upgrade"), "{head}");
    assert!(lower.contains("\r\nx-session: s1"), "{head}");
    assert!(body.is_empty());

    client.write_all(b"hello").await.unwrap();
    assert_eq!(read_exactly(&mut client, 5).await, b"HELLO");
    assert_eq!(tunnels().await, 1);
    // Longer than the upstream timeout, which bounds the handshake only.
    tokio::time::sleep(Duration::from_millis(3300)).await;
    client.write_all(b" world").await.unwrap();
    assert_eq!(read_exactly(&mut client, 6).await, b" WORLD");
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
        .await
        .expect("the tunnel closed after the client")
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tunnels().await != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tunnel stayed counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let upstream_saw = heads[0].to_lowercase();
    assert!(
        upstream_saw.starts_with("get /v1/stream "),
        "{upstream_saw}"
    );
    assert!(
        upstream_saw.contains("\r\nconnection: upgrade"),
        "{upstream_saw}"
    );
    assert!(
        upstream_saw.contains("\r\nupgrade: websocket"),
        "{upstream_saw}"
    );
    assert!(!upstream_saw.contains("keep-alive"), "{upstream_saw}");
    assert!(
        upstream_saw.contains("\r\nx-forwarded-for: 127.0.0.1"),
        "{upstream_saw}"
    );
}

/// A keyed request is never upgraded: the upstream sees no `Upgrade` header and its
/// answer is recorded and replayed as usual. Nor is an upgrade to a protocol that
/// carries HTTP requests (`h2c`), whose tunnel would bypass the layer. A `101` the
/// request did not ask for, or to another protocol than the one asked for, is an
/// upstream that stopped speaking HTTP the client can read: a 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_unkeyed_websocket_requests_are_upgraded() {
    let (up, heads) = upgrading_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up, dir.path(), &["--store", "memory://"]).await;
    let http = Http::new();
    let key = new_key();
    let upgrade = [("connection", "upgrade"), ("upgrade", "websocket")];
    let first = http
        .post(&gw.url("/v1/charges"), &key, "{}", &upgrade)
        .await;
    assert_eq!(first.status, 201);
    let again = http
        .post(&gw.url("/v1/charges"), &key, "{}", &upgrade)
        .await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    {
        let heads = heads.lock().unwrap();
        assert_eq!(
            heads.len(),
            1,
            "the replay did not reach the upstream: {heads:?}"
        );
        assert!(!heads[0].to_lowercase().contains("upgrade"), "{}", heads[0]);
    }

    // What `curl --http2` sends on plain HTTP.
    let h2c = http
        .send(
            "GET",
            &gw.url("/v1/charges"),
            &[
                ("connection", "Upgrade, HTTP2-Settings"),
                ("upgrade", "h2c"),
                ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ],
            "",
        )
        .await;
    assert_eq!(h2c.status, 201);
    {
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 2, "{heads:?}");
        let saw = heads[1].to_lowercase();
        assert!(
            !saw.contains("upgrade") && !saw.contains("http2-settings"),
            "{saw}"
        );
    }

    let rogue = http.send("GET", &gw.url("/rogue"), &[], "").await;
    assert_eq!(rogue.status, 504, "{:?}", rogue.body);
    assert_eq!(
        rogue.problem_type(),
        "https://idem.dev/problems/upstream-connection-lost"
    );
    // Asked for WebSocket, switched to something else.
    let other = http.send("GET", &gw.url("/other"), &upgrade, "").await;
    assert_eq!(other.status, 504, "{:?}", other.body);
    assert_eq!(
        other.problem_type(),
        "https://idem.dev/problems/upstream-connection-lost"
    );
}

/// An open WebSocket tunnel does not hold up a graceful shutdown: the gateway exits
/// within its shutdown timeout, and the client's side of the tunnel ends with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_tunnels_do_not_hold_up_shutdown() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, _heads) = upgrading_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up,
        dir.path(),
        &["--store", "memory://", "--shutdown-timeout", "20s"],
    )
    .await;
    let mut client = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    client
        .write_all(
            b"GET /v1/stream HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\n\
              upgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let (head, _) = read_message(&mut client).await.expect("an answer");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    client.write_all(b"ping").await.unwrap();
    assert_eq!(read_exactly(&mut client, 4).await, b"PING");

    let started = std::time::Instant::now();
    let status = gw.terminate().await;
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the gateway waited {:?} for the tunnel",
        started.elapsed()
    );
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
        .await
        .expect("the tunnel ended with the gateway");
    // Closed or reset: either way nothing more comes through.
    assert!(ended.map_or(true, |n| n == 0), "{rest:?}");
}

/// SIGHUP and SIGTERM are listened for before the gateway says it listens: a SIGHUP
/// sent at once leaves it serving (not ended by the default action), and a SIGTERM sent
/// at once is a clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_sent_as_soon_as_the_gateway_listens_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &gw.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let a = Http::new()
        .post(&gw.url("/v1/charges"), &new_key(), "{}", &[])
        .await;
    assert_eq!(a.status, 201, "still serving after SIGHUP");
    assert!(gw.terminate().await.success());

    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let status = gw.terminate().await;
    assert!(status.success(), "{status:?}");
}
