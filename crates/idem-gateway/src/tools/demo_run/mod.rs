//! `idem demo`: what the gateway prevents, in numbers.
//!
//! The command starts two child processes of its own binary on 127.0.0.1 ports the
//! system picks: the naive demo payments API ([`super::demo`], `idem demo-upstream`)
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

use std::process::{Child, ExitCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

mod children;
mod client;
mod report;

use children::Children;
use client::{attempt, list_charges, operations, retry};
use report::{Charged, attribute, text_report};

/// `idem demo`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DemoArgs {
    /// Payments made on each side, without and with idem.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 200,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub(crate) operations: u32,

    /// The gateway's record store URL, as `idem serve --store` takes it [default: a
    /// SQLite file in the demo's temporary directory]. A store that does not outlive the
    /// gateway (memory://) shows what the restart then costs.
    #[arg(long, value_name = "URL")]
    pub(crate) store: Option<String>,

    /// Leave the demo API and the gateway running at the end, to explore with curl, and
    /// print how to stop them.
    #[arg(long)]
    pub(crate) keep: bool,

    /// Report format: a table, or one JSON object for scripts.
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) format: DemoFormat,
}

/// How `idem demo` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DemoFormat {
    /// A side-by-side table.
    Text,
    /// One JSON object.
    Json,
}

/// What goes wrong with one operation (the same on both sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
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
pub(crate) fn fault_of(op: u32, operations: u32) -> Fault {
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

/// Runs `idem demo`; exit 0 when it showed what it claims (see the crate README).
pub(crate) async fn run(args: DemoArgs) -> ExitCode {
    if let Some(Err(e)) = args.store.as_deref().map(crate::store::check_scheme) {
        eprintln!("idem demo: --store: {e}");
        return ExitCode::from(crate::exit::CONFIG);
    }
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

#[cfg(test)]
mod tests {
    use super::report::grouped;
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
