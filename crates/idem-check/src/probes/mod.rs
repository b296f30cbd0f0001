//! The probes: what each one sends and how it judges the answers.

use std::time::Instant;

use serde::Serialize;

use super::client::{Exchange, Session, Stop};
use super::profile::Profile;

mod execution;
mod mcp;
pub(crate) mod probe;
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
    /// `payload_mismatch`, `keys`, `equivalent_json`, `tenants`, `replayed_headers`;
    /// under `--profile mcp` also `mcp_replay_id` and `mcp_envelope`.
    pub id: &'static str,
    /// A human name.
    pub name: &'static str,
    /// What it tests, in one line.
    pub tests: &'static str,
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
    /// A request the API should have answered from its record executed again.
    pub executed_again: bool,
}

/// The probes every profile runs, in the order they run: `(id, name)`.
pub const PROBES: &[(&str, &str)] = &[
    ("replay", "Replay"),
    ("concurrent_duplicates", "Concurrent duplicates"),
    ("lost_answer", "Lost answer"),
    ("payload_mismatch", "Payload mismatch"),
    ("keys", "Keys"),
    // The id stays `equivalent_json` (the JSON report's ids are stable); the probe
    // covers form bodies too.
    ("equivalent_json", "Equivalent body"),
    ("tenants", "Tenants"),
    ("replayed_headers", "Replayed headers"),
];

/// The probes only `--profile mcp` runs, after [`PROBES`]: `(id, name)`.
pub const MCP_PROBES: &[(&str, &str)] = &[
    ("mcp_replay_id", "Replay id (MCP)"),
    ("mcp_envelope", "Envelope (MCP)"),
];

/// The probes a run under `profile` makes, in the order they run: [`PROBES`], and under
/// `mcp` the [`MCP_PROBES`] after them.
pub fn probes_for(profile: Profile) -> Vec<(&'static str, &'static str)> {
    let mut all = PROBES.to_vec();
    if profile == Profile::Mcp {
        all.extend_from_slice(MCP_PROBES);
    }
    all
}

/// What the probe `id` tests, in one line.
pub fn describe(id: &str) -> &'static str {
    match id {
        "replay" => "the same request with the same key is answered from the record",
        "concurrent_duplicates" => {
            "parallel requests with one key, in flight together, make one execution"
        }
        "lost_answer" => "a retry after an answer lost on the way gets the execution that happened",
        "payload_mismatch" => "the same key with another payload is refused",
        "keys" => "malformed keys are refused; quoted and bare spellings are one key",
        "equivalent_json" => {
            "the same body in other bytes (JSON keys or form parameters reordered) is the \
             same request"
        }
        "tenants" => "the same key under another tenant never gets this tenant's answer",
        "replayed_headers" => "a replay carries no recorded Set-Cookie or Date",
        "mcp_replay_id" => {
            "a tool call's replay answers with the retry's own JSON-RPC id (JSON or event \
             stream)"
        }
        "mcp_envelope" => {
            "a new id and progressToken are the same call; changed arguments are refused"
        }
        _ => "",
    }
}

/// What the probes are told beyond the target.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Parallel requests of the concurrency probe.
    pub concurrency: u32,
    /// Whether the route requires a key (`--require-key`).
    pub require_key: bool,
    /// The dialect the API's refusals are judged by.
    pub profile: Profile,
    /// Whether a replay holds, as far as the probes run so far know: `false` once the
    /// replay probe saw the retry execute again, so that the probes which presuppose
    /// replay do not judge.
    pub replay_holds: bool,
}

/// Runs the probe `id` against the session.
pub async fn run(id: &'static str, name: &'static str, s: &Session, opts: Options) -> ProbeReport {
    let started = Instant::now();
    let mut p = Probe::new(s, opts);
    let result = match id {
        "replay" => replay(&mut p).await,
        "concurrent_duplicates" => concurrent_duplicates(&mut p).await,
        "lost_answer" => lost_answer(&mut p).await,
        "payload_mismatch" => payload_mismatch(&mut p).await,
        "keys" => keys(&mut p).await,
        "equivalent_json" => equivalent_json(&mut p).await,
        "tenants" => tenants(&mut p).await,
        "replayed_headers" => replayed_headers(&mut p).await,
        "mcp_replay_id" => mcp::replay_id(&mut p).await,
        "mcp_envelope" => mcp::envelope(&mut p).await,
        other => Err(Stop(format!("no probe named {other}"))),
    };
    p.finish(id, name, result.err(), started)
}
