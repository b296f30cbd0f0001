//! The black-box harness: the real `idem` binary, the recording upstream (from
//! `idem_test_support`), and a small HTTP client. Everything listens on 127.0.0.1 and is stopped on drop.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::HeaderMap;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A fresh random key.
pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

pub use idem_test_support::upstream::{OLD_DATE, Upstream};

/// The `idem` binary under test, killed on drop.
pub struct Gateway {
    child: Child,
    pub addr: std::net::SocketAddr,
    pub admin: Option<std::net::SocketAddr>,
    log: PathBuf,
}

/// The `IDEM_*` variables of the tests' own environment, but `IDEM_LOG`: removed from
/// every `idem` the tests run, so that none of them changes a setting under test.
pub fn leaking_idem_vars() -> impl Iterator<Item = String> {
    std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("IDEM_") && k != "IDEM_LOG")
}

/// Runs `idem ARGS…` in `dir` to its end, logging warnings only, without the tests'
/// own `IDEM_*` variables.
///
/// Under `IDEM_TEST_GATEWAY_STORE`, an operator's command that opens a store (`keys`,
/// `migrate`) and names none opens the one a gateway started in `dir` uses
/// ([`test_store_args`]).
pub fn idem_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(binary());
    cmd.args(args).current_dir(dir).env("IDEM_LOG", "warn");
    if matches!(args.first(), Some(&("keys" | "migrate"))) && !args.contains(&"--store") {
        cmd.args(test_store_args(dir));
    }
    for k in leaking_idem_vars() {
        cmd.env_remove(k);
    }
    cmd.output().expect("the idem binary runs")
}

/// The variable that makes every gateway the tests start without a store of its own,
/// or on the bare memory store ([`gateway_args`]), use this one instead
/// (`mysql://root@127.0.0.1:3306/test`, `postgres://postgres@127.0.0.1:5432/test`): the
/// whole suite run against a shared store.
pub const GATEWAY_STORE_VAR: &str = "IDEM_TEST_GATEWAY_STORE";

/// The store of `IDEM_TEST_GATEWAY_STORE`, if set (and not empty).
pub fn test_gateway_store() -> Option<String> {
    std::env::var(GATEWAY_STORE_VAR)
        .ok()
        .filter(|url| !url.trim().is_empty())
}

/// `--store URL --store-namespace NS` for a gateway or command running in `dir` that
/// names no store, under `IDEM_TEST_GATEWAY_STORE`; nothing otherwise.
///
/// The default store is the file `idem.db` in the directory the gateway runs in, which
/// every gateway of one test shares (a restarted one finds its records) and no other
/// test sees. The namespace does the same on a shared store: it is drawn from `dir`
/// (`bb_` and 16 hex digits of a hash of its path, unique to each test's temporary
/// directory, short enough for every store's derived names).
pub fn test_store_args(dir: &Path) -> Vec<String> {
    test_gateway_store().map_or_else(Vec::new, |url| store_args(url, dir))
}

/// `--store URL --store-namespace NS`, the namespace that of `dir`.
fn store_args(url: String, dir: &Path) -> Vec<String> {
    vec![
        "--store".to_owned(),
        url,
        "--store-namespace".to_owned(),
        test_namespace(dir),
    ]
}

/// The OpenTelemetry `db.system.name` of the store a gateway started without one uses:
/// `sqlite` (the default file), else that of `IDEM_TEST_GATEWAY_STORE`'s scheme.
pub fn test_store_system() -> &'static str {
    let Some(url) = test_gateway_store() else {
        return "sqlite";
    };
    match url.split("://").next().unwrap_or_default() {
        "postgres" | "postgresql" => "postgresql",
        "mysql" | "mariadb" => "mysql",
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => "redis",
        "sqlite" => "sqlite",
        other => panic!("{GATEWAY_STORE_VAR}: no store system known for {other:?}"),
    }
}

/// The namespace of the tests' shared store for the gateways running in `dir`.
pub fn test_namespace(dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut hasher);
    format!("bb_{:016x}", hasher.finish())
}

/// The memory store at its default bound, written so that `IDEM_TEST_GATEWAY_STORE`
/// keeps it: for the tests whose figures are the memory store's own (its descriptors,
/// its `db.system.name`), which hold on no other store.
pub const MEMORY_KEPT: &str = "memory://?max_entries=100000";

