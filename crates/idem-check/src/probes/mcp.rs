//! The probes of `--profile mcp`: what a tool call's replay answers with, and what
//! makes two calls the same one (SPEC S24). Every request already carries a fresh
//! JSON-RPC `id` of its own (see `rpc`).

use bytes::Bytes;
use serde_json::Value;

use super::super::client::{BodyKind, Req, Stop, new_key};
use super::super::profile::{Expectations, Refusal};
use super::super::rpc;
use super::Status;
use super::probe::Probe;
use super::requests::without_replay;

/// Says the probe does not apply when the `--body` has no top-level `id`: no JSON-RPC
/// request, so there is no id to answer.
fn without_rpc_id(p: &mut Probe<'_>, check: &str) -> bool {
    if rpc::with_id(&p.s.target.body, 0).is_some() {
        return false;
    }
    p.check(
        check,
        Status::NotApplicable,
        "the --body is no JSON-RPC request with an id (e.g. {\"jsonrpc\":\"2.0\",\"id\":1,\
         \"method\":\"tools/call\",…})",
    );
    true
}

/// The replay of a tool call answers with the retry's own `id`, whether the answer is
/// JSON or an event stream: a client waits for the id it sent.
pub(super) async fn replay_id(p: &mut Probe<'_>) -> Result<(), Stop> {
    const CHECK: &str = "the replay carries the retry's own id";
    if without_rpc_id(p, CHECK) || without_replay(p, CHECK, "the id of a replay") {
        return Ok(());
    }
    let key = new_key();
    let a = p.first(&key).await?;
    let b = p
        .settled("the same call, same key, a new id", &Req::keyed(&key))
        .await?;
    if !p.same_execution("replay", &a, &b) {
        return Ok(());
    }
    let (Some(sent), framing) = (b.request_id, rpc::framing(&b)) else {
        return Err(Stop("the retry was sent without an id".to_owned()));
    };
    let (ok, detail) = match rpc::answered_id(&b) {
        Some(got) if got == sent => (
            true,
            format!(
                "the replay answered id {sent} to a request with id {sent} ({})",
                framing.shown()
            ),
        ),
        Some(got) => (
            false,
            format!(
                "the replay answered id {got} to a request with id {sent}: an MCP client \
                 waits for its own id and hangs ({})",
                framing.shown()
            ),
        ),
        None => (
            false,
            format!(
                "the replay carries no JSON-RPC response to the request with id {sent} ({})",
                framing.shown()
            ),
        ),
    };
    p.judge(CHECK, ok, detail);
    Ok(())
}

/// A call whose envelope changes (a new `id`, another `_meta.progressToken`) but whose
/// arguments do not is the same call, answered from the record; changed arguments are
/// refused.
pub(super) async fn envelope(p: &mut Probe<'_>) -> Result<(), Stop> {
    const SAME: &str = "a new id and progressToken are the same call";
    const CHANGED: &str = "changed arguments are refused";
    let BodyKind::Json(call) = p.s.target.kind.clone() else {
        p.check(SAME, Status::NotApplicable, "the --body is no JSON");
        return Ok(());
    };
    if without_rpc_id(p, SAME) {
        return Ok(());
    }
    let key = new_key();
    let a = p.first(&key).await?;
    if !without_replay(p, SAME, "whether a new envelope is the same call") {
        let other = Req::keyed(&key).with_body(new_progress_token(&call));
        let b = p
            .settled("the same call, a new id and progressToken", &other)
            .await?;
        let refused = p.opts.profile.judge(Refusal::Mismatch, &b);
        if refused.ok {
            p.judge(
                SAME,
                false,
                format!(
                    "refused as another payload ({}): the API fingerprints the envelope, \
                     not the call's method, tool and arguments",
                    refused.detail
                ),
            );
        } else {
            p.same_execution(SAME, &a, &b);
        }
    }
    match changed_arguments(&call) {
        Some(body) => {
            let c = p
                .send(
                    "the same key, changed arguments, the same envelope",
                    &Req::keyed(&key).with_body(body),
                )
                .await?;
            let judged = p.opts.profile.judge(Refusal::Mismatch, &c);
            p.judge(CHANGED, judged.ok, judged.detail);
        }
        None => p.check(
            CHANGED,
            Status::NotApplicable,
            "the --body has no params.arguments object to change",
        ),
    }
    Ok(())
}

/// `call` with a fresh `params._meta.progressToken` (`params` and `_meta` made when
/// missing), re-serialised: a new envelope for the same call.
fn new_progress_token(call: &Value) -> Bytes {
    let mut call = call.clone();
    if let Value::Object(top) = &mut call {
        let params = top
            .entry("params")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(params) = params {
            let meta = params
                .entry("_meta")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Value::Object(meta) = meta {
                meta.insert("progressToken".to_owned(), Value::String(new_key()));
            }
        }
    }
    Bytes::from(call.to_string())
}

/// `call` with one member added to `params.arguments` and nothing else changed,
/// re-serialised; `None` when it has no such object.
fn changed_arguments(call: &Value) -> Option<Bytes> {
    let mut call = call.clone();
    call.pointer_mut("/params/arguments")?
        .as_object_mut()?
        .insert("idem_check_changed".to_owned(), Value::Bool(true));
    Some(Bytes::from(call.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_envelope_changes_only_the_progress_token() {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "pay", "arguments": {"amount": 5},
                "_meta": {"progressToken": 1, "idempotency-key": "k"}}});
        let other: Value = serde_json::from_slice(&new_progress_token(&call)).unwrap();
        let token = other["params"]["_meta"]["progressToken"].as_str().unwrap();
        assert!(token.starts_with("idem-check-"), "{token}");
        let mut back = other.clone();
        back["params"]["_meta"]["progressToken"] = Value::from(1);
        assert_eq!(back, call, "nothing else changed");
        // No `_meta` (nor `params`): one is made.
        let bare = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"});
        let other: Value = serde_json::from_slice(&new_progress_token(&bare)).unwrap();
        assert!(other["params"]["_meta"]["progressToken"].is_string());
    }

    #[test]
    fn changed_arguments_change_nothing_else() {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "pay", "arguments": {"amount": 5}}});
        let changed: Value = serde_json::from_slice(&changed_arguments(&call).unwrap()).unwrap();
        assert_eq!(changed["params"]["arguments"]["idem_check_changed"], true);
        let mut back = changed.clone();
        back["params"]["arguments"]
            .as_object_mut()
            .unwrap()
            .remove("idem_check_changed");
        assert_eq!(back, call);
        assert!(changed_arguments(&serde_json::json!({"id": 1})).is_none());
    }
}
