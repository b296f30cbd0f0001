//! The guide's nginx configuration in front of the real binary (issue 37 §5, "Where idem
//! sits"): `docs/src/gateway/nginx.conf` as the page shows it, with only its addresses
//! replaced, run by a real nginx (Debian's `nginx-light`). Keyed requests and their
//! replays pass through it, the client's address reaches the upstream and idem's access
//! log (idem trusting nginx's address, as the page says), and `/readyz` reaches the
//! admin listener.
//!
//! nginx is `IDEM_TEST_NGINX`, else `/usr/sbin/nginx`; without it the tests skip loudly,
//! and fail under `IDEM_REQUIRE_SERVICES=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{Gateway, Http, Upstream, new_key};

/// The nginx binary, or `None` (after a loud skip) when there is none.
fn nginx_binary() -> Option<PathBuf> {
    let path = std::env::var_os("IDEM_TEST_NGINX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"));
    if path.is_file() {
        return Some(path);
    }
    idem_test_support::service_unavailable(
        "nginx (Debian's nginx-light)",
        &path.display().to_string(),
        &"no such file; set IDEM_TEST_NGINX",
    )
}

/// The page's configuration, with each of its addresses replaced: every one must be
/// there exactly once, so the page cannot change under the test unnoticed.
fn guide_config(replacements: &[(&str, &str)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/gateway/nginx.conf");
    let mut config = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    for (from, to) in replacements {
        assert_eq!(
            config.matches(from).count(),
            1,
            "{from:?} is not in {} exactly once",
            path.display()
        );
        config = config.replace(from, to);
    }
    config
}

/// An nginx master process (and its worker) running the guide's configuration, stopped
/// on drop, a panicking test's too.
struct Nginx {
    child: Child,
    /// The port it listens on, on `::1`.
    port: u16,
    dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts `nginx` on a free port of `::1`, in front of `gw` (which must have an
    /// admin listener).
    async fn start(nginx: &Path, gw: &Gateway) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        // When the tests run as root, nginx's worker runs as nobody: it must reach the
        // temporary directories nginx makes for it here.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("[::1]:0")
            .expect("::1 is configured")
            .local_addr()
            .unwrap()
            .port();
        // The client reaches nginx over IPv6 and nginx reaches idem over IPv4, so the
        // client's address (::1) and nginx's (127.0.0.1) differ.
        let config = guide_config(&[
            (
                "listen 80;\n    listen [::]:80;",
                &format!("listen [::1]:{port};"),
            ),
            ("server 127.0.0.1:8080;", &format!("server {};", gw.addr)),
            (
                "server 127.0.0.1:9090;",
                &format!("server {};", gw.admin.expect("an admin listener")),
            ),
        ]);
        let d = dir.path().display();
        std::fs::write(dir.path().join("idem.conf"), config).unwrap();
        // The main context and the paths a packaged nginx.conf would give, here inside
        // the temporary directory; the guide's file is included as conf.d would be.
        let main = format!(
            "worker_processes 1;\n\
             error_log {d}/error.log info;\n\
             pid {d}/nginx.pid;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n\
             \x20   access_log {d}/access.log;\n\
             \x20   client_body_temp_path {d}/body;\n\
             \x20   proxy_temp_path {d}/proxy;\n\
             \x20   fastcgi_temp_path {d}/fastcgi;\n\
             \x20   uwsgi_temp_path {d}/uwsgi;\n\
             \x20   scgi_temp_path {d}/scgi;\n\
             \x20   include {d}/idem.conf;\n\
             }}\n"
        );
        let main_path = dir.path().join("nginx.conf");
        std::fs::write(&main_path, main).unwrap();
        let child = Command::new(nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&main_path)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", nginx.display()));
        let mut nginx = Nginx { child, port, dir };
        nginx.wait_listening().await;
        nginx
    }

    async fn wait_listening(&mut self) {
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("nginx exited with {status}:\n{}", self.logs());
            }
            if tokio::net::TcpStream::connect(("::1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "nginx did not listen on [::1]:{}:\n{}",
            self.port,
            self.logs()
        );
    }

    fn url(&self, path: &str) -> String {
        format!("http://[::1]:{}{path}", self.port)
    }

    /// Its standard error and error log.
    fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!("{}{}", read("stderr.log"), read("error.log"))
    }

    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its worker, then exits. A SIGKILL would leave the
        // worker listening.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// idem with an admin listener, logging JSON at the default level, trusting nginx
/// (127.0.0.1) to name the client, as the guide's page says to run it.
async fn gateway(up: &Upstream, dir: &Path) -> Gateway {
    Gateway::start_with_env(
        &up.url(),
        dir,
        &["--admin", "127.0.0.1:0", "--trusted-proxies", "127.0.0.1"],
        &[("IDEM_LOG", "info"), ("IDEM_LOG_FORMAT", "json")],
    )
    .await
}

/// idem's access lines so far, waiting (bounded) until there are `n`.
async fn access_lines(gw: &Gateway, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let lines: Vec<Value> = gw
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"] == "idem::access")
            .collect();
        if lines.len() >= n {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("fewer than {n} access lines:\n{}", gw.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_replay_through_nginx_and_the_client_address_reaches_the_upstream() {
    let Some(binary) = nginx_binary() else {
        return;
    };
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&up, dir.path()).await;
    let nginx = Nginx::start(&binary, &gw).await;
    let http = Http::new();
    let url = nginx.url("/v1/charges");
    let key = new_key();
    let body = r#"{"amount":100,"currency":"eur"}"#;

    // What a client claims about itself: kept before nginx's entry (X-Forwarded-For),
    // or replaced by nginx's element (Forwarded).
    let claims = [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=198.51.100.1"),
    ];
    let first = http.post(&url, &key, body, &claims).await;
    assert_eq!(first.status, 201, "{first:?}\n{}", nginx.logs());
    assert!(!first.replayed());
    assert_eq!(up.started(&key), 1);

    let replay = http.post(&url, &key, body, &[]).await;
    assert_eq!(replay.status, 201, "{replay:?}");
    assert!(replay.replayed(), "Idempotent-Replayed: true: {replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(up.started(&key), 1, "the upstream ran once");

    let reused = http
        .post(&url, &key, r#"{"amount":200,"currency":"eur"}"#, &[])
        .await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert_eq!(
        reused.problem_type(),
        "https://idem.dev/problems/key-reused"
    );
    assert_eq!(up.started(&key), 1, "the 422 never went upstream");
    assert_eq!(up.total(), 1);

    // The client (::1) is not idem's peer (nginx, 127.0.0.1): its address reaches the
    // upstream only through what nginx wrote, with idem's hop after it.
    let seen = &up.seen()[0];
    let header = |name: &str| {
        let values: Vec<&str> = seen
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        values.join(", ")
    };
    assert_eq!(header("x-forwarded-for"), "203.0.113.9, ::1, 127.0.0.1");
    let forwarded = header("forwarded");
    let elements: Vec<&str> = forwarded.split(", ").collect();
    assert_eq!(elements.len(), 2, "{forwarded}");
    assert_eq!(elements[0], r#"for="[::1]";proto=http"#, "{forwarded}");
    assert!(
        elements[1].starts_with("for=127.0.0.1;proto=http;"),
        "{forwarded}"
    );
    assert!(!forwarded.contains("198.51.100.1"), "{forwarded}");
    assert_eq!(seen.headers["idempotency-key"], key.as_str());

    // idem's access log names the client nginx forwarded for (::1), never what the
    // client claimed (203.0.113.9), and its peer, nginx; nginx's names the client.
    let lines = access_lines(&gw, 3).await;
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["executed", "replayed", "mismatch"]);
    for line in &lines {
        assert_eq!(line["client"], "::1", "{line}");
        let peer = line["peer"].as_str().unwrap();
        assert!(peer.starts_with("127.0.0.1:"), "{line}");
    }
    // nginx writes a request's line once it has sent the answer, which the client may
    // have read first: wait for the third.
    let from_client = |log: &str| log.lines().filter(|l| l.starts_with("::1 ")).count();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut access = nginx.access_log();
    while from_client(&access) < 3 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        access = nginx.access_log();
    }
    assert_eq!(from_client(&access), 3, "{access}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_through_nginx_is_the_admin_listeners() {
    let Some(binary) = nginx_binary() else {
        return;
    };
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(&up, dir.path()).await;
    let nginx = Nginx::start(&binary, &gw).await;
    let http = Http::new();
    let ready = http.send("GET", &nginx.url("/readyz"), &[], "").await;
    assert_eq!(ready.status, 200, "{ready:?}\n{}", nginx.logs());
    assert_eq!(up.total(), 0, "/readyz never reaches the API");
    // Every other path goes through idem's proxy to the API.
    let other = http.send("GET", &nginx.url("/healthz"), &[], "").await;
    assert_eq!(
        other.status, 201,
        "the counting upstream answered: {other:?}"
    );
    assert_eq!(up.total(), 1);
}
