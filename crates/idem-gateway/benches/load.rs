//! Load run: the real `idem` binary in front of a trivial upstream, idempotency off
//! (`--passthrough`) against on (memory, SQLite, Redis, PostgreSQL when reachable), at
//! 64 keep-alive connections (`IDEM_LOAD_CONNECTIONS` sets another number; 1 gives the
//! latency a keyed request adds when nothing queues), every request a POST with its own
//! fresh key.
//!
//! Prints requests/s, p50 and p99 latency per configuration and each one's throughput
//! as a ratio of pass-through, and CPU time per request: the gateway's, this process's
//! (driver and upstream), and the rest of the machine's (a store server, and whatever
//! else runs). The configurations run interleaved, `IDEM_LOAD_ROUNDS` rounds (default
//! 3) of `IDEM_LOAD_SECS` seconds each (default 3, after a 1 s warm-up). Each round
//! starts one configuration further on, and each run first waits for the machine to be
//! quiet. The medians are reported, each ratio taken within a round and followed by the
//! rounds' lowest and highest, and then what the SQLite and Redis targets allow in CPU
//! time per request against what was spent.
//! `IDEM_LOAD_ONLY=memory,sqlite` runs only those stores (and pass-through);
//! `IDEM_LOAD_ONLY=mcp` runs MCP tool calls (JSON-RPC, the key in `params._meta`) keyed
//! under `--profile mcp` on the memory store against the same calls passed through; and
//! `IDEM_LOAD_EXTRA=name=URL,...` adds stores under names of one's own, to compare
//! settings in one run (`sqlite-off=sqlite://off.db?synchronous=off`, say); flags after
//! the URL go to that gateway (`redis-rate=redis://127.0.0.1:6379 --tenant-key-rate
//! 1000000/s`).
//! `IDEM_LOAD_TENANTS=N` spreads the connections over N tenants (default one).
//! `IDEM_LOAD_PROTOCOL=h1,h2,tls` runs the whole load once per protocol the driver speaks
//! to the gateway (HTTP/1.1, the default; HTTP/2 with prior knowledge; HTTP/2 over TLS
//! with a certificate made for the run), idem's configurations only beyond HTTP/1.1, and
//! ends with every run's ratios side by side.
//! `IDEM_LOAD_UPSTREAM_US=200` makes the upstream spend that much CPU per request, as an
//! API with work of its own does (default none: the harshest case, where the gateway's
//! own cost is all there is); a list (`0,100,200`) runs the whole load once per value
//! and ends with every run's ratios side by side.
//!
//! ```text
//! cargo bench -p idem-gateway --bench load
//! ```
//!
//! Yardsticks in the same run (see `load/others.rs`), each in every round: with
//! PostgreSQL, its floor (`pgbench` when installed: a fresh key per transaction, an
//! insert-if-absent and then an update, each its own synced commit, at as many clients
//! as connections), and keyed PostgreSQL throughput as a ratio to it;
//! with MySQL (MariaDB at `IDEM_TEST_MYSQL_URL`, else the local server), its floor (a
//! driver here, `load/myfloor.rs`: a fresh key per request, an insert-if-absent and then
//! an update, each its own autocommit, on as many connections as the gateway's), keyed
//! MySQL throughput as a ratio to it (target 1.5), and the server's CPU time per request
//! under both;
//! `IDEM_LOAD_PEER=PATH` (the `idempotent-rs` peer proxy's binary) adds the peer on
//! memory and on Redis, and idem's keyed throughput as a ratio to the peer's;
//! `IDEM_LOAD_NGINX=PATH` (nginx's binary) adds nginx as a pass-through proxy with one
//! worker and two (upstream keep-alive pool, no access log), and idem's pass-through as
//! a ratio to it.
//!
//! `IDEM_LOAD_CALLGRIND=1` first counts the instructions per request of each proxy
//! under callgrind (`=only`: nothing else; see `load/callgrind.rs`), which do not
//! depend on what else the machine runs.
//!
//! The driver, the upstream and the gateway share the machine's cores, so absolute
//! figures understate a dedicated gateway; the ratios are the point.

#[path = "load/callgrind.rs"]
mod callgrind;
#[path = "load/myfloor.rs"]
mod myfloor;
#[path = "load/others.rs"]
mod others;
#[path = "load/wire.rs"]
mod wire;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use idem_test_support::cpu_time;
use others::{Floor, Launch, Proxy};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use wire::{Proto, Wire};

