//! `idem demo`: what the gateway prevents, in numbers.
//!
//! The command starts two child processes of its own binary on 127.0.0.1 ports the
//! system picks: the naive demo payments API ([`crate::demo`], `idem demo-upstream`)
//! and an `idem serve` in front of it, on a SQLite file in a temporary directory (or
//! `--store`). A client then makes the same `--operations` payments twice: straight to
//! the API ("without idem": no key, a naive client that resends), and through the
//! gateway ("with idem": one `Idempotency-Key` per operation, kept across its retries).
//! Both meet the same faults, on a fixed schedule ([`fault_of`]):
//!
//! - **answer lost**: the client drops the connection as the answer arrives, unread;
//! - **client timeout**: the API answers slowly (`?delay_ms=`) and the client gives up
//!   before it does, then retries with a longer timeout;
//! - **duplicated send**: the operation is sent twice at once;
//! - **gateway killed**: halfway, once nothing is in flight, an answer is lost, the
//!   gateway is killed with SIGKILL and restarted on the same store and address, and
//!   the operation is retried (straight to the API, it is a lost answer and a resend).
//!
//! Every attempt is retried until it gets an answer (409 while a key is in progress, a
//! 5xx or no answer are retried, with a short backoff). Each payment carries its
//! operation in its `metadata`, so the charges the API lists at the end
//! (`GET /v1/charges`) are attributed: charges made, operations charged more than once,
//! operations never charged, for each side, next to the answers the client got.
//!
//! The children are killed and reaped and the directory removed at the end, unless
//! `--keep`: then both are left running and their addresses, process ids and the way to
//! stop them are printed.

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// `idem demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Payments made on each side, without and with idem.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 200,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub operations: u32,

    /// The gateway's record store URL, as `idem serve --store` takes it [default: a
    /// SQLite file in the demo's temporary directory]. A store that does not outlive the
    /// gateway (memory://) shows what the restart then costs.
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,

    /// Leave the demo API and the gateway running at the end, to explore with curl, and
    /// print how to stop them.
    #[arg(long)]
    pub keep: bool,

    /// Report format: a table, or one JSON object for scripts.
    #[arg(long, value_enum, default_value = "text")]
    pub format: DemoFormat,
}

/// How `idem demo` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoFormat {
    /// A side-by-side table.
    Text,
    /// One JSON object.
    Json,
}

/// What goes wrong with one operation (the same on both sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: one attempt, one answer.
    None,
    /// The client drops the connection as the answer arrives, unread, and retries.
    AnswerLost,
    /// The answer is slow; the client times out first, and retries.
    ClientTimeout,
    /// The operation is sent twice at once.
    DuplicateSend,
    /// The answer is lost, the gateway is killed with SIGKILL and restarted on its
    /// store, and the client retries.
    GatewayKill,
}

/// The fault of operation `op` (from 0) out of `operations`: the gateway kill at the
/// middle one, and in every ten operations one answer lost (the 4th), one client
/// timeout (the 7th) and one duplicated send (the 9th). Fixed, so that every run shows
/// the same faults.
pub fn fault_of(op: u32, operations: u32) -> Fault {
    if op == operations / 2 {
        return Fault::GatewayKill;
    }
    match op % 10 {
        3 => Fault::AnswerLost,
        6 => Fault::ClientTimeout,
        8 => Fault::DuplicateSend,
        _ => Fault::None,
    }
}

/// How long the API thinks on a client-timeout operation.
const SLOW_ANSWER: Duration = Duration::from_millis(300);
/// The client's first, too short, timeout on such an operation.
const SHORT_TIMEOUT: Duration = Duration::from_millis(100);
/// The client's timeout otherwise.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long one operation may take, retries included, before the demo gives up.
const OPERATION_DEADLINE: Duration = Duration::from_secs(30);
/// Operations in flight at once on each side.
const CONCURRENCY: usize = 8;
/// How long a child may take to print its address.
const START_DEADLINE: Duration = Duration::from_secs(30);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What the client saw on one side.
#[derive(Debug, Default)]
struct Tally {
    answers: AtomicU64,
    replays: AtomicU64,
    conflicts: AtomicU64,
    unanswered: AtomicU64,
    answered: AtomicU64,
}

