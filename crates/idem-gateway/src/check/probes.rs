//! The probes: what each one sends and how it judges the answers.

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use super::client::{Answer, Exchange, Req, Session, Stop, new_key};

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

/// A probe at work: its checks and evidence so far.
struct Probe<'a> {
    s: &'a Session,
    checks: Vec<Check>,
    exchanges: Vec<Exchange>,
}

impl<'a> Probe<'a> {
    fn new(s: &'a Session) -> Probe<'a> {
        Probe {
            s,
            checks: Vec::new(),
            exchanges: Vec::new(),
        }
    }

    fn check(&mut self, name: &str, status: Status, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.to_owned(),
            status,
            detail: detail.into(),
        });
    }

    fn judge(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        let status = if ok { Status::Pass } else { Status::Fail };
        self.check(name, status, detail);
    }

    async fn send(&mut self, label: &str, req: &Req) -> Result<Answer, Stop> {
        let (exchange, answer) = self.s.send(label, req).await;
        self.exchanges.push(exchange);
        answer
    }

    /// Sends `req` again while the answer is 409 (an attempt still in progress),
    /// waiting as `Retry-After` says (at most a second at a time), at most 20 times.
    async fn settled(&mut self, label: &str, req: &Req) -> Result<Answer, Stop> {
        let mut answer = self.send(label, req).await?;
        for _ in 0..20 {
            if answer.status != 409 {
                break;
            }
            let wait = answer
                .header("retry-after")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(Duration::from_millis(200), Duration::from_secs)
                .clamp(Duration::from_millis(100), Duration::from_secs(1));
            self.s.pause(wait).await;
            answer = self.send(&format!("{label} (after a 409)"), req).await?;
        }
        Ok(answer)
    }

    /// The first request of a probe, which the API must accept for the rest to mean
    /// anything.
    async fn first(&mut self, key: &str) -> Result<Answer, Stop> {
        let a = self.settled("first request", &Req::keyed(key)).await?;
        if !a.accepted() {
            return Err(Stop(format!(
                "the API did not accept the first request (status {}), so the probe cannot \
                 judge: check --method, --body and --header",
                a.status
            )));
        }
        Ok(a)
    }

    fn id_of(&self, a: &Answer) -> Option<String> {
        a.id(self.s.target.id_pointer.as_deref()?)
    }

    /// Checks that `b` is the answer of the same execution as `a`: same status and
    /// body, and with `--id-pointer` the same resource id.
    fn same_execution(&mut self, name: &str, a: &Answer, b: &Answer) -> bool {
        let mut ok = true;
        if let Some(pointer) = self.s.target.id_pointer.clone() {
            let (ia, ib) = (a.id(&pointer), b.id(&pointer));
            let same = ia.is_some() && ia == ib;
            ok &= same;
            self.judge(
                &format!("{name}: same resource id"),
                same,
                format!(
                    "{} then {}",
                    shown_id(&pointer, &ia),
                    shown_id(&pointer, &ib)
                ),
            );
        }
        let same_status = a.status == b.status;
        ok &= same_status;
        self.judge(
            &format!("{name}: same status"),
            same_status,
            format!("{} then {}", a.status, b.status),
        );
        let same_body = a.body == b.body;
        ok &= same_body;
        self.judge(
            &format!("{name}: same body"),
            same_body,
            if same_body {
                format!("{} identical bytes", a.body.len())
            } else {
                "the bodies differ (see the exchanges)".to_owned()
            },
        );
        ok
    }

    fn finish(
        mut self,
        id: &'static str,
        name: &'static str,
        stop: Option<Stop>,
        started: Instant,
    ) -> ProbeReport {
        if let Some(Stop(why)) = stop {
            self.check("probe completed", Status::Fail, why);
        }
        let status = if self.checks.iter().any(|c| c.status == Status::Fail) {
            Status::Fail
        } else if self.checks.iter().any(|c| c.status == Status::Pass) {
            Status::Pass
        } else {
            Status::NotApplicable
        };
        let summary = match status {
            Status::Fail => self
                .checks
                .iter()
                .find(|c| c.status == Status::Fail)
                .map(|c| format!("{}: {}", c.name, c.detail)),
            Status::Pass => {
                let passed: Vec<&str> = self
                    .checks
                    .iter()
                    .filter(|c| c.status == Status::Pass)
                    .map(|c| c.detail.as_str())
                    .collect();
                Some(short(&passed.join("; "), 160))
            }
            Status::NotApplicable => self.checks.first().map(|c| c.detail.clone()),
        }
        .unwrap_or_default();
        ProbeReport {
            id,
            name,
            status,
            summary,
            checks: self.checks,
            exchanges: self.exchanges,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }
}

