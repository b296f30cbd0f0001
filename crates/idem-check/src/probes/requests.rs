//! The probes of what makes a request the same one: the key's spelling, equivalent
//! JSON, the tenant, and the headers a replay carries.

use std::time::Duration;

use serde_json::Value;

use super::super::client::{BodyKind, Req, Stop, new_key};
use super::super::form;
use super::super::profile::{Expectations, Refusal};
use super::Status;
use super::probe::Probe;

/// When the replay probe saw a retry execute again, the probes that compare a request
/// with its replay have nothing to compare: says so, and whether that is the case.
pub(super) fn without_replay(p: &mut Probe<'_>, check: &str, what: &str) -> bool {
    if p.opts.replay_holds {
        return false;
    }
    p.check(
        check,
        Status::NotApplicable,
        format!("replay does not hold, so {what} cannot be judged (see the replay probe)"),
    );
    true
}

/// Malformed keys are 400; the quoted and bare forms are one key; a required key.
pub(super) async fn keys(p: &mut Probe<'_>) -> Result<(), Stop> {
    let profile = p.opts.profile;
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
        let judged = profile.judge(Refusal::MalformedKey, &a);
        p.judge(check, judged.ok, format!("{label}: {}", judged.detail));
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
    if p.opts.require_key {
        let a = p.send("no Idempotency-Key", &Req::default()).await?;
        let judged = profile.judge(Refusal::MissingKey, &a);
        p.judge(
            "a missing key is 400 (--require-key)",
            judged.ok,
            format!("no key: {}", judged.detail),
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

/// The same body in other bytes is the same request: JSON with its keys reordered and
/// other whitespace, or a form with its parameters reordered and a character
/// percent-encoded.
pub(super) async fn equivalent_json(p: &mut Probe<'_>) -> Result<(), Stop> {
    let (check, label, other) = match &p.s.target.kind {
        BodyKind::Json(json) => {
            let mut other = String::new();
            write_reordered(json, 0, &mut other);
            (
                "equivalent JSON is the same request",
                "the same JSON, keys reordered, other whitespace",
                other.into_bytes(),
            )
        }
        BodyKind::Form => (
            "an equivalent form is the same request",
            "the same form, parameters reordered, a character percent-encoded",
            form::equivalent(&p.s.target.body),
        ),
        BodyKind::Other => {
            p.check(
                "an equivalent body is the same request",
                Status::NotApplicable,
                "the body is neither JSON nor a form",
            );
            return Ok(());
        }
    };
    if without_replay(p, check, "an equivalent body's replay") {
        return Ok(());
    }
    let key = new_key();
    let a = p.first(&key).await?;
    let b = p.settled(label, &Req::keyed(&key).with_body(other)).await?;
    let mismatch = p.opts.profile.status(Refusal::Mismatch);
    if b.status == mismatch && !b.accepted() {
        p.judge(
            check,
            false,
            format!("answered {mismatch}: the API compares the body's bytes, not what they mean"),
        );
    } else {
        p.same_execution(check, &a, &b);
    }
    Ok(())
}

/// The same key under another tenant never gets the first tenant's answer.
pub(super) async fn tenants(p: &mut Probe<'_>) -> Result<(), Stop> {
    let Some((name, _)) = p.s.target.other_tenant.clone() else {
        p.check(
            "another tenant never gets this tenant's answer",
            Status::NotApplicable,
            "not checked: pass --other-tenant-header with another tenant's credential",
        );
        return Ok(());
    };
    if without_replay(
        p,
        "another tenant never gets this tenant's answer",
        "whether another tenant gets this tenant's answer",
    ) {
        return Ok(());
    }
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
        _ => a.status == b.status && p.same_body(&a, &b),
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
    } else if b.status == 409 || b.status == p.opts.profile.status(Refusal::Mismatch) {
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
pub(super) async fn replayed_headers(p: &mut Probe<'_>) -> Result<(), Stop> {
    if without_replay(p, "no replay to inspect", "the headers of a replay") {
        return Ok(());
    }
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
        _ => a.status == b.status && p.same_body(&a, &b),
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
    // ACP echoes the key on its answers: reported, never required.
    if p.opts.profile == super::super::profile::Profile::Acp {
        match b.header("idempotency-key") {
            Some(echo) if echo.trim().trim_matches('"') == key => p.check(
                "Idempotency-Key echoed (acp)",
                Status::Pass,
                "the replay echoes the Idempotency-Key",
            ),
            _ => p.check(
                "Idempotency-Key echoed (acp)",
                Status::NotApplicable,
                "the replay does not echo the Idempotency-Key (ACP APIs do; not required)",
            ),
        }
    }
    Ok(())
}

/// Writes `v` as JSON with every object's keys in reverse order, spaces around the
/// punctuation and one member a line: the same JSON in other bytes.
pub(super) fn write_reordered(v: &Value, depth: usize, out: &mut String) {
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
}
