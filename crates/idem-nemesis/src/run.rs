//! A run: one world, one phase per nemesis. In a phase, every key is sent several times
//! at once over random gateways, each request retried until it has its final answer,
//! some clients hanging up before the answer, while the nemesis strikes on its
//! schedule; then the feed is read and the history checked.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use crate::checker::{Report, check};
use crate::client::{self, Send};
use crate::history::{History, Listed, Recorder};
use crate::nemesis::{Nemesis, inject, schedule};
use crate::rng::Rng;
use crate::stores::StoreKind;
use crate::world::{Unavailable, World};

/// How long a client waits for an answer before it gives up on the request.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest pause between a client's retries.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What a run does.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `idem` binary.
    pub binary: PathBuf,
    /// The store.
    pub store: StoreKind,
    /// The nemeses, one phase each, in order.
    pub nemeses: Vec<Nemesis>,
    /// The seed every schedule and client draws from.
    pub seed: u64,
    /// Keys per phase.
    pub keys: usize,
    /// Requests of each key sent at once (each retried until answered).
    pub copies: usize,
    /// Faults per phase.
    pub cycles: usize,
    /// Gateways (hosts).
    pub gateways: usize,
    /// The gateways' `--lease`.
    pub lease: Duration,
    /// Where the gateways' logs go.
    pub log_dir: PathBuf,
}

impl Config {
    /// The size `.ci/run` runs: 40 keys sent 3 times each over 2 gateways, one fault
    /// per nemesis, a 2 s lease.
    pub fn small(binary: PathBuf, store: StoreKind, seed: u64, log_dir: PathBuf) -> Config {
        Config {
            binary,
            store,
            nemeses: Nemesis::ALL.to_vec(),
            seed,
            keys: 40,
            copies: 3,
            cycles: 1,
            gateways: 2,
            lease: Duration::from_secs(2),
            log_dir,
        }
    }

    /// How long after the last fault healed every key must have its final answer: a
    /// lapsed lease, a client's request that timed out, its next retry, and a second
    /// of slack for a loaded machine.
    pub fn bound(&self) -> Duration {
        self.lease + CLIENT_TIMEOUT + MAX_BACKOFF + Duration::from_secs(1)
    }
}

/// One phase's outcome.
#[derive(Debug, Clone)]
pub struct Phase {
    /// The nemesis.
    pub nemesis: Nemesis,
    /// What the checker found.
    pub report: Report,
    /// What was recorded.
    pub history: History,
}

/// Runs every phase of `config` in one world; why not, when no world can be made
/// here. A phase whose nemesis could not be injected is an `Err` in its place.
pub async fn run(config: &Config) -> Result<Vec<Result<Phase, String>>, Unavailable> {
    let failovers = config
        .nemeses
        .iter()
        .filter(|n| **n == Nemesis::Failover)
        .count()
        * config.cycles;
    let args: Vec<String> = [
        "--lease".to_owned(),
        format!("{}ms", config.lease.as_millis()),
        "--upstream-timeout".to_owned(),
        "5s".to_owned(),
    ]
    .to_vec();
    std::fs::create_dir_all(&config.log_dir)
        .map_err(|e| Unavailable::Store(format!("{}: {e}", config.log_dir.display())))?;
    let world = World::create(
        config.store,
        failovers + 1,
        config.gateways,
        &config.binary,
        &args,
        &config.log_dir,
        config.seed,
    )
    .await?;
    let mut phases = Vec::new();
    for (i, &nemesis) in config.nemeses.iter().enumerate() {
        let seed = config.seed.wrapping_add(i as u64 * 0x1000_0000);
        let done = phase(&world, config, nemesis, seed).await;
        match &done {
            Ok(p) => eprintln!(
                "{} under {}: {}",
                config.store.name(),
                nemesis.name(),
                p.report
            ),
            Err(e) => eprintln!("{} under {}: {e}", config.store.name(), nemesis.name()),
        }
        phases.push(done);
    }
    Ok(phases)
}

