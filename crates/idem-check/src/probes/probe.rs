//! [`Probe`]: one probe at work, its checks and evidence so far, and the ways it sends
//! requests and judges answers that every probe shares.

use std::time::{Duration, Instant};

use super::super::client::{Answer, Exchange, Req, Session, Stop};
use super::super::profile::Expectations;
use super::{Check, Options, ProbeReport, Status};

/// A probe at work: its checks and evidence so far.
pub(super) struct Probe<'a> {
    pub(super) s: &'a Session,
    pub(super) opts: Options,
    checks: Vec<Check>,
    pub(super) exchanges: Vec<Exchange>,
    /// A request the API should have answered from its record executed again.
    pub(super) executed_again: bool,
}

impl<'a> Probe<'a> {
    pub(super) fn new(s: &'a Session, opts: Options) -> Probe<'a> {
        Probe {
            s,
            opts,
            checks: Vec::new(),
            exchanges: Vec::new(),
            executed_again: false,
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

    /// Sends `req` again while the answer is a 409 for an attempt still in progress,
    /// waiting as `Retry-After` says (at most a second at a time), at most 20 times.
    pub(super) async fn settled(&mut self, label: &str, req: &Req) -> Result<Answer, Stop> {
        let mut answer = self.send(label, req).await?;
        for _ in 0..20 {
            if !self.opts.profile.in_progress(&answer) {
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

    /// What tells `a`'s execution from another's by its body: the bytes, or under
    /// `--profile mcp` the JSON-RPC response with its `id` left out (every request
    /// carries an id of its own, and a replay answers with the retry's).
    pub(super) fn body_identity(&self, a: &Answer) -> String {
        if self.s.target.rpc {
            crate::rpc::identity(a)
        } else {
            String::from_utf8_lossy(&a.body).into_owned()
        }
    }

    /// Whether `a` and `b` carry the same body, as [`Probe::body_identity`] tells them.
    pub(super) fn same_body(&self, a: &Answer, b: &Answer) -> bool {
        a.body == b.body || (self.s.target.rpc && self.body_identity(a) == self.body_identity(b))
    }

    pub(super) fn id_of(&self, a: &Answer) -> Option<String> {
        a.id(self.s.target.id_pointer.as_deref()?)
    }

    /// Checks that `b` is the answer of the same execution as `a`: same status and
    /// body, and with `--id-pointer` the same resource id. When it is another execution,
    /// a status that happens to match proves nothing and is not reported as a pass.
    pub(super) fn same_execution(&mut self, name: &str, a: &Answer, b: &Answer) -> bool {
        let mut another = false;
        let mut id_check = None;
        if let Some(pointer) = self.s.target.id_pointer.clone() {
            let (ia, ib) = (a.id(&pointer), b.id(&pointer));
            let same = ia.is_some() && ia == ib;
            another |= ia.is_some() && ib.is_some() && !same;
            id_check = Some((
                same,
                format!(
                    "{} then {}",
                    shown_id(&pointer, &ia),
                    shown_id(&pointer, &ib)
                ),
            ));
        }
        let same_body = self.same_body(a, b);
        another |= !same_body && a.accepted() && b.accepted();
        if another {
            self.executed_again = true;
        }
        let mut ok = true;
        if let Some((same, detail)) = id_check {
            ok &= same;
            self.judge(&format!("{name}: same resource id"), same, detail);
        }
        let same_status = a.status == b.status;
        ok &= same_status;
        let statuses = format!("{} then {}", a.status, b.status);
        if same_status && another {
            self.check(
                &format!("{name}: same status"),
                Status::NotApplicable,
                format!("{statuses}, but from another execution, so it proves nothing"),
            );
        } else {
            self.judge(&format!("{name}: same status"), same_status, statuses);
        }
        ok &= same_body;
        self.judge(
            &format!("{name}: same body"),
            same_body,
            if same_body && a.body != b.body {
                "the same JSON-RPC response, each with its request's id".to_owned()
            } else if same_body {
                count(a.body.len(), "identical byte", "identical bytes")
            } else if another {
                "the bodies differ: the request executed again (see the exchanges)".to_owned()
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
        let failed = self.checks.iter().filter(|c| c.status == Status::Fail);
        // A probe that could not finish says so first, then what it saw before.
        let (stops, others): (Vec<&Check>, Vec<&Check>) =
            failed.partition(|c| c.name == "probe completed");
        let summary = match status {
            Status::Fail => {
                let shown: Vec<String> = stops
                    .iter()
                    .chain(others.first())
                    .map(|c| format!("{}: {}", c.name, c.detail))
                    .collect();
                Some(short(&shown.join("; "), 200))
            }
            Status::Pass => {
                let passed: Vec<&str> = self
                    .checks
                    .iter()
                    .filter(|c| c.status == Status::Pass)
                    .map(|c| c.detail.as_str())
                    .collect();
                Some(short(&passed.join("; "), 160))
            }
            Status::NotApplicable => self.checks.first().map(|c| short(&c.detail, 160)),
        }
        .unwrap_or_default();
        ProbeReport {
            id,
            name,
            tests: super::describe(id),
            status,
            summary,
            executed_again: self.executed_again,
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

/// `s`, cut at `max` characters at most, on a word boundary (a space, or after a comma
/// or semicolon, as in JSON), with `…` when cut.
pub(crate) fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    // Room for the ellipsis.
    let head: String = s.chars().take(max.saturating_sub(1)).collect();
    let next = s.chars().nth(head.chars().count());
    let cut = if next.is_some_and(|c| c.is_whitespace() || c == ',' || c == ';') {
        head.as_str()
    } else {
        let boundary = head
            .char_indices()
            .filter(|(_, c)| c.is_whitespace() || *c == ',' || *c == ';')
            .map(|(i, _)| i)
            .next_back();
        match boundary {
            Some(i) if i > 0 => &head[..i],
            // One word longer than the room: cut inside it rather than show nothing.
            _ => head.as_str(),
        }
    };
    format!(
        "{}…",
        cut.trim_end_matches(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == ':')
    )
}

/// `n` and the noun in its number: `1 distinct resource id`, `2 distinct resource ids`.
pub(crate) fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(
            count(1, "distinct resource id", "distinct resource ids"),
            "1 distinct resource id"
        );
        assert_eq!(
            count(2, "distinct resource id", "distinct resource ids"),
            "2 distinct resource ids"
        );
        assert_eq!(count(0, "request", "requests"), "0 requests");
    }

    #[test]
    fn short_cuts_on_a_word_boundary() {
        assert_eq!(short("replay holds", 80), "replay holds");
        let cut = short(
            "the same request with the same key is answered from the record",
            30,
        );
        assert_eq!(cut, "the same request with the…");
        assert!(cut.chars().count() <= 30);
        // A cut right before a space keeps the whole last word.
        assert_eq!(short("abc def ghi", 8), "abc def…");
        assert_eq!(short("abc, def ghi", 6), "abc…");
        // One long word is cut inside, never dropped whole.
        assert_eq!(short("abcdefghij", 5), "abcd…");
        // JSON is cut after a member.
        assert_eq!(
            short(r#"body {"id":"ch_1","amount":500,"currency":"eur"}"#, 30),
            r#"body {"id":"ch_1"…"#
        );
    }
}
