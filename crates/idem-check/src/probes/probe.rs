//! [`Probe`]: one probe at work, its checks and evidence so far, and the ways it sends
//! requests and judges answers that every probe shares.

use std::time::{Duration, Instant};

use super::super::client::{Answer, Exchange, Req, Session, Stop};
use super::{Check, ProbeReport, Status};

/// A probe at work: its checks and evidence so far.
pub(super) struct Probe<'a> {
    pub(super) s: &'a Session,
    checks: Vec<Check>,
    pub(super) exchanges: Vec<Exchange>,
}

impl<'a> Probe<'a> {
    pub(super) fn new(s: &'a Session) -> Probe<'a> {
        Probe {
            s,
            checks: Vec::new(),
            exchanges: Vec::new(),
        }
    }

    pub(super) fn check(&mut self, name: &str, status: Status, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.to_owned(),
            status,
            detail: detail.into(),
        });
    }

    pub(super) fn judge(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        let status = if ok { Status::Pass } else { Status::Fail };
        self.check(name, status, detail);
    }

    pub(super) async fn send(&mut self, label: &str, req: &Req) -> Result<Answer, Stop> {
        let (exchange, answer) = self.s.send(label, req).await;
        self.exchanges.push(exchange);
        answer
    }

    /// Sends `req` again while the answer is 409 (an attempt still in progress),
    /// waiting as `Retry-After` says (at most a second at a time), at most 20 times.
    pub(super) async fn settled(&mut self, label: &str, req: &Req) -> Result<Answer, Stop> {
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
    pub(super) async fn first(&mut self, key: &str) -> Result<Answer, Stop> {
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

    pub(super) fn id_of(&self, a: &Answer) -> Option<String> {
        a.id(self.s.target.id_pointer.as_deref()?)
    }

    /// Checks that `b` is the answer of the same execution as `a`: same status and
    /// body, and with `--id-pointer` the same resource id.
    pub(super) fn same_execution(&mut self, name: &str, a: &Answer, b: &Answer) -> bool {
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

    pub(super) fn finish(
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

pub(super) fn shown_id(pointer: &str, id: &Option<String>) -> String {
    match id {
        Some(id) => format!("id {id}"),
        None => format!("no id at {pointer}"),
    }
}

/// `s`, cut at `max` characters.
pub(super) fn short(s: &str, max: usize) -> String {
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s.to_owned()
    }
}