/// A gateway's `EXTRA…` arguments, under `IDEM_TEST_GATEWAY_STORE` on that store
/// where the test leaves the store to the harness: it names none (the default SQLite
/// file), or names the bare `--store memory://` without a namespace of its own (the
/// store a test picks when its subject is not the store). Any other store is kept: a
/// memory store with settings, a file, a server, a `--config` or `IDEM_STORE` naming
/// one.
pub fn gateway_args(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    args_on(test_gateway_store(), dir, extra, env)
}

/// [`gateway_args`] with `shared` for the variable's store.
fn args_on(
    shared: Option<String>,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Vec<String> {
    let mut args: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    let Some(url) = shared else {
        return args;
    };
    let memory = extra.windows(2).position(|w| w == ["--store", "memory://"]);
    match memory {
        Some(i) if !extra.contains(&"--store-namespace") => {
            args.splice(i..i + 2, store_args(url, dir));
        }
        _ if !names_a_store(dir, extra, env) => args.extend(store_args(url, dir)),
        _ => {}
    }
    args
}

/// Whether a gateway started with `extra` and `env` in `dir` names its own store: a
/// `--store`, an `IDEM_STORE`, or a `store` line in its `--config` file.
fn names_a_store(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> bool {
    let config_names_one = extra
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| extra.get(i + 1))
        .and_then(|file| std::fs::read_to_string(dir.join(file)).ok())
        .is_some_and(|text| {
            text.lines().any(|l| {
                l.trim_start().starts_with("store ") || l.trim_start().starts_with("store=")
            })
        });
    extra
        .iter()
        .any(|a| *a == "--store" || a.starts_with("--store="))
        || env.iter().any(|(k, _)| *k == "IDEM_STORE")
        || config_names_one
}

/// `idem check-config --upstream http://127.0.0.1:9 --store memory:// EXTRA…`, run to
/// its end: settings resolved and checked, nothing opened for writing.
pub fn check_config(extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "check-config",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        "memory://",
    ];
    args.extend_from_slice(extra);
    idem_in(&std::env::temp_dir(), &args)
}

/// The `idem` binary under test: `IDEM_TEST_BINARY` when set (a release build, or a
/// copy taken where several checkouts share one target directory and its `idem`), else
/// the one cargo built for this test.
pub fn binary() -> &'static str {
    static BINARY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| {
        std::env::var("IDEM_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_idem").to_owned())
    })
}

impl Gateway {
    /// Starts `idem serve --upstream URL --listen 127.0.0.1:0 EXTRA…` and waits for its
    /// listening line. Logs go to `log_dir/gateway-N.log`.
    pub async fn start(upstream: &str, log_dir: &Path, extra: &[&str]) -> Gateway {
        Gateway::start_with_env(upstream, log_dir, extra, &[]).await
    }

    /// Like [`Gateway::start`], with extra environment variables (`IDEM_*` ones too).
    pub async fn start_with_env(
        upstream: &str,
        log_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Gateway {
        Gateway::launch(Command::new(binary()), upstream, log_dir, extra, env).await
    }

    /// Like [`Gateway::start`], with the process's file-descriptor limit set by the
    /// shell that starts it: `ulimit` is that command's options and figure, `-n 256`
    /// for soft and hard limits of 256, `-Sn 256` for the soft one alone.
    pub async fn start_with_fd_limit(
        upstream: &str,
        log_dir: &Path,
        extra: &[&str],
        ulimit: &str,
    ) -> Gateway {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("ulimit {ulimit} && exec \"$0\" \"$@\""))
            .arg(binary());
        Gateway::launch(cmd, upstream, log_dir, extra, &[]).await
    }

