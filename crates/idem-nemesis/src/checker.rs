//! The checker: judges a [`History`] by what the gateway promises.
//!
//! - **No silent double execution.** A key executed more than once is allowed only
//!   where the gateway knew the outcome was ambiguous: the feed lists the key with a
//!   reason, and every execution after the first carried an `Idempotency-Attempt`
//!   above 1, no two the same. Anything else is a silent double.
//! - **Answers never change.** Every 2xx or recorded (replayed) answer any client got
//!   for a key is byte-identical (status and body) to the first. Where a listed double
//!   let each execution answer its own client (a paused attempt that finished after
//!   it was taken over), the change is counted as listed; otherwise, or when an answer
//!   is none of the key's executions, as silent.
//! - **Nothing acknowledged is lost.** No execution of a key starts after a client
//!   received the key's answer. Where one does as a listed double (the answer the
//!   client got could not be recorded before the lease lapsed), it is counted as
//!   listed; otherwise as silent.
//! - **Progress.** Every key has its final answer by `healed + bound`.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use bytes::Bytes;

use crate::history::{Execution, History};

/// A kind of violation the checker finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Violation {
    /// A key executed more than once without the feed listing it, or with a later
    /// execution that did not carry a new attempt number.
    SilentDouble,
    /// Clients got different answers for a key, or an answer that is none of its
    /// executions, with no listed double to explain it.
    ChangedAnswer,
    /// A key executed again after a client had received its answer.
    Lost,
    /// A key without a final answer by the bound after the faults healed.
    Unfinished,
}

/// One violation, on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What was violated.
    pub violation: Violation,
    /// The key.
    pub key: String,
    /// What the history shows, for a person to read.
    pub detail: String,
}

/// What the checker found in one history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Keys.
    pub keys: usize,
    /// Requests the clients sent.
    pub operations: usize,
    /// Executions the upstream saw.
    pub executions: usize,
    /// Keys executed more than once that the feed lists, each later execution a new
    /// attempt: the outcome was ambiguous and the gateway said so.
    pub doubles_listed: usize,
    /// Keys executed more than once that are not (a violation).
    pub doubles_silent: usize,
    /// Keys whose clients got the answers of two listed executions.
    pub changed_listed: usize,
    /// Keys whose clients got answers that differ without a listed double, or an
    /// answer that is none of the key's executions (a violation).
    pub changed_silent: usize,
    /// Keys executed again after a client received their answer, as a listed double
    /// (the answer could not be recorded before the lease lapsed, and the gateway said
    /// so).
    pub lost_listed: usize,
    /// Keys executed again after a client received their answer, silently (a
    /// violation).
    pub lost: usize,
    /// Keys without a final answer in time (a violation).
    pub unfinished: usize,
    /// Every violation, key by key.
    pub findings: Vec<Finding>,
}

impl Report {
    /// Whether the history shows no violation at all.
    pub fn clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// How many findings of `violation` there are.
    pub fn count(&self, violation: Violation) -> usize {
        self.findings
            .iter()
            .filter(|f| f.violation == violation)
            .count()
    }

    /// The header of [`row`](Self::row)'s table, in Markdown.
    pub const TABLE_HEAD: &str = "| store | nemesis | keys | operations | executions | doubles listed / silent | answers changed listed / silent | lost listed / silent | unfinished |\n|---|---|---:|---:|---:|---:|---:|---:|---:|";

    /// One Markdown table row of this report.
    pub fn row(&self, store: &str, nemesis: &str) -> String {
        format!(
            "| {store} | {nemesis} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} |",
            self.keys,
            self.operations,
            self.executions,
            self.doubles_listed,
            self.doubles_silent,
            self.changed_listed,
            self.changed_silent,
            self.lost_listed,
            self.lost,
            self.unfinished
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} keys, {} operations, {} executions; doubles {} listed / {} silent; answers \
             changed {} listed / {} silent; lost {} listed / {} silent; {} unfinished",
            self.keys,
            self.operations,
            self.executions,
            self.doubles_listed,
            self.doubles_silent,
            self.changed_listed,
            self.changed_silent,
            self.lost_listed,
            self.lost,
            self.unfinished
        )?;
        for finding in self.findings.iter().take(20) {
            write!(
                f,
                "\n  {:?} {}: {}",
                finding.violation, finding.key, finding.detail
            )?;
        }
        if self.findings.len() > 20 {
            write!(f, "\n  … and {} more", self.findings.len() - 20)?;
        }
        Ok(())
    }
}

