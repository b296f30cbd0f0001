//! Tests of `report.rs`.

use super::*;
use crate::client::evidence::{ShownRequest, ShownResponse};
use crate::probes::Check;

/// A report whose evidence holds everything the renderers must escape.
fn hostile() -> Report {
    let exchange = Exchange {
        label: "first request".to_owned(),
        request: ShownRequest {
            method: "POST".to_owned(),
            url: "http://127.0.0.1:1/v1/charges?a=1&b=<2>".to_owned(),
            headers: vec![
                ("idempotency-key".to_owned(), "k\tx".to_owned()),
                ("authorization".to_owned(), "[redacted]".to_owned()),
            ],
            body: "{\"note\":\"```|</details>\"}".to_owned(),
        },
        response: Some(ShownResponse {
            status: 201,
            headers: vec![("content-type".to_owned(), "text/html".to_owned())],
            body: "<b>\"done\" & 'dusted'</b>\u{1}\u{1b}]]>````".to_owned(),
        }),
        error: None,
        timing: Some(crate::client::Timing {
            sent_us: 1500,
            answered_us: Some(2500),
        }),
    };
    let probe = ProbeReport {
        id: "replay",
        name: "Replay",
        status: Status::Fail,
        summary: "replay: same body: a | b <script>\nsecond line `x`".to_owned(),
        checks: vec![Check {
            name: "replay: same body".to_owned(),
            status: Status::Fail,
            detail: "**bold** | <i>".to_owned(),
        }],
        exchanges: vec![exchange],
        duration_ms: 1234,
        tests: "the same request with the same key is answered from the record",
        executed_again: false,
    };
    let skipped = ProbeReport {
        id: "tenants",
        name: "Tenants",
        status: Status::NotApplicable,
        summary: "pass --other-tenant-header \"x\"".to_owned(),
        checks: vec![],
        exchanges: vec![],
        duration_ms: 0,
        tests: "another tenant",
        executed_again: false,
    };
    Report::new(
        "POST",
        "http://127.0.0.1:1/v1/charges",
        2,
        vec![probe, skipped],
    )
}

#[test]
fn markdown_escapes_table_cells_and_fences_the_evidence() {
    let md = markdown(&hostile());
    let row = md.lines().find(|l| l.starts_with("| Replay |")).unwrap();
    // Four cell separators and no more: the summary's `|` and line break are escaped.
    assert_eq!(row.matches('|').count(), 4, "{row}");
    assert!(
        row.contains("&#124;") && row.contains("&lt;script&gt;"),
        "{row}"
    );
    assert!(!row.contains('`'), "{row}");
    assert!(md.contains("\\*\\*bold\\*\\* &#124; &lt;i&gt;"), "{md}");
    // The body holds a run of four backticks: every fence is longer.
    let fences: Vec<&str> = md.lines().filter(|l| l.starts_with("```")).collect();
    assert!(!fences.is_empty());
    assert!(fences.iter().all(|f| f.starts_with("`````")), "{fences:?}");
    // The evidence's `</details>` stays inside a fence, so exactly one closes each probe.
    let closing = md.lines().filter(|l| *l == "</details>").count();
    assert_eq!(closing, 2, "{md}");
    assert!(
        md.contains("k\\tx"),
        "the tab of a key is shown as an escape: {md}"
    );
}

#[test]
fn junit_escapes_evidence_into_well_formed_xml() {
    let xml_text = junit(&hostile());
    assert!(
        xml_text.contains(r#"tests="2" failures="1" skipped="1""#),
        "{xml_text}"
    );
    assert_eq!(xml_text.matches("<testcase ").count(), 2);
    assert!(xml_text.contains("<skipped message=\"pass --other-tenant-header &quot;x&quot;\"/>"));
    assert!(xml_text.contains("&lt;b&gt;&quot;done&quot; &amp; &apos;dusted&apos;&lt;/b&gt;"));
    assert!(xml_text.contains("a=1&amp;b=&lt;2&gt;"), "{xml_text}");
    // Characters XML 1.0 cannot hold never reach the document.
    assert!(!xml_text.contains('\u{1}') && !xml_text.contains('\u{1b}'));
    assert!(xml_text.contains("\\u{1}"), "{xml_text}");
    assert!(!xml_text.contains("]]>"), "{xml_text}");
    // Nothing between tags holds a raw `<` or `&` that is not an entity.
    for (i, _) in xml_text.match_indices('&') {
        let rest = &xml_text[i..];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                .iter()
                .any(|e| rest.starts_with(e)),
            "a bare & at {i}"
        );
    }
    assert!(xml_text.contains("time=\"1.234\""));
}

