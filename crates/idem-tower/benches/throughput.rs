//! Requests per second of a trivial axum handler, with and without `IdempotencyLayer`.
//!
//! A load driver rather than criterion: it starts the server on 127.0.0.1, drives it with
//! a fixed number of keep-alive connections for a fixed time, and prints the median of
//! several rounds and the ratio to the bare handler. Every keyed request carries a new
//! key, so each one reserves and completes a record (the layer's full write path); the
//! `replay` rows send one key over and over (the read path).
//!
//! Also measured in process (tower `oneshot`, no sockets), which shows the layer's own
//! cost without HTTP's. Each row also gives this process's CPU time per request (driver,
//! server and store together), which other work on a shared machine disturbs less than
//! requests/s.
//!
//! `cargo bench -p idem-tower --bench throughput`. Knobs: `IDEM_BENCH_SECS` (per round,
//! default 2), `IDEM_BENCH_ROUNDS` (default 3), `IDEM_BENCH_CONNECTIONS` (default 16),
//! `IDEM_BENCH_MODES` (`http`, `in-process` or both, comma-separated; default both) and
//! `IDEM_BENCH_ONLY` (`|`-separated parts of setup names, e.g. `no layer|memory, new`;
//! only those setups run), for profiling one path.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_core::{MemoryStore, Store};
use idem_sqlite::SqliteStore;
use idem_test_support::cpu_time;
use idem_tower::IdempotencyLayer;
use tower::ServiceExt;

const BODY: &str = r#"{"sku":"tea","qty":2,"amount":100}"#;

#[derive(Clone, Copy, PartialEq)]
enum Keys {
    None,
    Fresh,
    Same,
}

struct Setup {
    name: &'static str,
    router: Router,
    keys: Keys,
}

async fn handler() -> (StatusCode, &'static str) {
    (StatusCode::CREATED, r#"{"id":"ord_1"}"#)
}

fn base() -> Router {
    Router::new().route("/orders", post(handler))
}

/// The setups, and the directory of the SQLite file, which must outlive them.
async fn setups() -> (Vec<Setup>, tempfile::TempDir) {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new().max_entries(10_000_000));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let sqlite: Arc<dyn Store> = Arc::new(
        SqliteStore::connect(path.to_str().expect("utf-8 path"))
            .await
            .expect("open sqlite"),
    );
    let setups = vec![
        Setup {
            name: "no layer",
            router: base(),
            keys: Keys::None,
        },
        Setup {
            name: "layer, memory, new key each",
            router: base().layer(IdempotencyLayer::new(memory.clone())),
            keys: Keys::Fresh,
        },
        Setup {
            name: "layer, memory, replay",
            router: base().layer(IdempotencyLayer::new(memory)),
            keys: Keys::Same,
        },
        Setup {
            name: "layer, sqlite, new key each",
            router: base().layer(IdempotencyLayer::new(sqlite.clone())),
            keys: Keys::Fresh,
        },
        Setup {
            name: "layer, sqlite, replay",
            router: base().layer(IdempotencyLayer::new(sqlite)),
            keys: Keys::Same,
        },
    ];
    (setups, dir)
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn next_key(keys: Keys, seq: &AtomicU64, label: &str) -> Option<String> {
    match keys {
        Keys::None => None,
        Keys::Fresh => Some(format!(
            "bench-{label}-{}",
            seq.fetch_add(1, Ordering::Relaxed)
        )),
        Keys::Same => Some(format!("bench-{label}-replayed")),
    }
}

/// One run's figures.
#[derive(Clone, Copy)]
struct Run {
    rps: f64,
    /// This process's CPU time per request, microseconds: less sensitive than
    /// requests/s to other work on the machine.
    cpu_us: f64,
}

impl Run {
    fn new(requests: u64, elapsed: Duration, cpu: Duration) -> Run {
        let n = requests.max(1) as f64;
        Run {
            rps: requests as f64 / elapsed.as_secs_f64(),
            cpu_us: cpu.as_secs_f64() * 1e6 / n,
        }
    }
}

/// Drives `router` over HTTP for `secs`.
async fn over_http(setup: &Setup, secs: u64, connections: u64, round: u64) -> Run {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn({
        let router = setup.router.clone();
        async move { axum::serve(listener, router).await.expect("serve") }
    });
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections as usize)
        .build_http::<Full<Bytes>>();
    let uri: http::Uri = format!("http://{addr}/orders").parse().expect("uri");
    let label = format!("{}-{round}", setup.name.replace([' ', ','], ""));
    let seq = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    if setup.keys == Keys::Same {
        // Record the answer before the load starts; the load then only replays.
        let req = http::Request::post(uri.clone())
            .header("content-type", "application/json")
            .header(
                "idempotency-key",
                next_key(Keys::Same, &seq, &label).expect("key"),
            )
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .expect("request");
        let resp = client.request(req).await.expect("send");
        assert_eq!(resp.status(), 201, "priming request");
        resp.into_body().collect().await.expect("body");
    }
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (client, uri, seq, stop, done, measuring, label) = (
                client.clone(),
                uri.clone(),
                seq.clone(),
                stop.clone(),
                done.clone(),
                measuring.clone(),
                label.clone(),
            );
            let keys = setup.keys;
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let mut req =
                        http::Request::post(uri.clone()).header("content-type", "application/json");
                    if let Some(key) = next_key(keys, &seq, &label) {
                        req = req.header("idempotency-key", key);
                    }
                    let req = req.body(Full::new(Bytes::from_static(BODY.as_bytes())));
                    let resp = client.request(req.expect("request")).await.expect("send");
                    assert_eq!(resp.status(), 201, "unexpected status");
                    resp.into_body().collect().await.expect("body");
                    if measuring.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // Warm-up: connections open, caches fill.
    tokio::time::sleep(Duration::from_millis(500)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let cpu = cpu_time("self");
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let count = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu = cpu_time("self").saturating_sub(cpu);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }
    server.abort();
    Run::new(count, elapsed, cpu)
}