fn shown_id(pointer: &str, id: &Option<String>) -> String {
    match id {
        Some(id) => format!("id {id}"),
        None => format!("no id at {pointer}"),
    }
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

/// The same request with the same key gets the same status and body (and id).
async fn replay(p: &mut Probe<'_>) -> Result<(), Stop> {
    let key = new_key();
    let a = p.first(&key).await?;
    let b = p
        .settled("the same request, same key", &Req::keyed(&key))
        .await?;
    p.same_execution("replay", &a, &b);
    Ok(())
}

/// N parallel requests with one key: exactly one execution.
async fn concurrent_duplicates(p: &mut Probe<'_>, n: u32) -> Result<(), Stop> {
    let key = new_key();
    let req = Req::keyed(&key);
    let s = p.s;
    let sends = (0..n).map(|i| {
        let req = req.clone();
        async move { s.send(&format!("parallel request {}", i + 1), &req).await }
    });
    let results = futures_util::future::join_all(sends).await;
    let mut executions: Vec<String> = Vec::new();
    let (mut conflicts, mut conflicts_with_retry_after) = (0, 0);
    let mut others: Vec<String> = Vec::new();
    let mut stopped = None;
    for (exchange, answer) in results {
        p.exchanges.push(exchange);
        match answer {
            Ok(a) if a.accepted() => {
                let identity = match p.id_of(&a) {
                    Some(id) => format!("id {id}"),
                    None if p.s.target.id_pointer.is_some() => "no id".to_owned(),
                    None => format!("body {}", String::from_utf8_lossy(&a.body)),
                };
                if !executions.contains(&identity) {
                    executions.push(identity);
                }
            }
            Ok(a) if a.status == 409 => {
                conflicts += 1;
                if a.headers.contains_key("retry-after") {
                    conflicts_with_retry_after += 1;
                }
            }
            Ok(a) => others.push(a.status.to_string()),
            Err(e) => {
                others.push(e.0.clone());
                stopped.get_or_insert(e);
            }
        }
    }
    let what = if p.s.target.id_pointer.is_some() {
        "resource ids"
    } else {
        "bodies (no --id-pointer)"
    };
    p.judge(
        "one execution",
        executions.len() <= 1,
        format!(
            "{n} parallel requests with one key: {} distinct {what} among the 2xx answers{}",
            executions.len(),
            if executions.len() > 1 {
                format!(
                    " ({})",
                    executions
                        .iter()
                        .take(5)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                String::new()
            }
        ),
    );
    p.judge(
        "the others wait, get 409 or the replay",
        others.is_empty(),
        format!(
            "{conflicts} answered 409 ({conflicts_with_retry_after} with Retry-After){}",
            if others.is_empty() {
                String::new()
            } else {
                format!("; other outcomes: {}", others.join(", "))
            }
        ),
    );
    if let Some(stop) = stopped {
        return Err(stop);
    }
    // Once the attempt is over, the key answers with the one execution.
    if executions.len() <= 1 {
        let after = p.settled("after the parallel requests", &req).await?;
        let identity = match p.id_of(&after) {
            Some(id) => format!("id {id}"),
            None if p.s.target.id_pointer.is_some() => "no id".to_owned(),
            None => format!("body {}", String::from_utf8_lossy(&after.body)),
        };
        let ok = after.accepted() && executions.first().is_none_or(|e| *e == identity);
        p.judge(
            "a later request gets that execution",
            ok,
            format!("status {}, {}", after.status, short(&identity, 80)),
        );
    }
    Ok(())
}

/// The answer of a request is lost: the retry gets the execution that happened.
async fn lost_answer(p: &mut Probe<'_>) -> Result<(), Stop> {
    let key = new_key();
    let req = Req::keyed(&key);
    let (exchange, sent) =
        p.s.send_and_hang_up("sent, then hung up before reading", &req)
            .await;
    p.exchanges.push(exchange);
    sent?;
    let retry = p.settled("the retry, same key", &req).await?;
    if !retry.accepted() {
        p.judge(
            "the retry is answered",
            false,
            format!("the retry was answered {}", retry.status),
        );
        return Ok(());
    }
    let again = p.settled("a follow-up, same key", &req).await?;
    p.same_execution("the retry is the execution that happened", &retry, &again);
    Ok(())
}

/// The same key with another body: 422.
async fn payload_mismatch(p: &mut Probe<'_>) -> Result<(), Stop> {
    let key = new_key();
    let a = p.first(&key).await?;
    let changed = changed_body(&p.s.target.body, p.s.target.json.as_ref());
    let b = p
        .send(
            "the same key, a changed body",
            &Req::keyed(&key).with_body(changed),
        )
        .await?;
    let mut detail = format!("answered {}", b.status);
    if b.status != 422 {
        detail.push_str(" instead of 422");
        if b.accepted() {
            match (p.id_of(&a), p.id_of(&b)) {
                (Some(x), Some(y)) if x != y => {
                    detail.push_str(&format!(": it executed again (id {x}, then {y})"))
                }
                _ if a.body != b.body => detail.push_str(": a new answer (it executed again?)"),
                _ => detail.push_str(": the first answer, replayed for another payload"),
            }
        }
    }
    p.judge("a changed body is 422", b.status == 422, detail);
    Ok(())
}

/// Malformed keys are 400; the quoted and bare forms are one key; a required key.
async fn keys(p: &mut Probe<'_>, require_key: bool) -> Result<(), Stop> {
    let mut long = new_key();
    while long.len() < 256 {
        long.push('x');
    }
    let cases: [(&str, &str, Vec<Vec<u8>>); 3] = [
        (
            "a 256-character key is 400",
            "a 256-character key",
            vec![long.into_bytes()],
        ),
        (
            "a key with a control character is 400",
            "a key with a tab in it",
            vec![format!("{}\tx", new_key()).into_bytes()],
        ),
        (
            "two Idempotency-Key fields are 400",
            "two Idempotency-Key fields",
            vec![new_key().into_bytes(), new_key().into_bytes()],
        ),
    ];
    for (check, label, keys) in cases {
        let a = p
            .send(
                label,
                &Req {
                    keys,
                    ..Req::default()
                },
            )
            .await?;
        p.judge(
            check,
            a.status == 400,
            format!("{label}: answered {}", a.status),
        );
    }
    let key = new_key();
    let quoted = format!("\"{key}\"");
    let a = p
        .settled("the quoted (Structured Field) form", &Req::keyed(&quoted))
        .await?;
    if a.accepted() {
        let b = p
            .settled("the bare form of the same key", &Req::keyed(&key))
            .await?;
        p.same_execution("quoted and bare are one key", &a, &b);
    } else {
        p.judge(
            "quoted and bare are one key",
            false,
            format!("the quoted form \"K\" was answered {}", a.status),
        );
    }
    if require_key {
        let a = p.send("no Idempotency-Key", &Req::default()).await?;
        p.judge(
            "a missing key is 400 (--require-key)",
            a.status == 400,
            format!("no key: answered {}", a.status),
        );
    } else {
        p.check(
            "a missing key is 400 (--require-key)",
            Status::NotApplicable,
            "not checked: pass --require-key when the route requires a key",
        );
    }
    Ok(())
}

/// Reordered keys and other whitespace are the same request.
async fn equivalent_json(p: &mut Probe<'_>) -> Result<(), Stop> {
    let Some(json) = p.s.target.json.clone() else {
        p.check(
            "equivalent JSON is the same request",
            Status::NotApplicable,
            "the body is not JSON",
        );
        return Ok(());
    };
    let key = new_key();
    let a = p.first(&key).await?;
    let mut other = String::new();
    write_reordered(&json, 0, &mut other);
    let b = p
        .settled(
            "the same JSON, keys reordered, other whitespace",
            &Req::keyed(&key).with_body(other),
        )
        .await?;
    if b.status == 422 {
        p.judge(
            "equivalent JSON is the same request",
            false,
            "answered 422: the API compares the body's bytes, not its JSON",
        );
    } else {
        p.same_execution("equivalent JSON is the same request", &a, &b);
    }
    Ok(())
}

/// The same key under another tenant never gets the first tenant's answer.
async fn tenants(p: &mut Probe<'_>) -> Result<(), Stop> {
    let Some((name, _)) = p.s.target.other_tenant.clone() else {
        p.check(
            "another tenant never gets this tenant's answer",
            Status::NotApplicable,
            "not checked: pass --other-tenant-header with another tenant's credential",
        );
        return Ok(());
    };
    let key = new_key();
    let a = p.first(&key).await?;
    let b = p
        .send(
            &format!("the same key, another tenant's {name}"),
            &Req {
                other_tenant: true,
                ..Req::keyed(&key)
            },
        )
        .await?;
    let leaked = match (p.id_of(&a), p.id_of(&b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.status == b.status && a.body == b.body,
    };
    let (ok, detail) = if b.replay_marker() || leaked {
        (
            false,
            format!(
                "the other tenant got the first tenant's answer (status {}{})",
                b.status,
                if b.replay_marker() {
                    ", Idempotent-Replayed: true"
                } else {
                    ""
                }
            ),
        )
    } else if b.status == 409 || b.status == 422 {
        (
            false,
            format!(
                "the other tenant's request met the first tenant's record (status {})",
                b.status
            ),
        )
    } else {
        (
            true,
            format!("the other tenant got its own answer (status {})", b.status),
        )
    };
    p.judge("another tenant never gets this tenant's answer", ok, detail);
    Ok(())
}

/// A replay carries no recorded `Set-Cookie` or `Date`; the replay marker is reported.
async fn replayed_headers(p: &mut Probe<'_>) -> Result<(), Stop> {
    let key = new_key();
    let a = p.first(&key).await?;
    // A replayed Date is only told from a fresh one once the clock's second has moved on.
    let wait = Duration::from_millis(1100).saturating_sub(a.received.elapsed());
    p.s.pause(wait).await;
    let b = p
        .settled("a replay, a second later", &Req::keyed(&key))
        .await?;
    let same = match (p.id_of(&a), p.id_of(&b)) {
        (Some(x), Some(y)) => x == y && a.status == b.status,
        _ => a.status == b.status && a.body == b.body,
    };
    if !b.replay_marker() && !same {
        p.check(
            "no replay to inspect",
            Status::NotApplicable,
            "the second answer is no replay of the first (see the replay probe)",
        );
        return Ok(());
    }
    match (a.header("set-cookie"), b.header("set-cookie")) {
        (Some(x), Some(y)) if x == y => p.judge(
            "Set-Cookie is not replayed",
            false,
            "the replay carries the first answer's Set-Cookie",
        ),
        (_, Some(_)) => p.judge(
            "Set-Cookie is not replayed",
            true,
            "the replay carries a Set-Cookie of its own",
        ),
        (_, None) => p.judge(
            "Set-Cookie is not replayed",
            true,
            "no Set-Cookie on the replay",
        ),
    }
    match (a.header("date"), b.header("date")) {
        (Some(x), Some(y)) if x == y => p.judge(
            "Date is not replayed",
            false,
            format!("the replay, sent over a second later, carries the first answer's Date ({y})"),
        ),
        (_, Some(y)) => p.judge("Date is not replayed", true, format!("a fresh Date ({y})")),
        (_, None) => p.check(
            "Date is not replayed",
            Status::NotApplicable,
            "the replay carries no Date",
        ),
    }
    if b.replay_marker() {
        p.judge(
            "replay marker",
            true,
            "Idempotent-Replayed: true on the replay",
        );
    } else {
        p.check(
            "replay marker",
            Status::NotApplicable,
            "no Idempotent-Replayed header on the replay",
        );
    }
    Ok(())
}

/// A body that differs from `body` as a request, not only in spelling.
fn changed_body(body: &Bytes, json: Option<&Value>) -> Bytes {
    match json {
        Some(Value::Object(map)) => {
            let mut map = map.clone();
            map.insert("idem_check_changed".to_owned(), Value::Bool(true));
            Bytes::from(Value::Object(map).to_string())
        }
        Some(other) => Bytes::from(serde_json::json!([other, "idem-check: changed"]).to_string()),
        None => {
            let mut v = body.to_vec();
            v.extend_from_slice(b"\nidem-check: changed");
            Bytes::from(v)
        }
    }
}

/// Writes `v` as JSON with every object's keys in reverse order, spaces around the
/// punctuation and one member a line: the same JSON in other bytes.
pub fn write_reordered(v: &Value, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth + 1);
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            keys.reverse();
            out.push_str("{\n");
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                out.push_str(&indent);
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push_str(" : ");
                write_reordered(&map[*k], depth + 1, out);
            }
            out.push_str("\n}");
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                write_reordered(item, depth + 1, out);
            }
            out.push_str(" ]");
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `s`, cut at `max` characters.
fn short(s: &str, max: usize) -> String {
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reordered_json_is_equal_json_in_other_bytes() {
        let v: Value =
            serde_json::from_str(r#"{"a":1,"b":{"x":[1,{"y":2,"z":3}],"w":null}}"#).unwrap();
        let mut out = String::new();
        write_reordered(&v, 0, &mut out);
        assert_ne!(out, v.to_string());
        assert!(
            out.find("\"b\"").unwrap() < out.find("\"a\"").unwrap(),
            "{out}"
        );
        let back: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn changed_body_differs_as_json() {
        let v: Value = serde_json::from_str(r#"{"amount":5}"#).unwrap();
        let changed = changed_body(&Bytes::from_static(br#"{"amount":5}"#), Some(&v));
        let back: Value = serde_json::from_slice(&changed).unwrap();
        assert_ne!(back, v);
        assert_eq!(back["amount"], 5);
    }
}