    /// Runs `cmd serve --listen 127.0.0.1:0 --upstream URL EXTRA…`.
    async fn launch(
        mut cmd: Command,
        upstream: &str,
        log_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Gateway {
        static N: AtomicU64 = AtomicU64::new(0);
        let log = log_dir.join(format!("gateway-{}.log", N.fetch_add(1, Ordering::Relaxed)));
        cmd.arg("serve").args(["--listen", "127.0.0.1:0"]);
        if !upstream.is_empty() {
            cmd.args(["--upstream", upstream]);
        }
        cmd.args(gateway_args(log_dir, extra, env));
        cmd.env("IDEM_LOG", "info,idem_gateway=debug")
            .current_dir(log_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        // Keep the tests' own environment from leaking in.
        for k in leaking_idem_vars() {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("the idem binary starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let wants_admin = extra.contains(&"--admin");
        let mut addr = None;
        let mut admin = None;
        let read = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let line = line.replace("https://", "http://");
                if let Some(a) = line.strip_prefix("idem listening on http://") {
                    addr = Some(a.parse().unwrap());
                } else if let Some(a) = line.strip_prefix("idem admin on http://") {
                    admin = Some(a.parse().unwrap());
                }
                if addr.is_some() && (!wants_admin || admin.is_some()) {
                    return;
                }
            }
        };
        let ok = tokio::time::timeout(Duration::from_secs(30), read).await;
        let logs = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(ok.is_ok(), "the gateway did not start in time:\n{logs}");
        let addr = addr.unwrap_or_else(|| panic!("the gateway exited before listening:\n{logs}"));
        Gateway {
            child,
            addr,
            admin,
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!(
            "http://{}{}",
            self.admin.expect("started with --admin"),
            path
        )
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends `signal` (`HUP`, …) to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running");
        let ok = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// SIGKILL, and reap.
    pub async fn kill9(mut self) {
        self.child.start_kill().unwrap();
        let _ = self.child.wait().await;
    }

    /// SIGTERM; returns the exit status (bounded wait).
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running");
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the gateway exits after SIGTERM")
            .unwrap()
    }

    /// The gateway's log so far. The gateway writes its lines from a thread of its own,
    /// a moment after they are logged, later still on a loaded machine: the file is read
    /// until two reads 25 ms apart agree (2 s at most), so that a line logged while the
    /// test's last request was handled is in it.
    pub fn logs(&self) -> String {
        let read = || std::fs::read_to_string(&self.log).unwrap_or_default();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let mut last = read();
        loop {
            std::thread::sleep(Duration::from_millis(25));
            let now = read();
            if now == last || std::time::Instant::now() >= deadline {
                return now;
            }
            last = now;
        }
    }

    /// The process's resident memory now, in KiB (`VmRSS` in `/proc/PID/status`;
    /// Linux only).
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.id().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .expect("a VmRSS line")
    }
}

/// An answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem `type` of an `application/problem+json` answer.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        self.json()["type"].as_str().unwrap().to_owned()
    }
}

/// The protocol a client speaks to the gateway's plain-TCP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Http1,
    /// HTTP/2 with prior knowledge.
    H2c,
}

/// Runs a black-box test once over each protocol: `async fn NAME(proto: Proto) {…}`
/// becomes a module `NAME` with the tests `http1` and `h2c`, each calling the body
/// with its protocol.
macro_rules! over_both_protocols {
    ($(#[doc = $doc:expr])* async fn $name:ident($proto:ident: Proto) $body:block) => {
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn http1() {
                run($crate::common::Proto::Http1).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn h2c() {
                run($crate::common::Proto::H2c).await
            }

            async fn run($proto: $crate::common::Proto) $body
        }
    };
}
pub(crate) use over_both_protocols;

/// A small HTTP/1.1 or HTTP/2 (h2c, prior knowledge) client.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    pub proto: Proto,
}

impl Default for Http {
    fn default() -> Self {
        Http::new()
    }
}

impl Http {
    pub fn new() -> Http {
        Http::speaking(Proto::Http1)
    }

    /// A client that speaks `proto`.
    pub fn speaking(proto: Proto) -> Http {
        let mut builder = Client::builder(TokioExecutor::new());
        if proto == Proto::H2c {
            builder.http2_only(true);
        }
        Http {
            client: builder.build_http(),
            proto,
        }
    }

    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Answer {
        let mut req = http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = tokio::time::timeout(
            Duration::from_secs(30),
            self.client
                .request(req.body(Full::new(body.into())).unwrap()),
        )
        .await
        .expect("answer within 30s")
        .expect("request sent");
        let expected = match self.proto {
            Proto::Http1 => http::Version::HTTP_11,
            Proto::H2c => http::Version::HTTP_2,
        };
        assert_eq!(res.version(), expected, "answered in the protocol asked in");
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body,
        }
    }

    /// POST a JSON body with an `Idempotency-Key` and extra headers.
    pub async fn post(&self, url: &str, key: &str, body: &str, extra: &[(&str, &str)]) -> Answer {
        let mut headers = vec![
            ("idempotency-key", key),
            ("content-type", "application/json"),
        ];
        headers.extend_from_slice(extra);
        self.send("POST", url, &headers, body.to_owned()).await
    }

    /// POSTs `{}` under `key` every 200 ms until the answer is not 409, and returns
    /// it: how a test waits out an attempt's lease, since the binary runs on the real
    /// clock. Panics after 15 s.
    pub async fn post_once_the_lease_lapses(&self, url: &str, key: &str) -> Answer {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let a = self.post(url, key, "{}", &[]).await;
            if a.status != 409 {
                return a;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lease never lapsed"
            );
        }
    }
}