#[test]
fn json_report_has_the_documented_shape() {
    let v: serde_json::Value = serde_json::from_str(&json(&hostile())).unwrap();
    assert_eq!(v["format"], "idem-check/1");
    assert_eq!(v["passed"], false);
    assert_eq!(v["requests_sent"], 2);
    assert_eq!(v["summary"]["fail"], 1);
    assert_eq!(v["summary"]["not_applicable"], 1);
    assert_eq!(v["probes"][0]["id"], "replay");
    assert_eq!(v["probes"][0]["status"], "fail");
    assert_eq!(v["probes"][1]["status"], "not_applicable");
    let ex = &v["probes"][0]["exchanges"][0];
    assert_eq!(ex["request"]["headers"][1][1], "[redacted]");
    assert_eq!(ex["response"]["status"], 201);
    assert_eq!(v["target"]["url"], "http://127.0.0.1:1/v1/charges");
}

#[test]
fn text_report_lists_every_probe_and_shows_the_evidence_when_verbose() {
    let t = text(&hostile(), false);
    assert!(
        t.starts_with("Bottom line: a retry with the same key is not answered"),
        "{t}"
    );
    assert!(
        t.contains("[fail]            Replay — the same request with the same key"),
        "{t}"
    );
    assert!(t.contains("[not applicable]  Tenants"), "{t}");
    assert!(t.contains("FAILED: 2 probes: 0 passed, 1 failed, 1 not applicable; 2 requests sent"));
    assert!(t.contains("[fail] replay: same body"), "{t}");
    assert!(!t.contains("< 201"), "no exchange without --verbose: {t}");
    assert!(
        t.contains("The 1 request and its answer behind these verdicts"),
        "{t}"
    );
    let v = text(&hostile(), true);
    assert!(v.contains("> idempotency-key: k\\tx"), "{v}");
    assert!(v.contains("< 201"));
    assert!(
        v.contains("# first request (in flight 1.5 ms to 2.5 ms)"),
        "{v}"
    );
}

fn probe(id: &'static str, status: Status, executed_again: bool) -> ProbeReport {
    ProbeReport {
        id,
        name: id,
        tests: "",
        status,
        summary: String::new(),
        checks: vec![],
        exchanges: vec![],
        duration_ms: 0,
        executed_again,
    }
}

#[test]
fn the_bottom_line_says_what_broke_in_plain_words() {
    use Status::*;
    let ignored = [
        probe("replay", Fail, true),
        probe("concurrent_duplicates", Fail, false),
        probe("tenants", NotApplicable, false),
    ];
    assert_eq!(
        bottom_line(&ignored),
        "this API ignores `Idempotency-Key`: every retry creates a new resource"
    );
    let holds = [
        probe("replay", Pass, false),
        probe("tenants", NotApplicable, false),
    ];
    assert_eq!(
        bottom_line(&holds),
        "idempotency holds for every probe that applied"
    );
    let mismatch = [
        probe("replay", Pass, false),
        probe("payload_mismatch", Fail, false),
        probe("keys", Fail, false),
    ];
    assert_eq!(
        bottom_line(&mismatch),
        "a key reused with another payload is not refused as it should be (and 1 more \
         failed probe)"
    );
    let race = [
        probe("replay", Pass, false),
        probe("concurrent_duplicates", Fail, true),
    ];
    assert!(bottom_line(&race).starts_with("parallel requests with one key"));
    let nothing = [probe("tenants", NotApplicable, false)];
    assert_eq!(
        bottom_line(&nothing),
        "nothing was tested: no probe applied"
    );
}
