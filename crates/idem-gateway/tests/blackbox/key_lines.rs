//! From a customer's key to its log lines (issue 54 §7): `idem keys show` prints the
//! scope digest that the access log names the request by, and at debug level
//! (`IDEM_LOG=idem_gateway=debug`) one line carries the key beside that digest; no line
//! at info or above carries the key.

use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, idem_in, new_key};

/// The value of `field="…"` in a text log line.
fn quoted<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {field}=\""))? + field.len() + 3;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// Waits (bounded) for a line of the gateway's log that `pick` accepts.
async fn line(gw: &Gateway, pick: impl Fn(&str) -> bool) -> String {
    for _ in 0..400 {
        if let Some(l) = gw.logs().lines().find(|l| pick(l)) {
            return l.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no such line:\n{}", gw.logs());
}

#[tokio::test]
async fn keys_show_prints_the_scope_the_access_log_and_the_debug_line_name() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The harness logs at `info,idem_gateway=debug`, text, to the default SQLite store.
    let gw = Gateway::start(&up.url(), dir.path(), &[]).await;
    let key = new_key();
    let answer = Http::new()
        .post(&gw.url("/v1/charges"), &key, "{\"amount\":1}", &[])
        .await;
    assert_eq!(answer.status, 201);
    let request_id = answer.header("x-request-id").unwrap().to_owned();

    let access = line(&gw, |l| {
        l.contains("idem::access") && quoted(l, "request_id") == Some(&request_id)
    })
    .await;
    let scope = quoted(&access, "scope").expect("the access line names the scope");
    assert!(
        !access.contains(&key),
        "the access line never carries the key"
    );

    let debug = line(&gw, |l| l.contains("keyed request") && l.contains(&key)).await;
    assert!(debug.contains(" DEBUG "), "{debug}");
    assert_eq!(quoted(&debug, "key"), Some(key.as_str()), "{debug}");
    assert_eq!(quoted(&debug, "scope"), Some(scope), "{debug}");
    assert_eq!(quoted(&debug, "request_id"), Some(request_id.as_str()));
    assert_eq!(quoted(&debug, "endpoint"), Some("POST /v1/charges"));
    assert_eq!(quoted(&debug, "outcome"), Some("executed"));
    for l in gw.logs().lines().filter(|l| l.contains(&key)) {
        assert!(l.contains(" DEBUG "), "a key only at debug level: {l}");
    }

    let out = idem_in(
        dir.path(),
        &["keys", "show", &key, "--endpoint", "POST /v1/charges"],
    );
    assert!(out.status.success(), "{out:?}");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["key"], key.as_str());
    assert_eq!(
        shown["scope"], scope,
        "keys show prints the digest the access log names"
    );
    gw.terminate().await;
}