/// One phase: load, faults, healing, the feed, the check.
async fn phase(
    world: &World,
    config: &Config,
    nemesis: Nemesis,
    seed: u64,
) -> Result<Phase, String> {
    let recorder = world.recorder().clone();
    let faults = schedule(nemesis, config.cycles, config.gateways, config.lease, seed);
    let load_for: Duration = faults.iter().map(|f| f.after + f.lasts).sum();
    let keys: Vec<String> = (0..config.keys)
        .map(|i| format!("{}-{seed:x}-{i}", nemesis.name()))
        .collect();
    let bound = config.bound();
    let (stop_at, stopping) = watch::channel(None::<Duration>);
    let addrs: Vec<SocketAddr> = (0..world.gateways()).map(|i| world.addr(i)).collect();
    let mut rng = Rng::new(seed ^ 0x5bd1_e995);
    let mut clients = Vec::new();
    let start = recorder.now();
    for (i, key) in keys.iter().enumerate() {
        // The keys' first requests spread over the faults, so that some meet them.
        let first = start + rng.between(Duration::ZERO, load_for);
        for _ in 0..config.copies {
            let at = first + rng.between(Duration::ZERO, Duration::from_millis(300));
            let client = Client {
                recorder: recorder.clone(),
                addrs: addrs.clone(),
                key: key.clone(),
                body: format!(r#"{{"amount":{i}}}"#),
                delay_ms: (i as u64 % 4) * 100,
                rng: Rng::new(rng.next()),
                stopping: stopping.clone(),
            };
            clients.push(tokio::spawn(client.run(at)));
        }
    }
    let strike = async {
        for fault in &faults {
            tokio::time::sleep(fault.after).await;
            inject(world, nemesis, *fault).await?;
        }
        let healed = recorder.now();
        stop_at.send_replace(Some(healed + bound + Duration::from_secs(1)));
        Ok::<Duration, String>(healed)
    };
    let healed = match strike.await {
        Ok(healed) => healed,
        Err(e) => {
            stop_at.send_replace(Some(Duration::ZERO));
            return Err(format!("{}: {e}", nemesis.name()));
        }
    };
    for c in clients {
        c.await.expect("a client does not panic");
    }
    // A request a fault held in a link may still reach the upstream late.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut history = recorder.history(&keys);
    history.healed = healed;
    history.bound = bound;
    history.listed = feed(world, &keys, &config.binary).await?;
    let report = check(&history);
    Ok(Phase {
        nemesis,
        report,
        history,
    })
}

/// One request of a key: sent, and sent again until it has its final answer or the
/// phase ends.
struct Client {
    recorder: Recorder,
    addrs: Vec<SocketAddr>,
    key: String,
    body: String,
    delay_ms: u64,
    rng: Rng,
    stopping: watch::Receiver<Option<Duration>>,
}

impl Client {
    async fn run(mut self, at: Duration) {
        tokio::time::sleep(at.saturating_sub(self.recorder.now())).await;
        let mut backoff = Duration::from_millis(100);
        loop {
            let gateway = self.rng.below(self.addrs.len() as u64) as usize;
            // One request in ten hangs up before its answer: a lost answer.
            let hang_up =
                (self.rng.below(10) == 0).then(|| Duration::from_millis(self.rng.below(150)));
            let outcome = client::send(
                &self.recorder,
                Send {
                    gateway,
                    addr: self.addrs[gateway],
                    key: &self.key,
                    body: &self.body,
                    delay_ms: self.delay_ms,
                    hang_up,
                    timeout: CLIENT_TIMEOUT,
                },
            )
            .await;
            if outcome.final_answer().is_some() {
                return;
            }
            if let Some(stop) = *self.stopping.borrow()
                && self.recorder.now() > stop
            {
                return;
            }
            let jitter = Duration::from_millis(self.rng.below(50));
            tokio::time::sleep(backoff + jitter).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// The ambiguous-outcome feed's records of `keys`, read page by page from the first
/// gateway whose admin listener answers, trying again for up to a minute while none
/// does (a store still recovering from the last fault); every failure is said on
/// standard error.
async fn feed(world: &World, keys: &[String], binary: &Path) -> Result<Vec<Listed>, String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match feed_once(world, keys).await {
            Ok(listed) => return Ok(listed),
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("reading the feed failed, trying again: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                // The same feed, read by a new process straight from the store: tells
                // a gateway whose store connection is stuck from a store that cannot
                // list.
                let listed = keys_list(binary, world.store_url(), keys).await;
                eprintln!(
                    "the gateways' feed failed ({e}); `idem keys list --ambiguous` from \
                     outside: {}",
                    match &listed {
                        Ok(l) => format!("{} records", l.len()),
                        Err(e) => e.clone(),
                    }
                );
                return listed.map_err(|l| format!("{e}; and idem keys list: {l}"));
            }
        }
    }
}

/// `idem keys list --ambiguous` on `store`, run from the root namespace: the records of
/// `keys` it lists.
async fn keys_list(binary: &Path, store: &str, keys: &[String]) -> Result<Vec<Listed>, String> {
    let mine: HashSet<&str> = keys.iter().map(String::as_str).collect();
    let mut cmd = tokio::process::Command::new(binary);
    cmd.args([
        "keys",
        "list",
        "--ambiguous",
        "--limit",
        "1000",
        "--store",
        store,
    ]);
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEM_") {
            cmd.env_remove(k);
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .map_err(|_| "idem keys list took over 60 s".to_owned())?
        .map_err(|e| format!("idem keys list: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "idem keys list: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    lines(&out.stdout, &mine)
}

/// The feed's JSON lines of `mine`.
fn lines(body: &[u8], mine: &HashSet<&str>) -> Result<Vec<Listed>, String> {
    let mut listed = Vec::new();
    for line in String::from_utf8_lossy(body).lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
        let key = v["key"].as_str().unwrap_or_default();
        if mine.contains(key) {
            listed.push(Listed {
                key: key.to_owned(),
                reason: v["ambiguous"].as_str().unwrap_or_default().to_owned(),
                attempt: v["attempt"].as_u64().unwrap_or(0) as u32,
            });
        }
    }
    Ok(listed)
}

async fn feed_once(world: &World, keys: &[String]) -> Result<Vec<Listed>, String> {
    let mine: HashSet<&str> = keys.iter().map(String::as_str).collect();
    let mut errors = Vec::new();
    for g in 0..world.gateways() {
        let mut listed = Vec::new();
        let mut after: Option<String> = None;
        let complete = loop {
            let path = match &after {
                Some(c) => format!("/keys?ambiguous=true&limit=1000&after={c}"),
                None => "/keys?ambiguous=true&limit=1000".to_owned(),
            };
            let (headers, body) =
                match client::get(world.admin(g), &path, Duration::from_secs(30)).await {
                    Some((200, headers, body)) => (headers, body),
                    Some((status, _, body)) => {
                        let body = String::from_utf8_lossy(&body).into_owned();
                        errors.push(format!("gateway {g}: {status} {body}"));
                        break false;
                    }
                    None => {
                        errors.push(format!("gateway {g}: no answer in 30 s"));
                        break false;
                    }
                };
            listed.extend(lines(&body, &mine)?);
            match headers.iter().find(|(n, _)| n == "idem-next-cursor") {
                Some((_, c)) => after = Some(c.clone()),
                None => break true,
            }
        };
        if complete {
            return Ok(listed);
        }
    }
    Err(format!("the feed could not be read: {errors:?}"))
}
