//! Instructions per request (`IDEM_LOAD_CALLGRIND=1`, or `=only` to skip the timed
//! load after): each proxy run under `valgrind --tool=callgrind`, in front of the same
//! upstream, driven by keep-alive POSTs with a fresh key each. Instruction counts do not
//! depend on what else the machine runs, so they show a change's gain where the timed
//! run's CPU figures are noise.
//!
//! Each configuration runs twice, `warm` requests and then `warm + n` (from a fresh
//! start each time); the count per request is the difference of the two totals divided
//! by `n`, so starting, warming up and stopping cancel out. `IDEM_LOAD_CALLGRIND_N`
//! (default 2000) and `IDEM_LOAD_CALLGRIND_WARM` (default 500) set them,
//! `IDEM_LOAD_CALLGRIND_CONNECTIONS` the keep-alive connections that share the requests
//! (default 1: the steadiest count). `IDEM_LOAD_CALLGRIND_DIR=DIR` keeps the callgrind
//! files there (`<name>-warm.out`, `<name>-all.out`) for `callgrind_annotate`.
//! nginx (`IDEM_LOAD_NGINX`) runs as one process serving (`master_process off`), in
//! pass-through; the peer (`IDEM_LOAD_PEER`) on memory and Redis.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::others::Launch;

/// The settings of a count, from the environment.
pub struct Settings {
    n: usize,
    warm: usize,
    connections: usize,
    keep: Option<PathBuf>,
}

impl Settings {
    /// `IDEM_LOAD_CALLGRIND_N`, `_WARM`, `_CONNECTIONS` and `_DIR`.
    pub fn from_env() -> Settings {
        let num = |var: &str, default: usize| {
            std::env::var(var)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(default)
        };
        Settings {
            n: num("IDEM_LOAD_CALLGRIND_N", 2000).max(1),
            warm: num("IDEM_LOAD_CALLGRIND_WARM", 500),
            connections: num("IDEM_LOAD_CALLGRIND_CONNECTIONS", 1).max(1),
            keep: std::env::var_os("IDEM_LOAD_CALLGRIND_DIR").map(PathBuf::from),
        }
    }
}

/// Counts instructions per request for every configuration that can be counted (idem's,
/// nginx with one worker, the peer) and prints them; `upstream` is the run's upstream.
pub async fn count(configs: &[(String, Launch)], upstream: SocketAddr, settings: &Settings) {
    if !std::process::Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("valgrind not found: no instruction counts");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let keep = settings
        .keep
        .clone()
        .unwrap_or_else(|| dir.path().to_owned());
    std::fs::create_dir_all(&keep).unwrap();
    println!(
        "instructions per request (callgrind): ({} + {}) requests less {}, divided by {}, \
         over {} keep-alive connection(s)",
        settings.warm, settings.n, settings.warm, settings.n, settings.connections
    );
    let mut rows = Vec::new();
    for (name, launch) in configs {
        // nginx is counted once, as one process serving.
        if matches!(launch, Launch::Nginx(_, w) if *w != 1)
            || matches!(launch, Launch::Floor(_) | Launch::MyFloor(_))
        {
            continue;
        }
        let started = Instant::now();
        let warm_total = one(
            name,
            launch,
            upstream,
            settings.warm,
            settings,
            &keep,
            "warm",
        )
        .await;
        let all_total = one(
            name,
            launch,
            upstream,
            settings.warm + settings.n,
            settings,
            &keep,
            "all",
        )
        .await;
        let (Some(warm_total), Some(all_total)) = (warm_total, all_total) else {
            println!("  {name:<13} not counted (see above)");
            continue;
        };
        let per = (all_total as f64 - warm_total as f64) / settings.n as f64;
        println!(
            "  {name:<13} {per:>9.0} instructions per request  ({warm_total} / {all_total} in all, {:.0}s)",
            started.elapsed().as_secs_f64()
        );
        rows.push((name.clone(), per));
    }
    if let Some((_, pass)) = rows.iter().find(|(n, _)| n == "pass-through") {
        println!("  as multiples of idem's pass-through:");
        for (name, per) in &rows {
            println!("    {name:<13} {:.2}", per / pass);
        }
    }
}

