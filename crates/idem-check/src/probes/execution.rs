//! The probes of what executes: a replay, concurrent duplicates, a lost answer and a
//! reused key with another payload.

use bytes::Bytes;
use serde_json::Value;

use super::super::client::{Req, Stop, new_key};
use super::probe::{Probe, short};

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

/// N parallel requests with one key: exactly one execution.
pub(super) async fn concurrent_duplicates(p: &mut Probe<'_>, n: u32) -> Result<(), Stop> {
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

/// The same key with another body: 422.
pub(super) async fn payload_mismatch(p: &mut Probe<'_>) -> Result<(), Stop> {
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

/// A body that differs from `body` as a request, not only in spelling.
pub(super) fn changed_body(body: &Bytes, json: Option<&Value>) -> Bytes {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_body_differs_as_json() {
        let v: Value = serde_json::from_str(r#"{"amount":5}"#).unwrap();
        let changed = changed_body(&Bytes::from_static(br#"{"amount":5}"#), Some(&v));
        let back: Value = serde_json::from_slice(&changed).unwrap();
        assert_ne!(back, v);
        assert_eq!(back["amount"], 5);
    }
}