/// Drives `router` in process with `oneshot` for `secs`.
async fn in_process(setup: &Setup, secs: u64, concurrency: u64, round: u64) -> Run {
    let label = format!("inproc-{}-{round}", setup.name.replace([' ', ','], ""));
    let seq = Arc::new(AtomicU64::new(0));
    if setup.keys == Keys::Same {
        let req = http::Request::post("/orders")
            .header("content-type", "application/json")
            .header(
                "idempotency-key",
                next_key(Keys::Same, &seq, &label).expect("key"),
            )
            .body(Body::from(BODY))
            .expect("request");
        let resp = setup.router.clone().oneshot(req).await.expect("infallible");
        assert_eq!(resp.status(), 201, "priming request");
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let cpu = cpu_time("self");
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (router, seq, label) = (setup.router.clone(), seq.clone(), label.clone());
            let keys = setup.keys;
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let mut req =
                        http::Request::post("/orders").header("content-type", "application/json");
                    if let Some(key) = next_key(keys, &seq, &label) {
                        req = req.header("idempotency-key", key);
                    }
                    let req = req.body(Body::from(BODY)).expect("request");
                    let resp = router.clone().oneshot(req).await.expect("infallible");
                    assert_eq!(resp.status(), 201, "unexpected status");
                    resp.into_body().collect().await.expect("body");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    let elapsed = started.elapsed();
    Run::new(total, elapsed, cpu_time("self").saturating_sub(cpu))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let secs = env_or("IDEM_BENCH_SECS", 2);
    let rounds = env_or("IDEM_BENCH_ROUNDS", 3).max(1);
    let connections = env_or("IDEM_BENCH_CONNECTIONS", 16).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let only = std::env::var("IDEM_BENCH_ONLY").unwrap_or_default();
        let (all, _dir) = setups().await;
        let setups: Vec<Setup> = all
            .into_iter()
            .filter(|s| only.is_empty() || only.split('|').any(|w| s.name.contains(w.trim())))
            .collect();
        let modes = std::env::var("IDEM_BENCH_MODES").unwrap_or_else(|_| "http,in-process".into());
        for (mode, label) in [(0, "HTTP/1.1 on 127.0.0.1"), (1, "in process (oneshot)")] {
            if !modes
                .split(',')
                .any(|m| m.trim() == ["http", "in-process"][mode])
            {
                continue;
            }
            println!(
                "\n{label}: {connections} concurrent clients, {rounds} rounds of {secs} s, median"
            );
            let mut results = vec![Vec::new(); setups.len()];
            // Rounds interleave the setups so that drift on a shared machine hits all.
            for round in 0..rounds {
                for (i, setup) in setups.iter().enumerate() {
                    let run = if mode == 0 {
                        over_http(setup, secs, connections, round).await
                    } else {
                        in_process(setup, secs, connections, round).await
                    };
                    results[i].push(run);
                }
            }
            let medians: Vec<(f64, f64)> = results
                .into_iter()
                .map(|runs| {
                    let rps = median(runs.iter().map(|r| r.rps).collect());
                    let cpu = median(runs.iter().map(|r| r.cpu_us).collect());
                    (rps, cpu)
                })
                .collect();
            // Ratios are to the bare handler's run, when it ran.
            let bare = setups
                .iter()
                .position(|s| s.keys == Keys::None)
                .map_or(f64::NAN, |i| medians[i].0);
            for (setup, (rps, cpu)) in setups.iter().zip(&medians) {
                println!(
                    "  {:<30} {:>10.0} req/s   ratio to no layer {:.2}   CPU {:>6.1} µs/request",
                    setup.name,
                    rps,
                    rps / bare,
                    cpu
                );
            }
        }
    });
}
