use super::reply::{with_id, with_id_in_events};
use super::*;

fn pending(header: Option<&str>, pointer: Option<&str>, required: bool) -> PendingCall {
    PendingCall {
        header_key: Ok(header.map(|k| Key::new(k).unwrap())),
        pointer: pointer.map(Arc::from),
        methods: Arc::from([Box::from("tools/call")]),
        missing: required.then(|| Problem::new(ProblemKind::MissingKey, "send one")),
        refusal: None,
    }
}

fn call(id: &str, key: &str, arguments: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"pay","arguments":{arguments},"_meta":{{"idempotency-key":"{key}","progressToken":{id}}}}}}}"#
    )
}

fn refused(read: Read) -> (ProblemKind, Option<String>) {
    match read {
        Read::Refused(problem, id) => (problem.kind(), id.map(|i| i.as_str().to_owned())),
        other => panic!("refused, not {other:?}"),
    }
}

#[test]
fn a_tool_call_is_keyed_by_its_meta_key_and_fingerprinted_without_id_or_meta() {
    let Read::Call(first) =
        pending(None, None, false).read(call("1", "K1", r#"{"a":1}"#).as_bytes())
    else {
        panic!("a call")
    };
    assert_eq!(first.key.as_str(), "K1");
    assert_eq!(first.id.as_str(), "1");
    let Read::Call(retry) =
        pending(None, None, false).read(call("\"x-2\"", "K1", r#"{ "a" : 1 }"#).as_bytes())
    else {
        panic!("a call")
    };
    assert_eq!(retry.id.as_str(), "\"x-2\"");
    let normal = |doc: &[u8]| {
        idem_core::Fingerprint::compute(
            "POST",
            "POST /mcp",
            Some("application/json"),
            doc,
            &Default::default(),
        )
    };
    assert_eq!(normal(&first.document), normal(&retry.document));
    let Read::Call(other) =
        pending(None, None, false).read(call("3", "K1", r#"{"a":2}"#).as_bytes())
    else {
        panic!("a call")
    };
    assert_ne!(normal(&first.document), normal(&other.document));
}

#[test]
fn other_messages_pass_whatever_key_they_carry() {
    let mut broken = pending(None, None, true);
    broken.header_key = Err("not a key".into());
    let init = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"_meta":{"idempotency-key":"K"}}}"#;
    assert!(matches!(broken.read(init), Read::Unkeyed));
    let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert!(matches!(
        pending(None, None, true).read(note),
        Read::Unkeyed
    ));
    let response = br#"{"jsonrpc":"2.0","id":4,"result":{}}"#;
    assert!(matches!(
        pending(None, None, true).read(response),
        Read::Unkeyed
    ));
    let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#;
    assert!(matches!(
        pending(None, None, true).read(batch),
        Read::Unkeyed
    ));
    // Without a key, on a route that does not require one.
    let bare = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#;
    assert!(matches!(
        pending(None, None, false).read(bare),
        Read::Unkeyed
    ));
    assert_eq!(
        refused(pending(None, None, true).read(bare)),
        (ProblemKind::MissingKey, Some("1".into()))
    );
}

#[test]
fn what_could_be_a_keyed_call_and_cannot_be_read_is_refused() {
    let read = |body: &[u8]| refused(pending(None, None, false).read(body));
    assert_eq!(read(b"{not json"), (ProblemKind::UnreadableJson, None));
    assert_eq!(read(b""), (ProblemKind::InvalidJsonRpc, None));
    let batch = format!("[{}]", call("1", "K", "{}"));
    assert_eq!(read(batch.as_bytes()), (ProblemKind::InvalidJsonRpc, None));
    let escaped = br#"[{"jsonrpc":"2.0","id":1,"method":"tools\/call"}]"#;
    assert_eq!(read(escaped), (ProblemKind::InvalidJsonRpc, None));
    let null_id = call("null", "K", "{}");
    assert_eq!(
        read(null_id.as_bytes()),
        (ProblemKind::InvalidJsonRpc, None)
    );
    let no_id =
        br#"{"jsonrpc":"2.0","method":"tools/call","params":{"_meta":{"idempotency-key":"K"}}}"#;
    assert_eq!(read(no_id), (ProblemKind::InvalidJsonRpc, None));
    let twice = br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call"}"#;
    assert_eq!(read(twice), (ProblemKind::InvalidJsonRpc, None));
    let repeated_arg = call("5", "K", r#"{"a":1,"a":2}"#);
    assert_eq!(
        read(repeated_arg.as_bytes()),
        (ProblemKind::InvalidJsonRpc, Some("5".into()))
    );
    let bad_params = br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":[1]}"#;
    assert_eq!(
        read(bad_params),
        (ProblemKind::InvalidJsonRpc, Some("6".into()))
    );
    let number_key = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"_meta":{"idempotency-key":5}}}"#;
    assert_eq!(
        read(number_key),
        (ProblemKind::InvalidKey, Some("7".into()))
    );
}

#[test]
fn keys_from_meta_the_pointer_and_the_header_must_agree() {
    let body = |arg_key: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"pay","arguments":{{"idempotency_key":"{arg_key}"}},"_meta":{{"idempotency-key":"K1"}}}}}}"#
        )
    };
    let pointer = Some("/params/arguments/idempotency_key");
    let Read::Call(c) = pending(Some("K1"), pointer, true).read(body("K1").as_bytes()) else {
        panic!("agreeing keys make a call")
    };
    assert_eq!(c.key.as_str(), "K1");
    assert_eq!(
        refused(pending(None, pointer, true).read(body("K2").as_bytes())),
        (ProblemKind::InvalidKey, Some("9".into()))
    );
    assert_eq!(
        refused(pending(Some("K2"), None, true).read(body("K1").as_bytes())),
        (ProblemKind::InvalidKey, Some("9".into()))
    );
    let only_arg = br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"arguments":{"idempotency_key":"K3"}}}"#;
    let Read::Call(c) = pending(None, pointer, true).read(only_arg) else {
        panic!("a key in the arguments")
    };
    assert_eq!((c.key.as_str(), c.id.as_str()), ("K3", "\"a\""));
}