/// One count: `requests` requests through a fresh proxy under callgrind; the total
/// instructions of its whole life, or `None` when it could not be counted.
async fn one(
    name: &str,
    launch: &Launch,
    upstream: SocketAddr,
    requests: usize,
    settings: &Settings,
    keep: &Path,
    which: &str,
) -> Option<u64> {
    let out = keep.join(format!("{name}-{which}.out"));
    std::fs::remove_file(&out).ok();
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "-q"])
        .arg(format!("--callgrind-out-file={}", out.display()));
    let (mut child, addr) = match launch {
        Launch::Idem(args) => {
            cmd.arg(env!("CARGO_BIN_EXE_idem"))
                .arg("serve")
                .args(["--upstream", &format!("http://{upstream}")])
                .args(["--listen", "127.0.0.1:0", "--ttl", "10m"])
                .args(["--store-namespace", "idem_load"])
                .args(args)
                .env("IDEM_LOG", "warn")
                .current_dir(keep)
                .stdout(Stdio::piped());
            let mut child = spawn(cmd)?;
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let addr = tokio::time::timeout(Duration::from_secs(300), async {
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(a) = line.strip_prefix("idem listening on http://") {
                        return a.parse::<SocketAddr>().ok();
                    }
                }
                None
            })
            .await
            .ok()
            .flatten();
            let Some(addr) = addr else {
                eprintln!("{name}: the gateway did not listen under valgrind");
                return None;
            };
            // Keep reading what it prints, so that it never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            (child, addr)
        }
        Launch::Peer(bin, redis) => {
            let addr = free_addr();
            cmd.arg(bin)
                .arg(addr.to_string())
                .arg(format!("http://{upstream}"))
                .args(redis)
                .stdout(Stdio::null());
            let child = spawn(cmd)?;
            if !accepting(addr).await {
                eprintln!("{name}: the peer did not listen under valgrind");
                return None;
            }
            (child, addr)
        }
        Launch::Nginx(bin, _) => {
            let addr = free_addr();
            let conf = nginx_conf(keep, name, addr, upstream);
            cmd.arg(bin)
                .arg("-p")
                .arg(keep.join(name))
                .arg("-c")
                .arg(conf)
                .stdout(Stdio::null());
            let child = spawn(cmd)?;
            if !accepting(addr).await {
                eprintln!("{name}: nginx did not listen under valgrind");
                return None;
            }
            (child, addr)
        }
        Launch::Floor(_) | Launch::MyFloor(_) => return None,
    };
    let per = requests.div_ceil(settings.connections);
    let mut drivers = Vec::new();
    let mut left = requests;
    for c in 0..settings.connections {
        let these = per.min(left);
        left -= these;
        let prefix = format!("{}-{name}-{which}-{c}", uuid::Uuid::new_v4().simple());
        drivers.push(tokio::spawn(drive(addr, prefix, these)));
    }
    let mut failed = 0;
    for d in drivers {
        failed += d.await.unwrap_or(usize::MAX / 2);
    }
    // SIGTERM: the proxy stops cleanly, and callgrind writes its file as it exits.
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    if tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .is_err()
    {
        eprintln!("{name}: did not stop within 120s of SIGTERM; killed");
        let _ = child.kill().await;
        return None;
    }
    if failed > 0 {
        eprintln!("{name}: {failed} of {requests} requests failed; not counted");
        return None;
    }
    totals(&out)
}

fn spawn(mut cmd: Command) -> Option<Child> {
    match cmd.stderr(Stdio::inherit()).kill_on_drop(true).spawn() {
        Ok(child) => Some(child),
        Err(e) => {
            eprintln!("valgrind did not start: {e}");
            None
        }
    }
}

/// `requests` POSTs with fresh keys over one keep-alive connection; how many failed.
async fn drive(addr: SocketAddr, prefix: String, requests: usize) -> usize {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return requests;
    };
    stream.set_nodelay(true).unwrap();
    let Ok((mut sender, conn)) = http1::handshake(TokioIo::new(stream)).await else {
        return requests;
    };
    tokio::spawn(conn);
    let mut failed = 0;
    for i in 0..requests {
        let req = http::Request::post("/v1/charges")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk_load")
            .header("idempotency-key", format!("{prefix}-{i}"))
            .body(Full::new(Bytes::from_static(crate::BODY.as_bytes())))
            .unwrap();
        if sender.ready().await.is_err() {
            return failed + requests - i;
        }
        let ok = match sender.send_request(req).await {
            Ok(res) => {
                let status = res.status();
                res.into_body().collect().await.is_ok() && status == 201
            }
            Err(_) => false,
        };
        if !ok {
            failed += 1;
        }
    }
    failed
}

/// The `totals:` (or `summary:`) line of a callgrind file: every thread's instructions.
fn totals(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().rev().find_map(|l| {
        l.strip_prefix("totals:")
            .or_else(|| l.strip_prefix("summary:"))
    })?;
    line.split_whitespace().next()?.parse().ok()
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Waits up to 300 s (valgrind starts slowly) for `addr` to accept connections.
async fn accepting(addr: SocketAddr) -> bool {
    let deadline = Instant::now() + Duration::from_secs(300);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// nginx as the timed run has it (an upstream keep-alive pool, no access log), but one
/// process serving, so that callgrind sees all of its work; the configuration's path.
fn nginx_conf(dir: &Path, name: &str, addr: SocketAddr, upstream: SocketAddr) -> PathBuf {
    let one_process = "master_process off;\nworker_processes 1;";
    crate::others::nginx_conf(&dir.join(name), one_process, addr, upstream)
}
