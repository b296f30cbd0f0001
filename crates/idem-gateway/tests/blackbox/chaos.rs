//! Chaos (SPEC S5, S7, S10): while clients send, resend and hang up on a few hundred
//! keys at once, the gateway is killed with SIGKILL again and again (on SQLite,
//! PostgreSQL and Redis), or its shared store drops out again and again (PostgreSQL and
//! Redis behind a relay that refuses, resets and stalls).
//!
//! What a fault may cost is bounded by the spec: an attempt whose outcome the fault hid
//! runs again as the next attempt once its lease lapses. What it may never cost, and
//! what this checks after the dust settles: an attempt of a key running twice, a key
//! that never gets an answer, or a replay of anything but one of the key's own
//! executions.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use idem_test_support::{Relay, RelayMode, service_addr, url_via};

use crate::common::{Gateway, Upstream, new_key, read_message};
use crate::shared::{on_shared, postgres, redis};

const KEYS: usize = 400;
const CLIENTS: usize = 8;
const KILLS: usize = 5;
const OUTAGES: usize = 6;
/// Short, so that attempts a kill left in progress are taken over soon after; long
/// enough that a live attempt's renewals, late on a loaded machine, still keep it.
const LEASE: &str = "3s";

/// A small xorshift generator: the test needs variety, not quality.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Key `i`'s request: the same body every time, and an upstream that takes 0, 50, 100
/// or 150 ms (a header, outside the fingerprint) so that kills find work in flight.
fn request(key: &str, i: usize) -> String {
    let body = format!(r#"{{"amount":{i}}}"#);
    format!(
        "POST /v1/charges HTTP/1.1\r\nHost: gw\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nx-test-delay-ms: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        (i % 4) * 50,
        body.len()
    )
}

/// Sends `request` on a new connection and reads the answer: its status and body, or
/// `None` when the gateway is down or went down before answering.
async fn send(addr: SocketAddr, request: &str) -> Option<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(request.as_bytes()).await.ok()?;
    let (head, body) = tokio::time::timeout(Duration::from_secs(10), read_message(&mut stream))
        .await
        .ok()??;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body))
}