#[test]
fn a_replay_carries_the_retrys_id_and_nothing_else_changes() {
    let recorded =
        br#"{"jsonrpc":"2.0", "id" : 1 ,"result":{"content":[{"type":"text","text":"id: 1"}]}}"#;
    let out = with_id(recorded, "\"retry-7\"").unwrap();
    assert_eq!(
        out,
        br#"{"jsonrpc":"2.0", "id" : "retry-7" ,"result":{"content":[{"type":"text","text":"id: 1"}]}}"#
    );
    assert_eq!(
        with_id(br#"{"result":1,"id":2.0}"#, "3").unwrap(),
        br#"{"result":1,"id":3}"#
    );
    let error = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"m"}}"#;
    assert_eq!(
        with_id(error, "4").unwrap(),
        br#"{"jsonrpc":"2.0","id":4,"error":{"code":-32000,"message":"m"}}"#
    );
    // What is no JSON-RPC response (an upstream's HTTP error) is left as it is.
    assert_eq!(with_id(b"Internal Server Error", "4"), None);
    assert_eq!(with_id(br#"{"id":1,"method":"ping"}"#, "4"), None);
    assert_eq!(with_id(br#"[{"id":1,"result":{}}]"#, "4"), None);
}

#[test]
fn an_event_streams_responses_carry_the_retrys_id() {
    let stream = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"id\":1}}\r\n\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\r\n\r\n";
    let out = with_id_in_events(stream, "12").unwrap();
    let expected = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"id\":1}}\r\n\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":12,\"result\":{}}\r\n\r\n";
    assert_eq!(
        String::from_utf8(out).unwrap(),
        String::from_utf8(expected.to_vec()).unwrap()
    );
    let split = b"data: {\"jsonrpc\":\"2.0\",\ndata:\"id\":\"a\",\ndata: \"result\":{}}\n\n";
    let out = with_id_in_events(split, "\"b\"").unwrap();
    assert_eq!(
        out,
        b"data: {\"jsonrpc\":\"2.0\",\ndata:\"id\":\"b\",\ndata: \"result\":{}}\n\n"
    );
    assert_eq!(with_id_in_events(b": ping\n\n", "1"), None);
}
