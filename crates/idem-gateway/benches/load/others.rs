//! The load run's yardsticks beside idem: the PostgreSQL floor (`pgbench`, two synced
//! commits per transaction), the strongest Rust peer as a proxy (`IDEM_LOAD_PEER`, the
//! path of its binary; memory and Redis), and nginx as a pass-through proxy
//! (`IDEM_LOAD_NGINX`, the path of its binary; one worker and two). Each is skipped
//! when its tool is absent; each runs in every round, interleaved with the gateways.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use idem_test_support::cpu_time;
use tokio::process::{Child, Command};

/// A proxy in front of the upstream: the idem gateway, the peer, or nginx.
pub struct Proxy {
    pub child: Child,
    pub addr: SocketAddr,
    /// Count the CPU time of its child processes too (nginx's workers).
    pub with_children: bool,
}

impl Proxy {
    /// CPU time so far of the proxy (and, for nginx, its workers).
    pub fn cpu_time(&self) -> Duration {
        let Some(pid) = self.child.id() else {
            return Duration::ZERO;
        };
        let mut total = cpu_time(&pid.to_string());
        if self.with_children {
            for child in children(pid) {
                total += cpu_time(&child.to_string());
            }
        }
        total
    }
}

impl Drop for Proxy {
    /// Stops the proxy's workers too: nginx's workers outlive a master killed with
    /// SIGKILL, holding the port, and a live master starts a new worker for each one
    /// killed; so the master goes first, then the workers it had.
    fn drop(&mut self) {
        let Some(pid) = self.child.id() else {
            return;
        };
        if self.with_children {
            let workers = children(pid);
            let _ = self.child.start_kill();
            for worker in workers {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &worker.to_string()])
                    .status();
            }
        }
    }
}

/// The processes whose parent is `pid` (Linux; none elsewhere).
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// What a configuration runs: an idem gateway with these arguments, the peer, nginx,
/// or the PostgreSQL floor.
#[derive(Clone, Debug)]
pub enum Launch {
    Idem(Vec<String>),
    /// The peer's binary, with a Redis URL for its Redis store, or none for memory.
    Peer(PathBuf, Option<String>),
    /// nginx's binary and its number of workers.
    Nginx(PathBuf, usize),
    /// `pgbench` against this PostgreSQL URL.
    Floor(String),
    /// The MySQL floor's driver (`load/myfloor.rs`) against this MySQL URL.
    MyFloor(String),
}

/// The optional configurations the environment asks for, named.
pub fn optional(pg: Option<&str>, redis: Option<&str>) -> Vec<(String, Launch)> {
    let mut out = Vec::new();
    if let Some(url) = pg {
        if tool_runs("pgbench") {
            out.push(("pg-floor".to_owned(), Launch::Floor(url.to_owned())));
        } else {
            eprintln!("pgbench not found: the PostgreSQL floor is skipped");
        }
    }
    match std::env::var_os("IDEM_LOAD_PEER").map(PathBuf::from) {
        Some(bin) if bin.is_file() => {
            out.push(("peer-memory".to_owned(), Launch::Peer(bin.clone(), None)));
            if let Some(redis) = redis {
                out.push((
                    "peer-redis".to_owned(),
                    Launch::Peer(bin, Some(redis.to_owned())),
                ));
            }
        }
        Some(bin) => eprintln!("IDEM_LOAD_PEER: {} is not a file: skipped", bin.display()),
        None => {}
    }
    match std::env::var_os("IDEM_LOAD_NGINX").map(PathBuf::from) {
        Some(bin) if bin.is_file() => {
            for workers in [1, 2] {
                out.push((
                    format!("nginx-{workers}w"),
                    Launch::Nginx(bin.clone(), workers),
                ));
            }
        }
        Some(bin) => eprintln!("IDEM_LOAD_NGINX: {} is not a file: skipped", bin.display()),
        None => {}
    }
    out
}