/// Sends key `i`'s request until it is answered 201, and returns the answer's `n`;
/// panics on any other answer than 409 or 503 (or none: a gateway still starting),
/// and after 30 s.
async fn settle(addr: SocketAddr, key: &str, i: usize) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match send(addr, &request(key, i)).await {
            Some((201, body)) => {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                return v["n"].as_u64().unwrap();
            }
            other => {
                let status = other.map(|(s, _)| s);
                assert!(
                    matches!(status, Some(409 | 503) | None),
                    "key {i}: {status:?} while settling"
                );
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "key {i} never settled"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_again_and_again_on_sqlite_never_runs_an_attempt_twice() {
    kill_9_again_and_again(&["--store", "sqlite://idem.db", "--lease", LEASE]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_again_and_again_on_postgres_never_runs_an_attempt_twice() {
    let Some(url) = postgres().await else {
        return;
    };
    kill_9_again_and_again(&on_shared(&url, &["--lease", LEASE])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_again_and_again_on_redis_never_runs_an_attempt_twice() {
    let Some(url) = redis().await else {
        return;
    };
    kill_9_again_and_again(&on_shared(&url, &["--lease", LEASE])).await;
}

/// The run: kills, then settling every key, then the checks.
async fn kill_9_again_and_again(args: &[&str]) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut gw = Gateway::start(&up.url(), dir.path(), args).await;
    let load = Load::start(gw.addr);

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut restarts = Vec::new();
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(600))).await;
        gw.kill9().await;
        gw = Gateway::start(&up.url(), dir.path(), args).await;
        // The new gateway is up: what the dead one sent has long reached the upstream
        // (starting takes far longer than loopback delivery), and what this one sends
        // comes after.
        restarts.push(Instant::now());
        *load.addr.write().unwrap() = gw.addr;
    }
    let (keys, tally) = load.stop().await;
    assert_only(&tally, &["201", "409", "no answer", "hung up"]);

    // A later attempt is sent only by a gateway started after the attempt before it
    // was sent: never while that one's gateway still lives (its lease is renewed while
    // it runs).
    let settled = settle_all(gw.addr, &keys).await;
    let unsent = check(&up, &keys, &settled, |before, start| {
        restarts.iter().any(|r| before < *r && *r < start)
    });
    report(&format!("{KILLS} kills"), &up, &keys, &tally, unsent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_outages_again_and_again_on_postgres_never_run_an_attempt_twice() {
    let Some(url) = postgres().await else {
        return;
    };
    store_outages_again_and_again(&url, 5432).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_outages_again_and_again_on_redis_never_run_an_attempt_twice() {
    let Some(url) = redis().await else {
        return;
    };
    store_outages_again_and_again(&url, 6379).await;
}

/// The store behind a relay that, again and again, refuses connections, resets them or
/// stops answering for a few hundred milliseconds, so that reserves, completions and
/// renewals fail before or after the store acted; the gateway stays up.
async fn store_outages_again_and_again(url: &str, default_port: u16) {
    let relay = Relay::start(service_addr(url, default_port).await).await;
    let store = url_via(url, relay.addr());
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &on_shared(&store, &["--lease", LEASE]),
    )
    .await;
    let load = Load::start(gw.addr);
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let modes = [RelayMode::Refuse, RelayMode::Reset, RelayMode::Stall];
    for outage in 0..OUTAGES {
        tokio::time::sleep(Duration::from_millis(200 + rng.below(400))).await;
        relay.set_mode(modes[outage % modes.len()]);
        tokio::time::sleep(Duration::from_millis(300 + rng.below(700))).await;
        relay.set_mode(RelayMode::Forward);
    }
    let (keys, tally) = load.stop().await;
    // 503: the store could not be reached, nothing was forwarded.
    assert_only(&tally, &["201", "409", "503", "hung up"]);

    // With the gateway alive, a later attempt runs only once the attempt before it
    // lost its lease: its answer could not be recorded, or its renewals failed. Its
    // lease ran from its reserve, a moment before it reached the upstream.
    let lease = Duration::from_secs(1);
    let slack = Duration::from_millis(200);
    let settled = settle_all(gw.addr, &keys).await;
    let unsent = check(&up, &keys, &settled, |before, start| {
        start.duration_since(before) >= lease - slack
    });
    report(&format!("{OUTAGES} outages"), &up, &keys, &tally, unsent);
}

type Tally = HashMap<&'static str, u64>;

/// Asserts that every outcome in `tally` is one of `allowed`.
fn assert_only(tally: &Tally, allowed: &[&str]) {
    let unexpected: Vec<_> = tally.keys().filter(|k| !allowed.contains(k)).collect();
    assert!(unexpected.is_empty(), "{tally:?}");
}

/// Clients sending, resending and hanging up on [`KEYS`] keys until stopped.
struct Load {
    /// Where the gateway listens (it moves when the gateway restarts).
    addr: Arc<RwLock<SocketAddr>>,
    keys: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<Tally>>,
}

impl Load {
    fn start(addr: SocketAddr) -> Load {
        let addr = Arc::new(RwLock::new(addr));
        let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|_| new_key()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        // Half the requests take the next key never sent before, so that first
        // executions go on while the faults come; the others resend a key already sent.
        let next = Arc::new(AtomicUsize::new(0));
        let clients = (0..CLIENTS)
            .map(|c| {
                let (addr, keys, stop, next) =
                    (addr.clone(), keys.clone(), stop.clone(), next.clone());
                tokio::spawn(async move {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1));
                    let mut tally = Tally::new();
                    while !stop.load(Ordering::Relaxed) {
                        let sent = next.load(Ordering::Relaxed).min(KEYS);
                        let i = if sent < KEYS && (sent == 0 || rng.below(2) == 0) {
                            next.fetch_add(1, Ordering::Relaxed).min(KEYS - 1)
                        } else {
                            rng.below(sent as u64) as usize
                        };
                        let request = request(&keys[i], i);
                        let at = *addr.read().unwrap();
                        // Some clients give up before the answer comes.
                        if rng.below(100) < 15 {
                            if let Ok(mut s) = TcpStream::connect(at).await {
                                let _ = s.write_all(request.as_bytes()).await;
                                tokio::time::sleep(Duration::from_millis(rng.below(100))).await;
                            }
                            *tally.entry("hung up").or_default() += 1;
                            continue;
                        }
                        let outcome = match send(at, &request).await {
                            Some((201, _)) => "201",
                            Some((409, _)) => "409",
                            Some((503, _)) => "503",
                            Some(_) => "other",
                            None => {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                "no answer"
                            }
                        };
                        *tally.entry(outcome).or_default() += 1;
                    }
                    tally
                })
            })
            .collect();
        Load {
            addr,
            keys,
            stop,
            clients,
        }
    }

    /// Stops the clients; the keys and what the clients got, summed.
    async fn stop(self) -> (Arc<Vec<String>>, Tally) {
        self.stop.store(true, Ordering::Relaxed);
        let mut tally = Tally::new();
        for client in self.clients {
            for (k, v) in client.await.unwrap() {
                *tally.entry(k).or_default() += v;
            }
        }
        // Between the faults the gateway served.
        assert!(tally.get("201").is_some_and(|n| *n >= 50), "{tally:?}");
        (self.keys, tally)
    }
}

/// Every key gets its answer: a replay, or, for a key a fault left in progress, the
/// next attempt once the lease lapses (409 until then). Keys never sent yet execute
/// now. Returns each key's answer's `n`.
async fn settle_all(at: SocketAddr, keys: &Arc<Vec<String>>) -> HashMap<usize, u64> {
    let settlers: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let keys = keys.clone();
            tokio::spawn(async move {
                let mut settled = Vec::new();
                for i in (c..KEYS).step_by(CLIENTS) {
                    settled.push((i, settle(at, &keys[i], i).await));
                }
                settled
            })
        })
        .collect();
    let mut settled = HashMap::new();
    for settler in settlers {
        settled.extend(settler.await.unwrap());
    }
    settled
}