/// Keep-alive connections, unless `IDEM_LOAD_CONNECTIONS` says otherwise.
const CONNECTIONS: usize = 64;
const BODY: &str = r#"{"amount":100,"currency":"eur","customer":"cus_123"}"#;

struct Figures {
    name: String,
    /// This process's (driver + upstream) CPU time per request, microseconds.
    driver_us: f64,
    /// How busy the whole machine was, 0–100 %.
    machine_busy: f64,
    /// The CPU time per request of everything else on the machine (a store server
    /// such as redis-server or PostgreSQL, and unrelated load), microseconds.
    others_us: f64,
    /// Gateway CPU time per request, microseconds.
    cpu_us: f64,
    requests: usize,
    errors: usize,
    secs: f64,
    p50: Duration,
    p99: Duration,
}

impl Figures {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.secs
    }
}

/// The upstream: reads the request body, then answers `201` with a small JSON body,
/// after `work` of CPU time spent spinning (none by default), which stands for an
/// API's own work per request.
///
/// It reads the body as an API does: a server that answers before the body has arrived
/// and then closes the connection (what hyper does when a handler leaves the body
/// unread) has the kernel reset it with the body unread, and that reset can destroy
/// the answer on its way back, which the gateway then rightly reports as a connection
/// lost after the request was sent.
async fn upstream(work: Duration) -> SocketAddr {
    use axum::http::StatusCode;
    let app = axum::Router::new().fallback(move |_body: axum::body::Bytes| async move {
        let started = Instant::now();
        while started.elapsed() < work {
            std::hint::spin_loop();
        }
        (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            r#"{"id":"ch_1","status":"succeeded"}"#,
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Whether the run measures MCP tool calls (`IDEM_LOAD_ONLY` names `mcp`): then every
/// configuration's requests, pass-through's too, are JSON-RPC `tools/call`s carrying
/// their key in `params._meta`, so that the keyed call and the pass-through one are
/// the same bytes on the wire.
fn tool_calls() -> bool {
    std::env::var("IDEM_LOAD_ONLY").is_ok_and(|only| only.split(',').any(|n| n.trim() == "mcp"))
}

/// A `tools/call` of the charge `BODY` under `key`, its request id `id`.
fn tool_call(key: &str, id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"charge","arguments":{BODY},"_meta":{{"idempotency-key":"{key}"}}}}}}"#
    )
}

/// A configuration started for the run: a proxy the driver loads, or the floor.
enum Running {
    Proxy(Proxy, Wire),
    Floor(Floor),
    MyFloor(myfloor::MyFloor),
}

/// Busy and total ticks of the whole machine, from /proc/stat (Linux); zeros elsewhere.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return (0, 0);
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let total: u64 = f.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Issue 5's throughput target for a store, as a ratio of pass-through; `None` for the
/// configurations without one.
fn target(name: &str) -> Option<f64> {
    match name {
        "sqlite" => Some(0.70),
        "redis" => Some(0.80),
        _ => None,
    }
}

async fn gateway(upstream: SocketAddr, extra: &[&str], dir: &std::path::Path) -> Proxy {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("serve")
        .args(["--upstream", &format!("http://{upstream}")])
        .args(["--listen", "127.0.0.1:0", "--ttl", "10m"])
        // Apart from anything else on the same server; Redis deletes the records 10
        // minutes on, and a later run's sweeper purges the PostgreSQL rows.
        .args(["--store-namespace", "idem_load"])
        .args(extra)
        .env("IDEM_LOG", "warn")
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the idem binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let listening = line
                .strip_prefix("idem listening on http://")
                .or_else(|| line.strip_prefix("idem listening on https://"));
            if let Some(a) = listening {
                return a.parse().unwrap();
            }
        }
        panic!("the gateway exited before listening")
    })
    .await
    .expect("the gateway starts within 30s");
    Proxy {
        child,
        addr,
        with_children: false,
    }
}