/// Judges `history`; see the module's documentation for the rules.
pub fn check(history: &History) -> Report {
    let mut report = Report {
        keys: history.keys.len(),
        operations: history.requests.len(),
        executions: history.executions.len(),
        ..Report::default()
    };
    let mut runs: HashMap<&str, Vec<&Execution>> = HashMap::new();
    for e in &history.executions {
        runs.entry(e.key.as_str()).or_default().push(e);
    }
    let listed: HashMap<&str, &str> = history
        .listed
        .iter()
        .map(|l| (l.key.as_str(), l.reason.as_str()))
        .collect();
    let deadline = history.healed + history.bound;
    for key in &history.keys {
        let mut executions = runs.remove(key.as_str()).unwrap_or_default();
        executions.sort_by_key(|e| e.started);
        let double_listed = executions.len() > 1 && {
            let reason = listed.get(key.as_str());
            reason.is_some() && new_attempts(&executions)
        };
        if executions.len() > 1 {
            if double_listed {
                report.doubles_listed += 1;
            } else {
                report.doubles_silent += 1;
                report.findings.push(Finding {
                    violation: Violation::SilentDouble,
                    key: key.clone(),
                    detail: format!(
                        "executed {} times, attempts {:?}, listed as {:?}",
                        executions.len(),
                        executions.iter().map(|e| e.attempt).collect::<Vec<_>>(),
                        listed.get(key.as_str())
                    ),
                });
            }
        }

        let mut answers: Vec<(u16, &Bytes, Duration)> = history
            .requests
            .iter()
            .filter(|r| &r.key == key)
            .filter_map(|r| r.outcome.final_answer().map(|(s, b)| (s, b, r.ended)))
            .collect();
        answers.sort_by_key(|a| a.2);
        let distinct: HashSet<(u16, &Bytes)> = answers.iter().map(|(s, b, _)| (*s, *b)).collect();
        let foreign: Vec<&(u16, &Bytes)> = distinct
            .iter()
            .filter(|(_, body)| !executions.iter().any(|e| e.body == *body))
            .collect();
        if !foreign.is_empty() || (distinct.len() > 1 && !double_listed) {
            report.changed_silent += 1;
            report.findings.push(Finding {
                violation: Violation::ChangedAnswer,
                key: key.clone(),
                detail: format!(
                    "{} distinct answers, {} of them no execution of the key: {:?}",
                    distinct.len(),
                    foreign.len(),
                    distinct
                        .iter()
                        .map(|(s, b)| format!("{s} {}", String::from_utf8_lossy(b)))
                        .collect::<Vec<_>>()
                ),
            });
        } else if distinct.len() > 1 {
            report.changed_listed += 1;
        }

        if let Some(&(_, _, acknowledged)) = answers.first() {
            let later: Vec<Duration> = executions
                .iter()
                .filter(|e| e.started > acknowledged)
                .map(|e| e.started)
                .collect();
            if !later.is_empty() && double_listed {
                report.lost_listed += 1;
            } else if !later.is_empty() {
                report.lost += 1;
                report.findings.push(Finding {
                    violation: Violation::Lost,
                    key: key.clone(),
                    detail: format!(
                        "answered at {acknowledged:?}, executed again at {later:?}, attempts \
                         {:?}, listed as {:?}",
                        executions.iter().map(|e| e.attempt).collect::<Vec<_>>(),
                        listed.get(key.as_str())
                    ),
                });
            }
        }

        if !answers.iter().any(|a| a.2 <= deadline) {
            report.unfinished += 1;
            report.findings.push(Finding {
                violation: Violation::Unfinished,
                key: key.clone(),
                detail: format!(
                    "no final answer by {deadline:?} (healed at {:?}); first answer at {:?}",
                    history.healed,
                    answers.first().map(|a| a.2)
                ),
            });
        }
    }
    report
}

/// Whether every execution after the first (in the order they started) carried an
/// attempt above 1, and no two the same attempt.
fn new_attempts(executions: &[&Execution]) -> bool {
    let mut seen = HashSet::new();
    executions.iter().enumerate().all(|(i, e)| match e.attempt {
        Some(a) => seen.insert(a) && (i == 0 || a > 1),
        None => false,
    })
}

#[cfg(test)]
mod tests;
