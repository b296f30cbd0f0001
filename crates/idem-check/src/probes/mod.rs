//! The probes: what each one sends and how it judges the answers.

use std::time::Instant;

use serde::Serialize;

use super::client::{Exchange, Session, Stop};

mod execution;
mod probe;
mod requests;

use execution::{concurrent_duplicates, lost_answer, payload_mismatch, replay};
use probe::Probe;
use requests::{equivalent_json, keys, replayed_headers, tenants};

/// A probe's or a check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The API behaved as the contract says.
    Pass,
    /// It did not (or the probe could not finish: the summary says why).
    Fail,
    /// The probe or check does not apply to this run (the summary says what would make it).
    NotApplicable,
}

impl Status {
    /// `pass`, `fail` or `not applicable`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::NotApplicable => "not applicable",
        }
    }
}

/// One thing a probe verified.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was verified.
    pub name: String,
    /// The verdict.
    pub status: Status,
    /// What was seen.
    pub detail: String,
}

/// A probe's result: its verdict, the checks behind it and the evidence.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// A stable identifier: `replay`, `concurrent_duplicates`, `lost_answer`,
    /// `payload_mismatch`, `keys`, `equivalent_json`, `tenants`, `replayed_headers`.
    pub id: &'static str,
    /// A human name.
    pub name: &'static str,
    /// The verdict: fail if any check failed, pass if any passed, else not applicable.
    pub status: Status,
    /// One line: the first failed check's detail, or what passed.
    pub summary: String,
    /// The checks, in the order they were made.
    pub checks: Vec<Check>,
    /// The requests and answers, credentials redacted.
    pub exchanges: Vec<Exchange>,
    /// How long the probe took, in milliseconds.
    pub duration_ms: u64,
}

/// The probes, in the order they run: `(id, name)`.
pub const PROBES: &[(&str, &str)] = &[
    ("replay", "Replay"),
    ("concurrent_duplicates", "Concurrent duplicates"),
    ("lost_answer", "Lost answer"),
    ("payload_mismatch", "Payload mismatch"),
    ("keys", "Keys"),
    ("equivalent_json", "Equivalent JSON"),
    ("tenants", "Tenants"),
    ("replayed_headers", "Replayed headers"),
];

/// What the probes are told beyond the target.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Parallel requests of the concurrency probe.
    pub concurrency: u32,
    /// Whether the route requires a key (`--require-key`).
    pub require_key: bool,
}

/// Runs the probe `id` against the session.
pub async fn run(id: &'static str, name: &'static str, s: &Session, opts: Options) -> ProbeReport {
    let started = Instant::now();
    let mut p = Probe::new(s);
    let result = match id {
        "replay" => replay(&mut p).await,
        "concurrent_duplicates" => concurrent_duplicates(&mut p, opts.concurrency).await,
        "lost_answer" => lost_answer(&mut p).await,
        "payload_mismatch" => payload_mismatch(&mut p).await,
        "keys" => keys(&mut p, opts.require_key).await,
        "equivalent_json" => equivalent_json(&mut p).await,
        "tenants" => tenants(&mut p).await,
        "replayed_headers" => replayed_headers(&mut p).await,
        other => Err(Stop(format!("no probe named {other}"))),
    };
    p.finish(id, name, result.err(), started)
}