/// One connection's loop: POSTs with fresh keys until `stop`; latencies of the requests
/// that started after `warm` was set.
async fn connection(
    wire: Wire,
    addr: SocketAddr,
    prefix: String,
    tenant: http::HeaderValue,
    warm: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> (Vec<Duration>, usize) {
    let mut sender = wire.connect(addr).await;
    // HTTP/2 names the authority in the URI (`:authority`), HTTP/1.1 in `Host`.
    let uri = match wire.proto {
        Proto::H1 => "/v1/charges",
        Proto::H2 => "http://gateway/v1/charges",
        Proto::Tls => "https://gateway/v1/charges",
    };
    let tool_calls = tool_calls();
    let mut latencies = Vec::with_capacity(16_384);
    let mut errors = 0;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let mut req = http::Request::post(uri);
        if wire.proto == Proto::H1 {
            req = req.header("host", "gateway");
        }
        let req = req
            .header("content-type", "application/json")
            .header("authorization", tenant.clone());
        let req = if tool_calls {
            // The key in the call's `_meta`, a request id of its own (issue 64).
            req.body(Full::new(Bytes::from(tool_call(
                &format!("{prefix}-{i}"),
                i,
            ))))
        } else {
            req.header("idempotency-key", format!("{prefix}-{i}"))
                .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        }
        .unwrap();
        let measured = warm.load(Ordering::Relaxed);
        let t = Instant::now();
        if sender.ready().await.is_err() {
            // The proxy closed the connection (nginx does after `keepalive_requests`):
            // open another, as a client would, rather than stop this connection's load.
            sender = wire.connect(addr).await;
            if sender.ready().await.is_err() {
                break;
            }
        }
        let ok = match sender.send(req).await {
            Ok(res) => {
                let status = res.status();
                res.into_body().collect().await.is_ok() && status == 201
            }
            Err(_) => false,
        };
        if measured {
            latencies.push(t.elapsed());
            if !ok {
                errors += 1;
            }
        }
    }
    (latencies, errors)
}

