//! The probes of what executes: a replay, concurrent duplicates, a lost answer and a
//! reused key with another payload.

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::super::client::{Answer, Arrival, BodyKind, Req, Stop, Timing, new_key};
use super::super::form;
use super::super::profile::{Expectations, Refusal};
use super::Status;
use super::probe::{Probe, count, short};

/// The same request with the same key gets the same status and body (and id).
pub(super) async fn replay(p: &mut Probe<'_>) -> Result<(), Stop> {
    let key = new_key();
    let a = p.first(&key).await?;
    let b = p
        .settled("the same request, same key", &Req::keyed(&key))
        .await?;
    p.same_execution("replay", &a, &b);
    Ok(())
}

/// N parallel requests with one key, made to overlap: exactly one execution.
///
/// Each request is written but for its last byte; once all N are written (or could not
/// be), the last bytes are released together, so the server cannot act on any before
/// all have reached it. Whether they overlapped is then measured, not assumed: from each
/// exchange's own instants (in flight from its first byte sent until its answer's head
/// was read), and from answers only a concurrent duplicate gets (a 409, or a replay
/// answered while the first was still in flight). When no two overlapped, nothing was
/// tested, and the probe says so instead of passing.
pub(super) async fn concurrent_duplicates(p: &mut Probe<'_>) -> Result<(), Stop> {
    let n = p.opts.concurrency;
    let key = new_key();
    let req = Req::keyed(&key);
    let s = p.s;
    let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
    let (go_tx, go) = watch::channel(false);
    let sends: Vec<_> = (0..n)
        .map(|i| {
            let req = req.clone();
            let arrival = Arrival::new(arrived_tx.clone());
            let go = go.clone();
            async move {
                s.send_held(&format!("parallel request {}", i + 1), &req, arrival, go)
                    .await
            }
        })
        .collect();
    drop(arrived_tx);
    let release = async move {
        for _ in 0..n {
            if arrived.recv().await.is_none() {
                break;
            }
        }
        let _ = go_tx.send(true);
    };
    let (results, ()) =
        futures_util::future::join(futures_util::future::join_all(sends), release).await;

    let mut executions: Vec<String> = Vec::new();
    let mut first_execution: Option<Timing> = None;
    let mut conflicts: Vec<Answer> = Vec::new();
    let mut replays: Vec<Option<Timing>> = Vec::new();
    let mut others: Vec<String> = Vec::new();
    let mut stopped = None;
    let mut timings = Vec::new();
    for (exchange, answer) in results {
        let timing = exchange.timing;
        // Only an answered request has an interval: one that failed proves no overlap.
        if let Some(t) = timing.filter(|t| t.answered_us.is_some()) {
            timings.push(t);
        }
        p.exchanges.push(exchange);
        match answer {
            // Under a profile whose refusal of a request in progress is a 2xx (`mcp`:
            // a JSON-RPC error), it is a conflict, never an execution.
            Ok(a) if a.status != 409 && p.opts.profile.in_progress(&a) => conflicts.push(a),
            Ok(a) if a.accepted() => {
                if a.replay_marker() {
                    replays.push(timing);
                } else if first_execution.is_none() {
                    first_execution = timing;
                }
                let identity = identity(p, &a);
                if !executions.contains(&identity) {
                    executions.push(identity);
                }
            }
            Ok(a) if a.status == 409 => conflicts.push(a),
            Ok(a) => others.push(a.status.to_string()),
            Err(e) => {
                others.push(e.0.clone());
                stopped.get_or_insert(e);
            }
        }
    }
    let overlapped = timings
        .iter()
        .enumerate()
        .filter(|(i, t)| {
            timings
                .iter()
                .enumerate()
                .any(|(j, u)| j != *i && t.overlaps(u))
        })
        .count();
    // Answers that only a duplicate in flight with the first gets.
    let concurrent_replays = match first_execution {
        Some(first) => replays
            .iter()
            .flatten()
            .filter(|t| t.overlaps(&first))
            .count(),
        None => 0,
    };
    let telling = conflicts.len() + concurrent_replays;
    if overlapped < 2 && telling == 0 {
        if let Some(stop) = stopped {
            return Err(stop);
        }
        p.check(
            "requests in flight together",
            Status::NotApplicable,
            "not tested: no two requests were in flight together",
        );
        p.check(
            "requests in flight together",
            Status::NotApplicable,
            format!(
                "{} sent with their last bytes held, then released at once, yet each was \
                 answered before the next was sent: the API answers before reading a \
                 whole request, or one at a time",
                count(n as usize, "request was", "requests were")
            ),
        );
        return Ok(());
    }
    let what = if p.s.target.id_pointer.is_some() {
        ("distinct resource id", "distinct resource ids")
    } else {
        ("distinct body", "distinct bodies")
    };
    let mut overlap = format!("{} of {n} in flight together", overlapped);
    if telling > 0 {
        let mut evidence = Vec::new();
        if !conflicts.is_empty() {
            evidence.push(count(conflicts.len(), "409", "409s"));
        }
        if concurrent_replays > 0 {
            evidence.push(count(
                concurrent_replays,
                "replay answered while the first was in flight",
                "replays answered while the first was in flight",
            ));
        }
        overlap.push_str(&format!(" ({})", evidence.join(", ")));
    }
    let many = executions.len() > 1;
    p.judge(
        "one execution",
        !many,
        format!(
            "{} with one key, {overlap}: {} among the 2xx answers{}{}",
            count(n as usize, "parallel request", "parallel requests"),
            count(executions.len(), what.0, what.1),
            if many {
                format!(
                    " ({})",
                    executions
                        .iter()
                        .take(5)
                        .map(|e| short(e, 40))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                String::new()
            },
            if p.s.target.id_pointer.is_none() {
                " (no --id-pointer)"
            } else {
                ""
            },
        ),
    );
    if many {
        p.check(
            "the others wait, get 409 or the replay",
            Status::NotApplicable,
            format!(
                "not judged: the requests executed {}",
                count(executions.len(), "time", "times")
            ),
        );
    } else {
        p.judge(
            "the others wait, get 409 or the replay",
            others.is_empty(),
            format!(
                "{} 409{}",
                count(conflicts.len(), "answer was", "answers were"),
                if others.is_empty() {
                    String::new()
                } else {
                    format!("; other outcomes: {}", others.join(", "))
                }
            ),
        );
    }
    match conflicts.iter().find_map(|a| {
        let j = p.opts.profile.judge(Refusal::InProgress, a);
        (!j.ok).then_some(j)
    }) {
        Some(j) => p.judge(
            "a 409 is the profile's answer for a request in progress",
            false,
            j.detail,
        ),
        None if !conflicts.is_empty() => p.judge(
            "a 409 is the profile's answer for a request in progress",
            true,
            format!(
                "{} as --profile {} has it ({})",
                count(conflicts.len(), "409 is", "409s are"),
                p.opts.profile.as_str(),
                p.opts.profile.expected(Refusal::InProgress)
            ),
        ),
        None => {}
    }
    if let Some(stop) = stopped {
        return Err(stop);
    }
    // Once the attempt is over, the key answers with the one execution.
    if !many {
        let after = p.settled("after the parallel requests", &req).await?;
        let identity = identity(p, &after);
        let ok = after.accepted() && executions.first().is_none_or(|e| *e == identity);
        p.judge(
            "a later request gets that execution",
            ok,
            format!("status {}, {}", after.status, short(&identity, 80)),
        );
    }
    Ok(())
}

/// What tells one execution's answer from another's: its id, else its body.
fn identity(p: &Probe<'_>, a: &Answer) -> String {
    match p.id_of(a) {
        Some(id) => format!("id {id}"),
        None if p.s.target.id_pointer.is_some() => "no id".to_owned(),
        None => format!("body {}", p.body_identity(a)),
    }
}

/// The answer of a request is lost: the retry gets the execution that happened.
pub(super) async fn lost_answer(p: &mut Probe<'_>) -> Result<(), Stop> {
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

/// The same key with another body: refused as the profile says (422 under ietf).
pub(super) async fn payload_mismatch(p: &mut Probe<'_>) -> Result<(), Stop> {
    let key = new_key();
    let a = p.first(&key).await?;
    let changed = changed_body(&p.s.target.body, &p.s.target.kind);
    let b = p
        .send(
            "the same key, a changed body",
            &Req::keyed(&key).with_body(changed),
        )
        .await?;
    let profile = p.opts.profile;
    let judged = profile.judge(Refusal::Mismatch, &b);
    let mut detail = judged.detail;
    // A refusal that is a 2xx (`mcp`: a JSON-RPC error) is no execution.
    if b.accepted() && !judged.ok {
        match (p.id_of(&a), p.id_of(&b)) {
            (Some(x), Some(y)) if x != y => {
                p.executed_again = true;
                detail.push_str(&format!(": it executed again (id {x}, then {y})"));
            }
            _ if !p.same_body(&a, &b) => detail.push_str(": a new answer (it executed again?)"),
            _ => detail.push_str(": the first answer, replayed for another payload"),
        }
    }
    p.judge(
        &format!("a changed body is {}", profile.status(Refusal::Mismatch)),
        judged.ok,
        detail,
    );
    Ok(())
}

/// A body that differs from `body` as a request, not only in spelling, and is still of
/// its kind: JSON stays JSON, a form stays a form.
pub(super) fn changed_body(body: &Bytes, kind: &BodyKind) -> Bytes {
    match kind {
        BodyKind::Json(Value::Object(map)) => {
            let mut map = map.clone();
            map.insert("idem_check_changed".to_owned(), Value::Bool(true));
            // A JSON-RPC tool call is fingerprinted by its arguments, not its envelope
            // (MCP, SPEC S24): they change too.
            if let Some(Value::Object(arguments)) =
                map.get_mut("params").and_then(|p| p.get_mut("arguments"))
            {
                arguments.insert("idem_check_changed".to_owned(), Value::Bool(true));
            }
            Bytes::from(Value::Object(map).to_string())
        }
        BodyKind::Json(other) => {
            Bytes::from(serde_json::json!([other, "idem-check: changed"]).to_string())
        }
        BodyKind::Form => Bytes::from(form::changed(body)),
        BodyKind::Other => {
            let mut v = body.to_vec();
            v.extend_from_slice(b"\nidem-check: changed");
            Bytes::from(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_calls_arguments_change_too() {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "pay", "arguments": {"amount": 5}}});
        let body = Bytes::from(call.to_string());
        let changed = changed_body(&body, &BodyKind::Json(call));
        let changed: Value = serde_json::from_slice(&changed).unwrap();
        assert_eq!(changed["params"]["arguments"]["idem_check_changed"], true);
        assert_eq!(changed["params"]["arguments"]["amount"], 5);
    }

    #[test]
    fn changed_body_differs_as_json() {
        let v: Value = serde_json::from_str(r#"{"amount":5}"#).unwrap();
        let changed = changed_body(
            &Bytes::from_static(br#"{"amount":5}"#),
            &BodyKind::Json(v.clone()),
        );
        let back: Value = serde_json::from_slice(&changed).unwrap();
        assert_ne!(back, v);
        assert_eq!(back["amount"], 5);
    }

    #[test]
    fn changed_body_of_a_form_is_a_form() {
        let changed = changed_body(
            &Bytes::from_static(b"amount=500&currency=eur"),
            &BodyKind::Form,
        );
        assert_eq!(
            &changed[..],
            b"amount=500&currency=eur&idem_check_changed=1"
        );
    }
}