/// What no fault may cost: an attempt of a key run twice, an answer that is none of
/// the key's executions, or a later attempt started when `may_follow(when the attempt
/// before reached the upstream, when it started)` says it could not. Returns how many
/// later attempts had no attempt before them at the upstream (a fault between the
/// reserve and the forward; when that attempt was reserved is not known here).
fn check(
    up: &Upstream,
    keys: &[String],
    settled: &HashMap<usize, u64>,
    may_follow: impl Fn(Instant, Instant) -> bool,
) -> usize {
    for (i, key) in keys.iter().enumerate() {
        let runs = up.executions(key);
        let mut attempts: Vec<&str> = runs.iter().map(|e| e.attempt.as_str()).collect();
        attempts.sort_unstable();
        let before = attempts.len();
        attempts.dedup();
        assert_eq!(
            before,
            attempts.len(),
            "key {i}: an attempt ran twice: {runs:?}"
        );
        assert!(
            runs.iter().any(|e| e.n == settled[&i]),
            "key {i}: the answer (n = {}) is none of its executions {runs:?}",
            settled[&i]
        );
    }
    let mut arrived: HashMap<(String, u32), Vec<Instant>> = HashMap::new();
    for seen in up.seen() {
        let header = |name| seen.headers.get(name).and_then(|v| v.to_str().ok());
        let (Some(key), Some(attempt)) = (header("idempotency-key"), header("idempotency-attempt"))
        else {
            panic!("a request reached the upstream without a key or an attempt: {seen:?}");
        };
        let attempt: u32 = attempt.parse().unwrap();
        arrived
            .entry((key.to_owned(), attempt))
            .or_default()
            .push(seen.at);
    }
    let mut unsent = 0;
    for ((key, attempt), starts) in &arrived {
        if *attempt == 1 {
            continue;
        }
        let Some(before) = arrived.get(&(key.clone(), attempt - 1)) else {
            unsent += 1;
            continue;
        };
        for start in starts {
            assert!(
                before.iter().any(|b| may_follow(*b, *start)),
                "key {key}: attempt {attempt} started while attempt {} could still run",
                attempt - 1
            );
        }
    }
    unsent
}

/// Prints what the run exercised (with `--nocapture`).
fn report(faults: &str, up: &Upstream, keys: &[String], tally: &Tally, unsent: usize) {
    let (mut again, mut taken_over) = (0, 0);
    for key in keys {
        let runs = up.executions(key);
        again += usize::from(runs.len() > 1);
        taken_over += runs.iter().filter(|e| e.attempt != "1").count();
    }
    println!(
        "{faults}; requests: {tally:?}; executions as a later attempt (a fault left the \
         key in progress): {taken_over}; later attempts whose attempt before never \
         reached the upstream (a fault between reserve and forward): {unsent}; keys run \
         more than once (a fault hid the outcome): {again} of {KEYS}"
    );
}