async fn run(name: &str, gw: &Proxy, wire: &Wire, connections: usize, secs: u64) -> Figures {
    let addr = gw.addr;
    let warm = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    // IDEM_LOAD_TENANTS=N spreads the connections over N tenants (default 1).
    let tenants: usize = std::env::var("IDEM_LOAD_TENANTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
        .max(1);
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            let tenant = match tenants {
                1 => "Bearer sk_load".to_owned(),
                n => format!("Bearer sk_load_{}", c % n),
            };
            tokio::spawn(connection(
                wire.clone(),
                addr,
                format!("{}-{c}", &run_id[..12]),
                http::HeaderValue::try_from(tenant).expect("a header value"),
                warm.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    warm.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let cpu_before = gw.cpu_time();
    let driver_before = cpu_time("self");
    let machine_before = machine_ticks();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let cpu = gw.cpu_time().saturating_sub(cpu_before);
    let driver = cpu_time("self").saturating_sub(driver_before);
    let machine_after = machine_ticks();
    let busy = machine_after.0.saturating_sub(machine_before.0) as f64;
    let total = machine_after.1.saturating_sub(machine_before.1).max(1) as f64;
    let elapsed = started.elapsed().as_secs_f64();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    // Ticks are 10 ms each (USER_HZ 100 on Linux).
    let others = (busy / 100.0 - cpu.as_secs_f64() - driver.as_secs_f64()).max(0.0);
    Figures {
        name: name.to_owned(),
        others_us: others * 1e6 / all.len().max(1) as f64,
        cpu_us: cpu.as_secs_f64() * 1e6 / all.len().max(1) as f64,
        driver_us: driver.as_secs_f64() * 1e6 / all.len().max(1) as f64,
        machine_busy: 100.0 * busy / total,
        requests: all.len(),
        errors,
        secs: elapsed,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

/// Waits, up to 5 s, for the machine to be quiet (under a fifth busy over 250 ms), so
/// that what a run left behind (a store's background writes) is not counted against
/// the next one.
async fn settle() {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let before = machine_ticks();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let after = machine_ticks();
        let busy = after.0.saturating_sub(before.0) as f64;
        let total = after.1.saturating_sub(before.1).max(1) as f64;
        if busy / total < 0.2 {
            return;
        }
        if Instant::now() > deadline {
            println!(
                "  (the machine stayed {:.0}% busy between runs)",
                100.0 * busy / total
            );
            return;
        }
    }
}

async fn reachable(url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(5), idem_gateway::store::open(url)).await {
        Ok(Ok(store)) => store.ping().await.is_ok(),
        _ => false,
    }
}

fn main() {
    // Only `--bench`-style invocations run the load; `cargo test --benches` passes no
    // such flag and should not spend a minute here.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // IDEM_LOAD_CONNECTIONS=1: the latency a keyed request adds when nothing queues.
    let connections: usize = std::env::var("IDEM_LOAD_CONNECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CONNECTIONS)
        .max(1);
    let secs: u64 = std::env::var("IDEM_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let rounds: usize = std::env::var("IDEM_LOAD_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // IDEM_LOAD_UPSTREAM_US=200: the upstream spends that much CPU per request, as an
    // API with work of its own does; the default, none, is the harshest case. A list
    // (0,100,200) runs each in turn and ends with the ratios side by side.
    let works = upstream_works(&std::env::var("IDEM_LOAD_UPSTREAM_US").unwrap_or_default());
    rt.block_on(async move {
        let pg = idem_test_support::services::postgres_url();
        let redis = idem_test_support::services::redis_url();
        let mysql = idem_test_support::services::mysql_url();
        let mut configs: Vec<(String, Vec<String>)> = vec![
            (
                "pass-through".into(),
                vec!["--passthrough".into(), "--store".into(), "memory://".into()],
            ),
            // Room for every request of a long run: at the default bound of 100 000
            // the store would be dropping records, work that is not the keyed path's.
            (
                "memory".into(),
                vec!["--store".into(), "memory://?max_entries=2000000".into()],
            ),
            (
                "sqlite".into(),
                vec!["--store".into(), "sqlite://load.db".into()],
            ),
        ];
        if reachable(&redis).await {
            configs.push(("redis".into(), vec!["--store".into(), redis.clone()]));
        } else {
            eprintln!("Redis at {redis} unreachable: skipped");
        }
        if reachable(&pg).await {
            configs.push(("postgres".into(), vec!["--store".into(), pg.clone()]));
        } else {
            eprintln!("PostgreSQL unreachable: skipped");
        }
        if reachable(&mysql).await {
            configs.push(("mysql".into(), vec!["--store".into(), mysql.clone()]));
        } else {
            eprintln!("MySQL unreachable: skipped");
        }
        if tool_calls() {
            // Keyed tool calls (issue 64) on the memory store, against pass-through.
            configs.push((
                "mcp".into(),
                vec![
                    "--store".into(),
                    "memory://?max_entries=2000000".into(),
                    "--profile".into(),
                    "mcp".into(),
                ],
            ));
        }
        // IDEM_LOAD_ONLY=memory,sqlite narrows the run (pass-through always runs).
        if let Ok(only) = std::env::var("IDEM_LOAD_ONLY") {
            let only: Vec<&str> = only.split(',').map(str::trim).collect();
            configs.retain(|(name, _)| name == "pass-through" || only.contains(&name.as_str()));
        }
        // IDEM_LOAD_EXTRA=name=URL,... adds stores under names of one's own.
        for extra in std::env::var("IDEM_LOAD_EXTRA")
            .unwrap_or_default()
            .split(',')
        {
            if let Some((name, url)) = extra.split_once('=') {
                // `name=URL --flag value ...`: the gateway's own flags after the URL.
                let mut words = url.split_whitespace().map(str::to_owned);
                let mut args = vec!["--store".into()];
                args.extend(words.next());
                args.extend(words);
                configs.push((name.trim().to_owned(), args));
            }
        }

        // The yardsticks, beside the configurations they measure.
        let has = |n: &str| configs.iter().any(|(name, _)| name == n);
        let (pg_on, redis_on, memory_on) = (has("postgres"), has("redis"), has("memory"));
        let mysql_on = has("mysql");
        let mut configs: Vec<(String, Launch)> = configs
            .into_iter()
            .map(|(name, args)| (name, Launch::Idem(args)))
            .collect();
        for (name, launch) in others::optional(
            pg_on.then_some(pg.as_str()),
            redis_on.then_some(redis.as_str()),
        ) {
            let wanted = match name.as_str() {
                "peer-memory" => memory_on,
                _ => true,
            };
            if wanted {
                configs.push((name, launch));
            }
        }
        if mysql_on {
            configs.push(("mysql-floor".into(), Launch::MyFloor(mysql.clone())));
        }

        // IDEM_LOAD_CALLGRIND=1: instructions per request first (=only: nothing else).
        if let Ok(mode) = std::env::var("IDEM_LOAD_CALLGRIND") {
            let up = upstream(Duration::ZERO).await;
            callgrind::count(&configs, up, &callgrind::Settings::from_env()).await;
            if mode == "only" {
                return;
            }
        }

        // IDEM_LOAD_PROTOCOL=h1,h2,tls: the whole load once per protocol; the
        // yardsticks speak HTTP/1.1 only, so they run with it alone.
        let protos = Proto::list(&std::env::var("IDEM_LOAD_PROTOCOL").unwrap_or_default());
        let mut by_run = Vec::new();
        for &proto in &protos {
            let these: Vec<(String, Launch)> = configs
                .iter()
                .filter(|(_, launch)| proto == Proto::H1 || matches!(launch, Launch::Idem(_)))
                .cloned()
                .collect();
            for &work in &works {
                let ratios = load_run(&these, proto, work, connections, secs, rounds).await;
                by_run.push((proto, work, ratios));
            }
        }
        if by_run.len() > 1 {
            print_by_run(&by_run);
        }
    });
}

/// The ratios of one load run: per configuration, the median of the rounds' ratios to
/// pass-through, then the lowest and highest.
type Ratios = Vec<(String, f64, f64, f64)>;

/// One load run of every configuration in `configs` against an upstream that spends
/// `work` per request: prints the rounds, the medians and the CPU budget at the targets,
/// and returns the ratios.
async fn load_run(
    configs: &[(String, Launch)],
    proto: Proto,
    work: Duration,
    connections: usize,
    secs: u64,
    rounds: usize,
) -> Ratios {
    let up = upstream(work).await;
    // A directory of its own per run: each run's SQLite files start empty.
    let dir = tempfile::tempdir().unwrap();
    let (wire, wire_args) = Wire::new(proto, dir.path());
    println!(
        "idem load run: {connections} {} connections, POST with a fresh key per request, \
         {rounds} rounds of {secs}s per configuration, upstream work {} us per request",
        proto.name(),
        work.as_micros()
    );
    // Every gateway runs for the whole load run; the rounds interleave them so that
    // other load on the machine hits every configuration alike, and each round's
    // ratio compares figures taken seconds apart.
    let mut gateways = Vec::new();
    for (name, launch) in configs {
        let running = match launch {
            Launch::Idem(args) => {
                let args: Vec<&str> = args.iter().chain(&wire_args).map(String::as_str).collect();
                Running::Proxy(gateway(up, &args, dir.path()).await, wire.clone())
            }
            Launch::Peer(bin, redis) => {
                Running::Proxy(others::peer(bin, redis.as_deref(), up).await, Wire::h1())
            }
            Launch::Nginx(bin, workers) => Running::Proxy(
                others::nginx(bin, *workers, up, dir.path()).await,
                Wire::h1(),
            ),
            Launch::Floor(url) => Running::Floor(Floor::new(url, dir.path()).await),
            Launch::MyFloor(url) => Running::MyFloor(myfloor::MyFloor::new(url, connections).await),
        };
        gateways.push((name.as_str(), running));
    }
    let mut rounds_out: Vec<Vec<Figures>> = Vec::new();
    for round in 1..=rounds {
        println!("round {round}:");
        let mut this_round: Vec<Option<Figures>> = (0..gateways.len()).map(|_| None).collect();
        // Each round starts one configuration further on, so that none always runs
        // right after the same one (PostgreSQL, say, whose checkpoints and vacuum go
        // on after its run).
        for k in 0..gateways.len() {
            let i = (k + round - 1) % gateways.len();
            let (name, gw) = &gateways[i];
            settle().await;
            let server_before = myfloor::server_cpu();
            let f = match gw {
                Running::Proxy(gw, wire) => run(name, gw, wire, connections, secs).await,
                Running::Floor(floor) => floor_run(name, floor, connections, secs).await,
                Running::MyFloor(floor) => {
                    let machine_before = machine_ticks();
                    let figures = floor.run(connections, secs).await;
                    floor_figures(name, figures, machine_before)
                }
            };
            let server = myfloor::server_cpu().saturating_sub(server_before);
            println!(
                "  {:<13} {:>7.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  CPU/req: gateway {:>4.0} us, driver+upstream {:>4.0} us, rest {:>4.0} us  machine {:>3.0}% busy  errors {}",
                f.name,
                f.rps(),
                f.p50.as_secs_f64() * 1e3,
                f.p99.as_secs_f64() * 1e3,
                f.cpu_us,
                f.driver_us,
                f.others_us,
                f.machine_busy,
                f.errors
            );
            // The MySQL pair: the server's own CPU time per request (part of the rest).
            if name.starts_with("mysql") {
                println!(
                    "  {:<13} of which the MariaDB server {:>4.0} us per request",
                    "",
                    server.as_secs_f64() * 1e6 / f.requests.max(1) as f64
                );
            }
            this_round[i] = Some(f);
        }
        rounds_out.push(
            this_round
                .into_iter()
                .map(|f| f.expect("every configuration ran"))
                .collect(),
        );
    }
    drop(gateways);

    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // The median over the rounds of a figure of configuration `i`.
    let col = |i: usize, f: &dyn Fn(&Figures) -> f64| {
        median(rounds_out.iter().map(|r| f(&r[i])).collect())
    };
    let mut out = Vec::new();
    println!(
        "medians over {rounds} rounds (ratio: this store's throughput / pass-through's in the same round):"
    );
    for (i, (name, _)) in configs.iter().enumerate() {
        let ratios: Vec<f64> = rounds_out
            .iter()
            .map(|r| r[i].rps() / r[0].rps().max(1.0))
            .collect();
        // The spread shows how much of a difference between two runs is noise.
        let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let ratio = median(ratios);
        out.push((name.clone(), ratio, lowest, highest));
        let target = target(name).map_or(String::new(), |t| format!("  (target >= {t:.2})"));
        println!(
            "  {:<13} {:>7.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  CPU/req: gateway {:>4.0} us, rest {:>4.0} us  ratio {:.2} ({lowest:.2}-{highest:.2}){target}",
            name,
            col(i, &|f| f.rps()),
            col(i, &|f| f.p50.as_secs_f64() * 1e3),
            col(i, &|f| f.p99.as_secs_f64() * 1e3),
            col(i, &|f| f.cpu_us),
            col(i, &|f| f.others_us),
            ratio,
        );
    }

    // What the targets allow, in CPU time: with every core busy, throughput goes as
    // the inverse of the CPU the whole machine spends per request, so a ratio r
    // allows a keyed request 1/r of pass-through's total.
    let pass_total = col(0, &|f| f.driver_us + f.cpu_us + f.others_us);
    let mut heading = false;
    for (i, (name, _)) in configs.iter().enumerate() {
        let Some(target) = target(name) else {
            continue;
        };
        if !heading {
            println!(
                "CPU budget at the targets: pass-through costs the machine {pass_total:.0} us per request in all"
            );
            heading = true;
        }
        let allowed = pass_total / target;
        let driver = col(i, &|f| f.driver_us);
        let budget = allowed - driver;
        let spent = col(i, &|f| f.cpu_us + f.others_us);
        let busy = col(i, &|f| f.machine_busy);
        println!(
            "  {name:<13} {target:.2} allows {allowed:.0} us; less the driver and upstream's {driver:.0} us, the gateway and its store server may spend {budget:.0} us, and spent {spent:.0} us (machine {busy:.0}% busy)",
        );
    }
    compare(configs, &rounds_out);
    out
}

/// idem against its yardsticks, each pair's throughput ratio taken within a round:
/// keyed PostgreSQL against the floor, keyed memory and Redis against the peer's,
/// pass-through against nginx. For each, what the target allows idem to spend per
/// request in CPU time (the whole machine's: with every core busy, throughput goes as
/// its inverse) against what it spent.
fn compare(configs: &[(String, Launch)], rounds: &[Vec<Figures>]) {
    const PAIRS: &[(&str, &str, f64)] = &[
        ("postgres", "pg-floor", 2.0),
        ("mysql", "mysql-floor", 1.5),
        ("memory", "peer-memory", 1.5),
        ("redis", "peer-redis", 1.5),
        ("pass-through", "nginx-1w", 1.0),
        ("pass-through", "nginx-2w", 1.0),
    ];
    let at = |n: &str| configs.iter().position(|(name, _)| name == n);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut heading = false;
    for &(ours, theirs, target) in PAIRS {
        let (Some(a), Some(b)) = (at(ours), at(theirs)) else {
            continue;
        };
        if !heading {
            println!("against the yardsticks (ratio within each round; median, lowest-highest):");
            heading = true;
        }
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|r| r[a].rps() / r[b].rps().max(1.0))
            .collect();
        let lowest = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let col = |i: usize, f: &dyn Fn(&Figures) -> f64| {
            median(rounds.iter().map(|r| f(&r[i])).collect())
        };
        let p99 = |i: usize| col(i, &|f| f.p99.as_secs_f64() * 1e3);
        let total = |i: usize| col(i, &|f| f.driver_us + f.cpu_us + f.others_us);
        println!(
            "  {ours} / {theirs}: {:.2} ({lowest:.2}-{highest:.2}), target >= {target:.2}; p99 {:.2} ms against {:.2} ms",
            median(ratios),
            p99(a),
            p99(b),
        );
        println!(
            "    CPU per request: {ours} gateway {:.0} us, rest {:.0} us, all {:.0} us; {theirs} proxy {:.0} us, rest {:.0} us, all {:.0} us; the target allows {ours} {:.0} us in all",
            col(a, &|f| f.cpu_us),
            col(a, &|f| f.others_us),
            total(a),
            col(b, &|f| f.cpu_us),
            col(b, &|f| f.others_us),
            total(b),
            total(b) / target,
        );
    }
}

/// One pgbench run of the floor, as figures like a proxy's: its transactions (two
/// commits each) for requests; the machine's CPU time, pgbench's and the server's, all
/// counted as the rest.
async fn floor_run(name: &str, floor: &Floor, connections: usize, secs: u64) -> Figures {
    let machine_before = machine_ticks();
    let f = floor.run(connections, secs).await;
    floor_figures(name, f, machine_before)
}

/// A floor's run as figures like a proxy's, the machine's ticks taken at its start
/// being `machine_before`.
fn floor_figures(name: &str, f: others::FloorFigures, machine_before: (u64, u64)) -> Figures {
    let machine_after = machine_ticks();
    let busy = machine_after.0.saturating_sub(machine_before.0) as f64;
    let total = machine_after.1.saturating_sub(machine_before.1).max(1) as f64;
    let n = f.transactions.max(1) as f64;
    Figures {
        name: name.to_owned(),
        driver_us: 0.0,
        machine_busy: 100.0 * busy / total,
        others_us: busy / 100.0 * 1e6 / n,
        cpu_us: 0.0,
        requests: f.transactions,
        errors: 0,
        secs: f.secs,
        p50: f.p50,
        p99: f.p99,
    }
}

/// The upstream's CPU time per request for each run, from `IDEM_LOAD_UPSTREAM_US`'s
/// comma-separated microseconds; none when unset.
fn upstream_works(var: &str) -> Vec<Duration> {
    let works: Vec<Duration> = var
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let us = s.trim().parse().unwrap_or_else(|_| {
                panic!("IDEM_LOAD_UPSTREAM_US: {s:?} is not a number of microseconds")
            });
            Duration::from_micros(us)
        })
        .collect();
    if works.is_empty() {
        vec![Duration::ZERO]
    } else {
        works
    }
}

/// The ratios of every run side by side: a row per protocol and upstream work, a column
/// per configuration of idem's (the yardsticks ran over HTTP/1.1 only and are left out).
fn print_by_run(by_run: &[(Proto, Duration, Ratios)]) {
    println!("ratios to pass-through by protocol and upstream work (median, lowest-highest):");
    let last = by_run.last().map(|r| &r.2);
    let names: Vec<&str> = last
        .into_iter()
        .flatten()
        .skip(1)
        .map(|r| r.0.as_str())
        .collect();
    let mut heading = format!("  {:<16} {:<12}", "protocol", "upstream us");
    for name in &names {
        heading.push_str(&format!("  {name:<17}"));
    }
    println!("{}", heading.trim_end());
    for (proto, work, ratios) in by_run {
        let mut row = format!("  {:<16} {:<12}", proto.name(), work.as_micros());
        let ratios = ratios
            .iter()
            .skip(1)
            .filter(|r| names.contains(&r.0.as_str()));
        for (_, ratio, lowest, highest) in ratios {
            row.push_str(&format!(
                "  {:<17}",
                format!("{ratio:.2} ({lowest:.2}-{highest:.2})")
            ));
        }
        println!("{}", row.trim_end());
    }
}