/// One side of the demo: straight to the API, or through the gateway.
struct Side {
    name: &'static str,
    url: String,
    keyed: bool,
    tally: Tally,
}

/// How an attempt treats its answer.
#[derive(Clone, Copy)]
enum Read {
    /// Read it whole within the timeout.
    Within(Duration),
    /// Drop the connection as soon as the answer's head arrives.
    HangUp,
}

/// The demo's children and directory, stopped and removed on drop unless kept.
struct Children {
    dir: PathBuf,
    exe: PathBuf,
    api: Option<Child>,
    gateway: Option<Child>,
    restarts: u32,
    keep: bool,
}

impl Children {
    fn stop(child: &mut Option<Child>) {
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The end of a log file, for an error message.
    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Starts `exe ARGS…` with its output in `NAME.out` and `NAME.log`, and waits for the
    /// line starting with `prefix`, whose rest is the address it listens on.
    async fn spawn(
        &self,
        name: &str,
        args: &[&str],
        prefix: &str,
    ) -> Result<(Child, std::net::SocketAddr), String> {
        let out_path = self.dir.join(format!("{name}.out"));
        let out = std::fs::File::create(&out_path).map_err(|e| format!("{name}.out: {e}"))?;
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))
            .map_err(|e| format!("{name}.log: {e}"))?;
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log);
        // The demo's own settings only: none of the caller's IDEM_* ones.
        for (k, _) in std::env::vars_os() {
            if k.to_str()
                .is_some_and(|k| k.starts_with("IDEM_") && k != "IDEM_LOG")
            {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.exe.display()))?;
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            if let Some(addr) = text
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|a| a.trim().parse().ok())
            {
                return Ok((child, addr));
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{name} did not start ({}):\n{}",
                    exited.map_or("no address in time".to_owned(), |s| s.to_string()),
                    self.log_tail(&format!("{name}.log"))
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn start_gateway(
        &mut self,
        api: &str,
        listen: &str,
        store: &str,
    ) -> Result<std::net::SocketAddr, String> {
        let name = if self.restarts == 0 {
            "gateway".to_owned()
        } else {
            format!("gateway-{}", self.restarts + 1)
        };
        self.restarts += 1;
        let (child, addr) = self
            .spawn(
                &name,
                &[
                    "serve",
                    "--upstream",
                    api,
                    "--listen",
                    listen,
                    "--store",
                    store,
                ],
                "idem listening on http://",
            )
            .await?;
        self.gateway = Some(child);
        Ok(addr)
    }

    /// `kill -9` the gateway, and reap it.
    fn kill_gateway(&mut self) {
        Children::stop(&mut self.gateway);
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        Children::stop(&mut self.gateway);
        Children::stop(&mut self.api);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `idem demo`; exit 0 when it showed what it claims (see the crate README).
pub async fn run(args: DemoArgs) -> ExitCode {
    match demo(&args).await {
        Ok(report) => {
            match args.format {
                DemoFormat::Json => println!("{}", report.json),
                DemoFormat::Text => print!("{}", report.text),
            }
            match report.failure {
                None => ExitCode::SUCCESS,
                Some(why) => {
                    eprintln!("idem demo: {why}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("idem demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a run printed, and why it failed if it did.
struct Report {
    json: Value,
    text: String,
    failure: Option<String>,
}

/// The charges of one side, attributed: how many each operation got.
#[derive(Debug)]
struct Charged {
    per_operation: Vec<u64>,
}

impl Charged {
    fn charges(&self) -> u64 {
        self.per_operation.iter().sum()
    }
    fn double(&self) -> u64 {
        self.per_operation.iter().filter(|&&n| n > 1).count() as u64
    }
    fn uncharged(&self) -> u64 {
        self.per_operation.iter().filter(|&&n| n == 0).count() as u64
    }
}

async fn demo(args: &DemoArgs) -> Result<Report, String> {
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    // A run's keys and tags are its own, on a store or an API that outlives it.
    let run = format!("{:x}{:x}", std::process::id(), stamp % 0xffff_ffff);
    let dir = std::env::temp_dir().join(format!("idem-demo-{run}"));
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut children = Children {
        dir: dir.clone(),
        exe,
        api: None,
        gateway: None,
        restarts: 0,
        keep: false,
    };
    let store = args
        .store
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.join("idem.db").display()));

    let (api, api_addr) = children
        .spawn(
            "api",
            &["demo-upstream", "--listen", "127.0.0.1:0"],
            "demo upstream (no idempotency of its own) on http://",
        )
        .await?;
    children.api = Some(api);
    let api_url = format!("http://{api_addr}");
    let gateway_addr = children
        .start_gateway(&api_url, "127.0.0.1:0", &store)
        .await?;
    let gateway_url = format!("http://{gateway_addr}");

    let without = Side {
        name: "without",
        url: api_url.clone(),
        keyed: false,
        tally: Tally::default(),
    };
    let with = Side {
        name: "with",
        url: gateway_url.clone(),
        keyed: true,
        tally: Tally::default(),
    };
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let n = args.operations;
    let mid = n / 2;

    // Up to the kill, then the kill with nothing else in flight, then the rest.
    let (a, b) = tokio::join!(
        operations(&client, &without, &run, 0..mid, n),
        operations(&client, &with, &run, 0..mid, n)
    );
    a?;
    b?;
    for side in [&without, &with] {
        attempt(&client, side, &run, mid, None, Read::HangUp).await;
    }
    children.kill_gateway();
    let restarted = children
        .start_gateway(&api_url, &gateway_addr.to_string(), &store)
        .await?;
    if restarted != gateway_addr {
        return Err(format!(
            "the gateway came back on {restarted}, not {gateway_addr}"
        ));
    }
    let (a, b) = tokio::join!(
        retry(&client, &without, &run, mid, None),
        retry(&client, &with, &run, mid, None)
    );
    a?;
    b?;
    for side in [&without, &with] {
        side.tally.answered.fetch_add(1, Ordering::Relaxed);
    }
    let (a, b) = tokio::join!(
        operations(&client, &without, &run, mid + 1..n, n),
        operations(&client, &with, &run, mid + 1..n, n)
    );
    a?;
    b?;

    let charges = list_charges(&client, &api_url).await?;
    let charged_without = attribute(&charges, &run, "without", n);
    let charged_with = attribute(&charges, &run, "with", n);
    let seconds = started.elapsed().as_secs_f64();

    children.keep = args.keep;
    let pid = |c: &Option<Child>| c.as_ref().map(Child::id);
    let faults = (0..n).fold([0u64; 4], |mut f, op| {
        match fault_of(op, n) {
            Fault::AnswerLost => f[0] += 1,
            Fault::ClientTimeout => f[1] += 1,
            Fault::DuplicateSend => f[2] += 1,
            Fault::GatewayKill => f[3] += 1,
            Fault::None => {}
        }
        f
    });
    let side_json = |side: &Side, charged: &Charged| {
        let t = &side.tally;
        json!({
            "charges": charged.charges(),
            "double_charged": charged.double(),
            "uncharged": charged.uncharged(),
            "answered": t.answered.load(Ordering::Relaxed),
            "answers": t.answers.load(Ordering::Relaxed),
            "replays": t.replays.load(Ordering::Relaxed),
            "conflicts": t.conflicts.load(Ordering::Relaxed),
            "unanswered_attempts": t.unanswered.load(Ordering::Relaxed),
        })
    };
    let json = json!({
        "operations": n,
        "faults": {
            // The kill's operation loses its answer too.
            "answers_lost": faults[0] + faults[3],
            "client_timeouts": faults[1],
            "duplicated_sends": faults[2],
            "gateway_kills": faults[3],
        },
        "without_idem": side_json(&without, &charged_without),
        "with_idem": side_json(&with, &charged_with),
        "store": crate::store::redact(&store),
        "seconds": (seconds * 10.0).round() / 10.0,
        "api": { "url": api_url, "pid": pid(&children.api) },
        "gateway": { "url": gateway_url, "pid": pid(&children.gateway) },
        "dir": dir.display().to_string(),
        "kept": args.keep,
    });

    let mut failure = Vec::new();
    if charged_with.double() > 0 {
        failure.push(format!(
            "with idem, operations charged more than once: {} (does the store {} outlive a restart?)",
            charged_with.double(),
            crate::store::redact(&store)
        ));
    }
    for (side, charged) in [(&without, &charged_without), (&with, &charged_with)] {
        if charged.uncharged() > 0 {
            failure.push(format!(
                "{} idem, operations answered but never charged: {}",
                side.name,
                charged.uncharged()
            ));
        }
    }
    if charged_without.double() == 0 {
        failure
            .push("without idem, no operation was charged twice: the faults did not land".into());
    }

    let text = text_report(&json, args.keep, &children);
    Ok(Report {
        json,
        text,
        failure: (!failure.is_empty()).then(|| failure.join("; ")),
    })
}

/// Runs the operations `ops` on one side, [`CONCURRENCY`] at a time.
async fn operations(
    client: &HttpClient,
    side: &Side,
    run: &str,
    ops: std::ops::Range<u32>,
    n: u32,
) -> Result<(), String> {
    let mut done = futures_util::stream::iter(ops)
        .map(|op| operation(client, side, run, op, fault_of(op, n)))
        .buffer_unordered(CONCURRENCY);
    while let Some(result) = done.next().await {
        result?;
    }
    Ok(())
}

/// One operation with its fault, retried until answered.
async fn operation(
    client: &HttpClient,
    side: &Side,
    run: &str,
    op: u32,
    fault: Fault,
) -> Result<(), String> {
    let slow = (fault == Fault::ClientTimeout).then_some(SLOW_ANSWER);
    match fault {
        Fault::AnswerLost => {
            attempt(client, side, run, op, None, Read::HangUp).await;
        }
        Fault::ClientTimeout => {
            attempt(client, side, run, op, slow, Read::Within(SHORT_TIMEOUT)).await;
        }
        Fault::DuplicateSend => {
            let (a, b) = tokio::join!(
                retry(client, side, run, op, None),
                retry(client, side, run, op, None)
            );
            a?;
            b?;
            side.tally.answered.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        Fault::None | Fault::GatewayKill => {}
    }
    retry(client, side, run, op, slow).await?;
    side.tally.answered.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Sends operation `op` until it is answered 201; a 409, a 429, a 5xx or no answer are
/// retried after a short backoff, anything else is an error.
async fn retry(
    client: &HttpClient,
    side: &Side,
    run: &str,
    op: u32,
    slow: Option<Duration>,
) -> Result<(), String> {
    let deadline = Instant::now() + OPERATION_DEADLINE;
    let mut pause = Duration::from_millis(20);
    loop {
        match attempt(client, side, run, op, slow, Read::Within(TIMEOUT)).await {
            Some(201) => return Ok(()),
            Some(s) if !(s == 409 || s == 429 || s >= 500) => {
                return Err(format!(
                    "operation {op} {} idem was answered {s}",
                    side.name
                ));
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!(
                "operation {op} {} idem got no 201 within {}s",
                side.name,
                OPERATION_DEADLINE.as_secs()
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// One attempt at operation `op`: its status when the client read the answer.
async fn attempt(
    client: &HttpClient,
    side: &Side,
    run: &str,
    op: u32,
    slow: Option<Duration>,
    read: Read,
) -> Option<u16> {
    let t = &side.tally;
    let request = payment(side, run, op, slow);
    match read {
        Read::HangUp => {
            // The answer's head has arrived: the work is done (and recorded, behind the
            // gateway); the client drops it and its connection unread.
            let _ = tokio::time::timeout(TIMEOUT, client.request(request)).await;
            t.unanswered.fetch_add(1, Ordering::Relaxed);
            None
        }
        Read::Within(limit) => {
            let exchange = async {
                let res = client.request(request).await.ok()?;
                let status = res.status().as_u16();
                let replayed = res
                    .headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true");
                res.into_body().collect().await.ok()?;
                Some((status, replayed))
            };
            match tokio::time::timeout(limit, exchange).await {
                Ok(Some((status, replayed))) => {
                    t.answers.fetch_add(1, Ordering::Relaxed);
                    if replayed {
                        t.replays.fetch_add(1, Ordering::Relaxed);
                    }
                    if status == 409 {
                        t.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(status)
                }
                _ => {
                    t.unanswered.fetch_add(1, Ordering::Relaxed);
                    None
                }
            }
        }
    }
}

/// The request of operation `op`, the same on every attempt: its key (with idem), its
/// body tagged with the run, side and operation, and on a slow one `?delay_ms=`.
fn payment(side: &Side, run: &str, op: u32, slow: Option<Duration>) -> http::Request<Full<Bytes>> {
    let uri = match slow {
        Some(d) => format!("{}/v1/charges?delay_ms={}", side.url, d.as_millis()),
        None => format!("{}/v1/charges", side.url),
    };
    let body = json!({
        "amount": 100 + op % 900,
        "currency": "eur",
        "metadata": { "demo": run, "side": side.name, "operation": op },
    });
    let mut request = http::Request::post(uri).header("content-type", "application/json");
    if side.keyed {
        request = request.header("idempotency-key", format!("demo-{run}-{op}"));
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request")
}

/// The API's charges (`GET /v1/charges`).
async fn list_charges(client: &HttpClient, api: &str) -> Result<Value, String> {
    let request = http::Request::get(format!("{api}/v1/charges"))
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let res = tokio::time::timeout(TIMEOUT, client.request(request))
        .await
        .map_err(|_| "the demo API did not list its charges in time".to_owned())?
        .map_err(|e| format!("listing the charges: {e}"))?;
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("listing the charges: {e}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("the charges are not JSON: {e}"))
}

/// How many charges of `charges` each operation of `side` in `run` got.
fn attribute(charges: &Value, run: &str, side: &str, n: u32) -> Charged {
    let mut per_operation = vec![0u64; n as usize];
    let list = charges["charges"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for c in list {
        let m = &c["metadata"];
        if m["demo"] == run
            && m["side"] == side
            && let Some(slot) = m["operation"]
                .as_u64()
                .and_then(|op| per_operation.get_mut(op as usize))
        {
            *slot += 1;
        }
    }
    Charged { per_operation }
}

/// `1234567` as `1 234 567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// The side-by-side table, the summary line and, with `--keep`, what was left running.
fn text_report(r: &Value, keep: bool, children: &Children) -> String {
    let n = r["operations"].as_u64().unwrap_or_default();
    let f = &r["faults"];
    let num = |v: &Value| grouped(v.as_u64().unwrap_or_default());
    let mut out = format!(
        "idem demo: {} payments to the demo payments API, straight and through idem serve ({})\n\
         faults on both: {} answers lost, {} client timeouts, {} duplicated sends, \
         the gateway killed (kill -9) and restarted halfway\n\n",
        grouped(n),
        r["store"].as_str().unwrap_or_default(),
        num(&f["answers_lost"]),
        num(&f["client_timeouts"]),
        num(&f["duplicated_sends"]),
    );
    let (wo, wi) = (&r["without_idem"], &r["with_idem"]);
    out.push_str(&format!(
        "{:<32}{:>14}{:>12}\n",
        "", "without idem", "with idem"
    ));
    for (label, field) in [
        ("operations answered", "answered"),
        ("charges made", "charges"),
        ("operations charged twice+", "double_charged"),
        ("operations not charged", "uncharged"),
        ("answers the client got", "answers"),
        ("  of them replays", "replays"),
        ("  of them 409 (in progress)", "conflicts"),
        ("attempts left without answer", "unanswered_attempts"),
    ] {
        out.push_str(&format!(
            "{label:<32}{:>14}{:>12}\n",
            num(&wo[field]),
            num(&wi[field])
        ));
    }
    out.push_str(&format!(
        "\n{} operations: {} charges without idem, {} with idem, {} double ({}s)\n",
        grouped(n),
        num(&wo["charges"]),
        num(&wi["charges"]),
        num(&wi["double_charged"]),
        r["seconds"]
    ));
    if keep {
        let api = r["api"]["url"].as_str().unwrap_or_default();
        let gateway = r["gateway"]["url"].as_str().unwrap_or_default();
        let pids: Vec<String> = [&children.api, &children.gateway]
            .into_iter()
            .flatten()
            .map(|c| c.id().to_string())
            .collect();
        out.push_str(&format!(
            "\nLeft running (--keep):\n  demo API       {api}  (pid {})\n  idem gateway   {gateway}  (pid {}, store {})\n  files and logs {}\n\
             Try: curl -s {api}/v1/charges\n     curl -si {gateway}/v1/charges -H 'Idempotency-Key: k1' -H 'Content-Type: application/json' -d '{{\"amount\":1200,\"currency\":\"eur\"}}'\n\
             Stop them with: kill {} && rm -r {}\n",
            pids.first().map_or("?", |p| p.as_str()),
            pids.get(1).map_or("?", |p| p.as_str()),
            r["store"].as_str().unwrap_or_default(),
            children.dir.display(),
            pids.join(" "),
            children.dir.display(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fault_schedule_is_fixed_and_has_every_fault() {
        let n = 200;
        let count = |f: Fault| (0..n).filter(|&op| fault_of(op, n) == f).count();
        assert_eq!(count(Fault::GatewayKill), 1);
        assert_eq!(fault_of(100, n), Fault::GatewayKill);
        assert_eq!(count(Fault::AnswerLost), 20);
        assert_eq!(count(Fault::ClientTimeout), 20);
        assert_eq!(count(Fault::DuplicateSend), 20);
        // However few the operations, the kill (a lost answer without idem) is there.
        assert_eq!(fault_of(0, 1), Fault::GatewayKill);
    }

    #[test]
    fn charges_are_attributed_to_their_run_side_and_operation() {
        let charges = json!({ "charges": [
            { "id": "ch_1", "metadata": { "demo": "r1", "side": "with", "operation": 0 } },
            { "id": "ch_2", "metadata": { "demo": "r1", "side": "without", "operation": 0 } },
            { "id": "ch_3", "metadata": { "demo": "r1", "side": "without", "operation": 0 } },
            { "id": "ch_4", "metadata": { "demo": "r0", "side": "with", "operation": 1 } },
            { "id": "ch_5" },
        ]});
        let with = attribute(&charges, "r1", "with", 2);
        assert_eq!(with.per_operation, [1, 0]);
        assert_eq!((with.charges(), with.double(), with.uncharged()), (1, 0, 1));
        let without = attribute(&charges, "r1", "without", 2);
        assert_eq!((without.charges(), without.double()), (2, 1));
    }

    #[test]
    fn figures_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1 000");
        assert_eq!(grouped(1_234_567), "1 234 567");
    }
}
