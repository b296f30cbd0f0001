//! What a run records: every request a client sent and what came back, every execution
//! the upstream saw, and the gateway's ambiguous-outcome feed. Times are offsets from
//! the run's start, read from one clock in one process (clients and upstream both live
//! in the test process), so they compare.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// One request a client sent, and its answer if one came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The `Idempotency-Key`.
    pub key: String,
    /// The gateway it was sent to (an index).
    pub gateway: usize,
    /// When the client started sending it.
    pub sent: Duration,
    /// When the answer was read whole, or the client gave up.
    pub ended: Duration,
    /// What came back.
    pub outcome: Outcome,
}

/// What a client got for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An answer, read whole.
    Answer {
        /// Its status.
        status: u16,
        /// Its body, as received.
        body: Bytes,
        /// Whether it said `Idempotent-Replayed: true`: a recorded answer.
        replayed: bool,
    },
    /// No answer: the connection broke, the client hung up on purpose (a lost answer),
    /// or the client's deadline passed.
    Lost,
}

impl Outcome {
    /// The answer as it counts for "answers never change": a 2xx, or any recorded
    /// (replayed) answer, as `(status, body)`. Problems the gateway made up itself (409
    /// in progress, 503 store unavailable, 504 upstream timeout) are not answers of the
    /// key.
    pub fn final_answer(&self) -> Option<(u16, &Bytes)> {
        match self {
            Outcome::Answer {
                status,
                body,
                replayed,
            } if (200..300).contains(status) || *replayed => Some((*status, body)),
            _ => None,
        }
    }
}

/// One execution the upstream saw: a request with a key that reached it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The `Idempotency-Key` it carried.
    pub key: String,
    /// Its `Idempotency-Attempt` header, when it carried one.
    pub attempt: Option<u32>,
    /// When it reached the upstream.
    pub started: Duration,
    /// The body the upstream answered with (unique to the execution).
    pub body: Bytes,
}

/// One record the ambiguous-outcome feed (`GET /keys?ambiguous=true`) listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The record's key.
    pub key: String,
    /// Why its outcome is ambiguous (`takeover`, `orphaned`, `upstream_timeout`, …).
    pub reason: String,
    /// The record's attempt number.
    pub attempt: u32,
}

/// Everything one run recorded, and the figures its progress is judged by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// The keys the run used, each once.
    pub keys: Vec<String>,
    /// Every request, in any order.
    pub requests: Vec<Request>,
    /// Every execution the upstream saw, in any order.
    pub executions: Vec<Execution>,
    /// The ambiguous-outcome feed, read after the run.
    pub listed: Vec<Listed>,
    /// When the last fault was healed.
    pub healed: Duration,
    /// How long after `healed` every key must have its final answer: the lease plus
    /// the clients' retry schedule.
    pub bound: Duration,
}

/// Collects a run's requests and executions from many tasks, on one clock.
#[derive(Debug, Clone)]
pub struct Recorder {
    start: Instant,
    requests: Arc<Mutex<Vec<Request>>>,
    executions: Arc<Mutex<Vec<Execution>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            requests: Arc::default(),
            executions: Arc::default(),
        }
    }

    /// Now, as an offset from the start.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Records a request.
    pub fn request(&self, request: Request) {
        self.requests.lock().unwrap().push(request);
    }

    /// Records an execution.
    pub fn execution(&self, execution: Execution) {
        self.executions.lock().unwrap().push(execution);
    }

    /// How many executions were recorded so far.
    pub fn executions_so_far(&self) -> usize {
        self.executions.lock().unwrap().len()
    }

    /// The history of `keys` so far (requests and executions of other keys left out),
    /// with no feed and no bound yet.
    pub fn history(&self, keys: &[String]) -> History {
        let set: std::collections::HashSet<&String> = keys.iter().collect();
        let mine = |k: &String| set.contains(k);
        History {
            keys: keys.to_vec(),
            requests: self
                .requests
                .lock()
                .unwrap()
                .iter()
                .filter(|r| mine(&r.key))
                .cloned()
                .collect(),
            executions: self
                .executions
                .lock()
                .unwrap()
                .iter()
                .filter(|e| mine(&e.key))
                .cloned()
                .collect(),
            ..History::default()
        }
    }
}