fn tool_runs(name: &str) -> bool {
    std::process::Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A port on 127.0.0.1 free a moment ago, for a server that must be told its address.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Waits up to 30 s for `addr` to accept connections.
async fn accepting(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "{what} never listened on {addr}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts the peer in front of `upstream`.
pub async fn peer(bin: &Path, redis: Option<&str>, upstream: SocketAddr) -> Proxy {
    let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let mut cmd = Command::new(bin);
    cmd.arg(addr.to_string()).arg(format!("http://{upstream}"));
    if let Some(redis) = redis {
        cmd.arg(redis);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the peer starts");
    accepting(addr, "the peer").await;
    Proxy {
        child,
        addr,
        with_children: false,
    }
}

/// Starts nginx with `workers` workers in front of `upstream`, with a configuration of
/// its own in `dir`: an upstream keep-alive pool, HTTP/1.1 to it, no access log.
pub async fn nginx(bin: &Path, workers: usize, upstream: SocketAddr, dir: &Path) -> Proxy {
    let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let prefix = dir.join(format!("nginx-{workers}"));
    let path = nginx_conf(
        &prefix,
        &format!("worker_processes {workers};"),
        addr,
        upstream,
    );
    let child = Command::new(bin)
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("nginx starts");
    accepting(addr, "nginx").await;
    Proxy {
        child,
        addr,
        with_children: true,
    }
}

/// The PostgreSQL floor: `pgbench`'s custom script, a fresh key per transaction, an
/// insert-if-absent of its row and then an update of it, each statement its own
/// synced commit.
pub struct Floor {
    url: String,
    script: PathBuf,
    dir: PathBuf,
}

/// What one pgbench run measured.
pub struct FloorFigures {
    pub transactions: usize,
    pub secs: f64,
    pub p50: Duration,
    pub p99: Duration,
}

impl Floor {
    /// Creates the floor's table (apart from any records table) and its script.
    pub async fn new(url: &str, dir: &Path) -> Floor {
        let script = dir.join("floor.sql");
        std::fs::write(
            &script,
            "\\set k random(1, 9000000000000000000)\n\
             INSERT INTO idem_load_floor (id, state, at) VALUES (:client_id || '-' || :k, 'in_progress', 1) ON CONFLICT (id) DO NOTHING;\n\
             UPDATE idem_load_floor SET state = 'completed', at = 2, body = 'ok' WHERE id = :client_id || '-' || :k;\n",
        )
        .unwrap();
        let status = Command::new("psql")
            .arg(url)
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(
                "DROP TABLE IF EXISTS idem_load_floor; \
                 CREATE TABLE idem_load_floor (id TEXT COLLATE \"C\" PRIMARY KEY, \
                 state TEXT NOT NULL, at BIGINT NOT NULL, body BYTEA)",
            )
            .status()
            .await
            .expect("psql runs");
        assert!(status.success(), "creating the floor's table failed");
        Floor {
            url: url.to_owned(),
            script,
            dir: dir.to_owned(),
        }
    }

    /// One pgbench run of `secs` seconds at `clients` clients, every transaction logged.
    pub async fn run(&self, clients: usize, secs: u64) -> FloorFigures {
        let log = self.dir.join("floor-log");
        for e in std::fs::read_dir(&self.dir).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with("floor-log") {
                std::fs::remove_file(e.path()).ok();
            }
        }
        let started = Instant::now();
        let child = Command::new("pgbench")
            .args(["-n", "-M", "prepared", "-j", "2"])
            .args(["-c", &clients.to_string(), "-T", &secs.to_string()])
            .arg("-f")
            .arg(&self.script)
            .arg("-l")
            .arg(format!("--log-prefix={}", log.display()))
            .arg(&self.url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pgbench starts");
        let out = child.wait_with_output().await.expect("pgbench runs");
        let secs_run = started.elapsed().as_secs_f64().min(secs as f64 + 1.0);
        assert!(
            out.status.success(),
            "pgbench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut latencies = Vec::new();
        for e in std::fs::read_dir(&self.dir).unwrap().flatten() {
            if !e.file_name().to_string_lossy().starts_with("floor-log") {
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            // client_id transaction_no time_us script_no epoch epoch_us
            latencies.extend(text.lines().filter_map(|l| {
                l.split_whitespace()
                    .nth(2)?
                    .parse::<u64>()
                    .ok()
                    .map(Duration::from_micros)
            }));
        }
        latencies.sort_unstable();
        let pct = |p: f64| {
            latencies
                .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        FloorFigures {
            transactions: latencies.len(),
            secs: parse_duration(&out.stdout).unwrap_or(secs_run),
            p50: pct(0.50),
            p99: pct(0.99),
        }
    }
}

/// pgbench's own measure of the run's length: "duration: N s".
fn parse_duration(stdout: &[u8]) -> Option<f64> {
    let text = String::from_utf8_lossy(stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("duration:"))
        .and_then(|d| d.trim().trim_end_matches('s').trim().parse().ok())
}

/// Writes nginx's configuration under `prefix` (made if missing) and returns its path:
/// `processes` (how many, and how they run), then in the foreground, an upstream
/// keep-alive pool, HTTP/1.1 to it, no access log, listening on `addr`.
pub fn nginx_conf(
    prefix: &Path,
    processes: &str,
    addr: SocketAddr,
    upstream: SocketAddr,
) -> PathBuf {
    std::fs::create_dir_all(prefix.join("tmp")).unwrap();
    let p = prefix.display();
    let conf = format!(
        "{processes}
daemon off;
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {p}/tmp/body;
    proxy_temp_path {p}/tmp/proxy;
    upstream api {{ server {upstream}; keepalive 128; }}
    # A client connection is never closed for its number of requests (the default
    # closes it after 1000), as idem never closes one.
    keepalive_requests 1000000000;
    server {{
        listen {addr};
        location / {{
            proxy_pass http://api;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
"
    );
    let path = prefix.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    path
}
