//! The gateway outlives its logs (issue 54 §1, §2): with its standard output and error
//! pipes closed, or its standard error a pipe nobody reads, every keyed request is
//! answered and executed once, lines that cannot be written are counted in
//! `idem_log_lines_dropped_total`, and SIGTERM still lets the request in flight finish
//! and exits 0. And from a customer's key to its lines (§7): `idem keys show` prints the
//! scope digest the access log names, and debug level logs the key beside it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

use crate::common::{Http, Upstream, binary, leaking_idem_vars, metric, new_key};

/// Keyed requests sent in each test: at two lines of a few hundred bytes each, several
/// times what a 64 KiB pipe holds.
const REQUESTS: usize = 600;

/// The most any one answer may take before the test calls serving stalled.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// `idem serve` with both of its output streams on pipes this test holds.
struct Piped {
    child: Child,
    addr: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    /// Held (and read no further) until a test drops it.
    stdout: Option<BufReader<ChildStdout>>,
    stderr: Option<ChildStderr>,
}

impl Piped {
    /// Starts the gateway in front of `up` on the memory store, with the admin
    /// listener, logging at `IDEM_LOG=info,idem_gateway=debug` plus `env`, and reads
    /// its two listening lines.
    async fn start(up: &Upstream, env: &[(&str, &str)]) -> Piped {
        let mut cmd = Command::new(binary());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--upstream", &up.url()])
            .args(["--store", "memory://", "--admin", "127.0.0.1:0"])
            .env("IDEM_LOG", "info,idem_gateway=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for k in leaking_idem_vars() {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("the idem binary starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let stderr = child.stderr.take().unwrap();
        let (mut addr, mut admin) = (None, None);
        let read = async {
            let mut line = String::new();
            while addr.is_none() || admin.is_none() {
                line.clear();
                if stdout.read_line(&mut line).await.unwrap() == 0 {
                    return;
                }
                if let Some(a) = line.trim().strip_prefix("idem listening on http://") {
                    addr = Some(a.parse().unwrap());
                } else if let Some(a) = line.trim().strip_prefix("idem admin on http://") {
                    admin = Some(a.parse().unwrap());
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the gateway says where it listens within 30 s");
        Piped {
            child,
            addr: addr.expect("a listening line"),
            admin: admin.expect("an admin line"),
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `/metrics`' count of dropped log lines.
    async fn dropped(&self, http: &Http) -> u64 {
        let m = http
            .send("GET", &format!("http://{}/metrics", self.admin), &[], "")
            .await;
        assert_eq!(m.status, 200);
        let text = String::from_utf8(m.body.to_vec()).unwrap();
        metric(&text, "idem_log_lines_dropped_total").expect("the dropped-lines counter")
    }

    /// SIGTERM while a slow keyed request is in flight: it must still be answered (and
    /// executed once), and the process exit 0, within bounded waits.
    async fn terminate_with_one_in_flight(mut self, up: &Upstream, http: &Http) {
        let key = new_key();
        let in_flight = tokio::spawn({
            let (http, url, key) = (http.clone(), self.url("/v1/charges"), key.clone());
            async move {
                http.post(&url, &key, "{\"last\":true}", &[("x-test-delay-ms", "500")])
                    .await
            }
        });
        assert!(
            wait_started(up, &key).await,
            "the last request reached the upstream"
        );
        let pid = self.child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let last = tokio::time::timeout(Duration::from_secs(30), in_flight)
            .await
            .expect("the request in flight is answered after SIGTERM")
            .unwrap();
        assert_eq!(last.status, 201, "the request in flight completed");
        assert_eq!(up.started(&key), 1);
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the gateway exits after SIGTERM")
            .unwrap();
        assert_eq!(status.code(), Some(0), "SIGTERM exits 0: {status:?}");
    }
}

/// Waits (bounded) until the upstream has started an execution of `key`.
async fn wait_started(up: &Upstream, key: &str) -> bool {
    for _ in 0..500 {
        if up.started(key) > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Sends [`REQUESTS`] keyed requests, one after another, each bounded by
/// [`ANSWER_WITHIN`], and asserts each was answered 201 and executed once; then
/// retries the first and last keys, which replay.
async fn every_key_answered_once(gw_url: &str, up: &Upstream, http: &Http) {
    let body = |i: usize| format!("{{\"amount\":{i}}}");
    let mut keys = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let key = new_key();
        let body = body(i);
        let answer = tokio::time::timeout(ANSWER_WITHIN, http.post(gw_url, &key, &body, &[]))
            .await
            .unwrap_or_else(|_| panic!("request {i} of {REQUESTS} not answered: serving stalled"));
        assert_eq!(answer.status, 201, "request {i}: {answer:?}");
        keys.push(key);
    }
    for key in &keys {
        assert_eq!(up.started(key), 1, "key {key} executed once");
    }
    for i in [0, REQUESTS - 1] {
        let key = &keys[i];
        let again = http.post(gw_url, key, &body(i), &[]).await;
        assert!(
            again.status == 201 && again.replayed(),
            "a retry is answered from the record: {again:?}"
        );
        assert_eq!(up.started(key), 1, "a retry does not execute again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_log_pipes_neither_stop_nor_stall_serving() {
    let up = Upstream::start().await;
    let mut gw = Piped::start(&up, &[]).await;
    let http = Http::new();
    // Both readers go away, as `idem serve … 2>&1 | head -1` or a log collector that
    // restarts: every line from now on meets a broken pipe.
    drop(gw.stdout.take());
    drop(gw.stderr.take());
    every_key_answered_once(&gw.url("/v1/charges"), &up, &http).await;
    let dropped = gw.dropped(&http).await;
    assert!(
        dropped >= REQUESTS as u64,
        "every access line met the broken pipe and was counted: {dropped}"
    );
    gw.terminate_with_one_in_flight(&up, &http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_log_reader_stalls_no_request() {
    let up = Upstream::start().await;
    // A small queue, so that a few hundred requests outrun it; the setting is read from
    // the environment, which a gateway without it ignores.
    let mut gw = Piped::start(&up, &[("IDEM_LOG_BUFFER_LINES", "64")]).await;
    let http = Http::new();
    // Standard error is held open and not read: the pipe fills, then the queue.
    every_key_answered_once(&gw.url("/v1/charges"), &up, &http).await;
    let dropped = gw.dropped(&http).await;
    assert!(
        dropped > 0,
        "lines past the pipe and the queue are dropped and counted"
    );
    // The reader comes back: what it reads ends with a warning saying how many lines
    // were dropped.
    let mut stderr = gw.stderr.take().unwrap();
    let mut read = Vec::new();
    let warned = tokio::time::timeout(Duration::from_secs(30), async {
        let mut chunk = [0u8; 65536];
        loop {
            let n = stderr.read(&mut chunk).await.unwrap();
            assert!(n > 0, "standard error open until the gateway exits");
            read.extend_from_slice(&chunk[..n]);
            if String::from_utf8_lossy(&read).contains("log lines were dropped") {
                return;
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&read).into_owned();
    assert!(
        warned.is_ok(),
        "no warning of dropped lines once read again:\n{}",
        &text[text.len().saturating_sub(4000)..]
    );
    let warning = text
        .lines()
        .find(|l| l.contains("log lines were dropped"))
        .unwrap();
    assert!(warning.contains(" WARN "), "{warning}");
    let said: u64 = warning
        .split_once("dropped=")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the warning says how many: {warning}"));
    assert!(said > 0, "{warning} (counter {dropped})");
    // Keep reading standard error to the end, so the exit is not held by it.
    let drain = tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = stderr.read_to_end(&mut sink).await;
    });
    gw.terminate_with_one_in_flight(&up, &http).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), drain).await;
}