/// Reads one HTTP/1.1 message, request or response, from `stream`: its head as sent
/// (without the blank line) and the body its `Content-Length` announces (none without
/// one). Reads the head a byte at a time, so nothing of a next message on a kept-alive
/// connection is taken. `None` when the stream ends before the message does.
pub async fn read_message(stream: &mut tokio::net::TcpStream) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    head.truncate(head.len() - 4);
    let head = String::from_utf8_lossy(&head).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().expect("a numeric Content-Length"))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((head, body))
}

/// A raw request over a fresh TCP connection that is dropped after `after`, without
/// reading the answer: a client that went away.
pub async fn send_and_hang_up(addr: std::net::SocketAddr, request: &str, after: Duration) {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    drop(s);
}

/// The value of a metric line (`name{labels}` as written) in a Prometheus exposition;
/// `None` when absent.
pub fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// The gateway's `/metrics` text, from its admin listener (which must answer 200).
pub async fn metrics(http: &Http, gw: &Gateway) -> String {
    let m = http.send("GET", &gw.admin_url("/metrics"), &[], "").await;
    assert_eq!(m.status, 200);
    String::from_utf8(m.body.to_vec()).unwrap()
}

/// The shared-store mechanism's own rules, whatever store the run uses.
mod shared_store {
    use super::*;

    #[test]
    fn a_test_directory_has_one_namespace_that_every_store_admits() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ns = test_namespace(a.path());
        assert_eq!(
            ns,
            test_namespace(a.path()),
            "every gateway of a test shares it"
        );
        assert_ne!(ns, test_namespace(b.path()), "no other test sees it");
        assert!(ns.starts_with("bb_") && ns.len() == 19, "{ns}");
        // The longest name a SQL store derives from it must pass the rule too.
        let ns = idem_core::Namespace::new(&ns).unwrap();
        ns.suffixed("_records_expires").unwrap();
        ns.suffixed("_inbox_expires").unwrap();
    }

    #[test]
    fn a_gateway_that_names_its_store_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!names_a_store(dir.path(), &["--ttl", "1m"], &[]));
        assert!(names_a_store(dir.path(), &["--store", "memory://"], &[]));
        assert!(names_a_store(dir.path(), &["--store=memory://"], &[]));
        assert!(names_a_store(
            dir.path(),
            &[],
            &[("IDEM_STORE", "sqlite://x.db")]
        ));
        std::fs::write(dir.path().join("a.toml"), "store = \"memory://\"\n").unwrap();
        std::fs::write(dir.path().join("b.toml"), "store_namespace = \"x\"\n").unwrap();
        assert!(names_a_store(dir.path(), &["--config", "a.toml"], &[]));
        assert!(!names_a_store(dir.path(), &["--config", "b.toml"], &[]));
    }

    #[test]
    fn the_shared_store_replaces_the_default_and_the_bare_memory_store_only() {
        let dir = tempfile::tempdir().unwrap();
        let my = || Some("mysql://root@127.0.0.1:3306/test".to_owned());
        let ns = test_namespace(dir.path());
        let shared = [
            "--store",
            "mysql://root@127.0.0.1:3306/test",
            "--store-namespace",
            &ns,
        ];
        let on = |extra: &[&str], env: &[(&str, &str)]| args_on(my(), dir.path(), extra, env);
        assert_eq!(
            on(&["--ttl", "1m"], &[]),
            [&["--ttl", "1m"][..], &shared].concat()
        );
        assert_eq!(
            on(&["--store", "memory://", "--admin", "0"], &[]),
            [&shared[..], &["--admin", "0"]].concat()
        );
        for kept in [
            &["--store", "memory://?max_entries=3"][..],
            &["--store", "memory://", "--store-namespace", "a"],
            &["--store", "sqlite://idem.db"],
        ] {
            assert_eq!(on(kept, &[]), kept);
        }
        assert!(on(&[], &[("IDEM_STORE", "memory://")]).is_empty());
        assert_eq!(
            args_on(None, dir.path(), &["--ttl", "1m"], &[]),
            ["--ttl", "1m"]
        );
    }
}
