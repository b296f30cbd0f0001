//! The gateway page's walkthrough (`docs/src/gateway/index.md`), run against the binary:
//! each answer the page shows is the answer the gateway gives. A reader copies these
//! bodies into client code and alerting rules, so a member the page leaves out (the
//! `request_id` of every problem) or a detail worded otherwise is a defect of the page.

use std::path::Path;
use std::time::Duration;

use idem_test_support::eventually;
use serde_json::Value;

use crate::common::{Answer, Gateway, Http};

/// One answer as the page shows it: the status line, the headers shown (a subset of the
/// real ones), the body.
#[derive(Debug)]
struct Shown {
    status_line: String,
    headers: Vec<(String, String)>,
    body: String,
}

/// The answers the page shows, in order: each fenced block that opens with `HTTP/1.1`.
fn shown_answers() -> Vec<Shown> {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/gateway/index.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let mut answers = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        if !info.is_empty() {
            continue;
        }
        let Some((status_line, rest)) = block.split_first() else {
            continue;
        };
        if !status_line.starts_with("HTTP/1.1 ") {
            continue;
        }
        let blank = rest.iter().position(|l| l.is_empty()).unwrap_or(rest.len());
        let headers = rest[..blank]
            .iter()
            .map(|h| {
                let (name, value) = h.split_once(": ").unwrap_or_else(|| panic!("{h:?}"));
                (name.to_owned(), value.to_owned())
            })
            .collect();
        let body = rest.get(blank + 1..).unwrap_or_default().join("\n");
        answers.push(Shown {
            status_line: status_line.to_string(),
            headers,
            body,
        });
    }
    answers
}

/// Headers whose value differs from run to run: the page shows that they are there.
const VARYING: &[&str] = &["x-request-id", "retry-after", "date"];

/// Asserts that `real` is the answer `shown` shows: the same status, every header shown
/// with its value, and the same body (a problem's `request_id` present in both, its
/// value made afresh for each request).
fn assert_shown(step: &str, shown: &Shown, real: &Answer) {
    let code = shown.status_line.split(' ').nth(1).unwrap();
    assert_eq!(
        code,
        real.status.to_string(),
        "{step}: {shown:?} vs {real:?}"
    );
    for (name, value) in &shown.headers {
        let got = real
            .header(name)
            .unwrap_or_else(|| panic!("{step}: the page shows {name}, the gateway sent none"));
        if !VARYING.contains(&name.as_str()) {
            assert_eq!(got, value, "{step}: header {name}");
        }
    }
    let mut page: Value = serde_json::from_str(&shown.body)
        .unwrap_or_else(|e| panic!("{step}: the page's body is not JSON ({e}): {}", shown.body));
    let mut sent = real.json();
    if sent.get("request_id").is_some() || page.get("request_id").is_some() {
        for (what, body) in [("the page's", &mut page), ("the gateway's", &mut sent)] {
            let id = body
                .as_object_mut()
                .unwrap()
                .remove("request_id")
                .unwrap_or_else(|| panic!("{step}: {what} body has no request_id"));
            assert!(id.as_str().is_some_and(|s| !s.is_empty()), "{step}: {id}");
        }
    }
    assert_eq!(page, sent, "{step}: the body the page shows");
}

/// Steps 1 to 4: a first request, its replay, the key reused with another payload (422),
/// and a duplicate while the first attempt runs (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_pages_walkthrough_shows_what_the_gateway_answers() {
    let shown = shown_answers();
    assert!(
        shown.len() >= 4,
        "the walkthrough's four answers: {shown:?}"
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let api = tokio::spawn(async move {
        axum::serve(listener, idem_gateway::demo::router())
            .await
            .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &upstream,
        dir.path(),
        &["--admin", "127.0.0.1:0", "--admin-open"],
    )
    .await;
    let http = Http::new();
    let charges = gw.url("/v1/charges");
    let alice = [("authorization", "Bearer sk_test_alice")];
    let key = "8e03978e-40d5-43e8-bc93-6894a57f9324";

    let first = http
        .post(&charges, key, r#"{"amount":1200,"currency":"eur"}"#, &alice)
        .await;
    assert_shown("1. a first request", &shown[0], &first);
    let replay = http
        .post(
            &charges,
            key,
            r#"{ "currency": "eur", "amount": 1200 }"#,
            &alice,
        )
        .await;
    assert_shown("2. a replay", &shown[1], &replay);
    let reused = http
        .post(&charges, key, r#"{"amount":9900,"currency":"eur"}"#, &alice)
        .await;
    assert_shown("3. a 422", &shown[2], &reused);

    let slow = format!("{charges}?delay_ms=5000");
    let key = "2c1f6a0e-0d7b-4c59-9a57-52f1f3c4b6d1";
    let first = tokio::spawn({
        let (http, slow) = (http.clone(), slow.clone());
        async move { http.post(&slow, key, r#"{"amount":500}"#, &[]).await }
    });
    // The duplicate goes once the first attempt holds the key.
    let record = gw.admin_url(&format!("/keys?key={key}&endpoint=POST%20/v1/charges"));
    eventually(
        "the first attempt holds the key",
        Duration::from_secs(10),
        async || http.send("GET", &record, &[], "").await.status == 200,
    )
    .await;
    let duplicate = http.post(&slow, key, r#"{"amount":500}"#, &[]).await;
    assert_shown("4. a 409", &shown[3], &duplicate);
    assert_eq!(first.await.unwrap().status, 201);

    gw.terminate().await;
    api.abort();
}
