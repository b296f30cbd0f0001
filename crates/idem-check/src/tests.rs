//! Tests of `lib.rs`.

use super::*;
use clap::Parser;

#[test]
fn a_body_that_is_not_json_without_a_content_type_is_said_once() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["http://127.0.0.1:9/v1/charges"];
        argv.extend_from_slice(extra);
        target(&parse(&argv)).unwrap()
    };
    assert_eq!(body_warning(&parse(&[])), None, "the default {{}} is JSON");
    assert_eq!(body_warning(&parse(&["--body", "{\"a\":1}"])), None);
    // A form is recognised, and sent as one.
    assert_eq!(body_warning(&parse(&["--body", "amount=1"])), None);
    let warned = body_warning(&parse(&["--body", "just some text"])).unwrap();
    assert!(
        warned.contains("neither JSON nor a form") && warned.contains("Content-Type"),
        "{warned}"
    );
    assert_eq!(
        body_warning(&parse(&[
            "--body",
            "amount=1",
            "-H",
            "content-type: application/x-www-form-urlencoded"
        ])),
        None
    );
}

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    args: CheckArgs,
}

fn parse(argv: &[&str]) -> CheckArgs {
    Cmd::try_parse_from(std::iter::once("check").chain(argv.iter().copied()))
        .unwrap()
        .args
}

fn refusal(argv: &[&str]) -> String {
    target(&parse(argv)).unwrap_err().to_string()
}

#[test]
fn https_urls_take_a_ca_and_other_schemes_are_refused() {
    assert!(refusal(&["ftp://x/"]).contains("no http:// or https:// URL"));
    assert!(refusal(&["http://x/", "--ca", "ca.pem"]).contains("--ca is for an https://"));
    let missing = refusal(&["https://127.0.0.1/", "--ca", "/nonexistent/ca.pem"]);
    assert!(missing.starts_with("--ca /nonexistent/ca.pem"), "{missing}");
    let dir = std::env::temp_dir().join(format!("idem-check-ca-{}", std::process::id()));
    std::fs::write(&dir, "no certificate here").unwrap();
    let empty = refusal(&["https://127.0.0.1/", "--ca", dir.to_str().unwrap()]);
    std::fs::remove_file(&dir).unwrap();
    assert!(empty.contains("no PEM certificate"), "{empty}");
}

#[test]
fn the_body_kind_follows_the_content_type_then_the_body() {
    let kind = |extra: &[&str]| {
        let mut argv = vec!["http://127.0.0.1:9/v1/charges"];
        argv.extend_from_slice(extra);
        target(&parse(&argv)).unwrap().kind
    };
    assert_eq!(
        kind(&["--body", "amount=500&currency=eur"]),
        client::BodyKind::Form
    );
    assert_eq!(
        kind(&[
            "--body",
            "amount=500",
            "-H",
            "Content-Type: Application/X-WWW-Form-Urlencoded; charset=utf-8"
        ]),
        client::BodyKind::Form
    );
    assert!(matches!(
        kind(&["--body", "{\"a\":1}"]),
        client::BodyKind::Json(_)
    ));
    assert_eq!(kind(&["--body", "hello there"]), client::BodyKind::Other);
}

#[test]
fn the_profile_defaults_to_ietf() {
    assert_eq!(parse(&["http://127.0.0.1:1/x"]).profile, Profile::Ietf);
    assert_eq!(
        parse(&["http://127.0.0.1:1/x", "--profile", "stripe"]).profile,
        Profile::Stripe
    );
    assert!(Cmd::try_parse_from(["check", "http://127.0.0.1:1/x", "--profile", "paypal"]).is_err());
}

#[test]
fn bad_arguments_are_refused_without_echoing_credentials() {
    let e = refusal(&[
        "http://127.0.0.1:1/",
        "-H",
        "Authorization: Bearer s3cr\u{1}t",
    ]);
    assert!(!e.contains("s3cr"), "{e}");
    assert!(refusal(&["http://127.0.0.1:1/", "-H", "no colon"]).contains("'Name: value'"));
    assert!(refusal(&["http://127.0.0.1:1/", "-H", "Idempotency-Key: x"]).contains("choose"));
    assert!(refusal(&["http://127.0.0.1:1/", "--id-pointer", "id"]).contains("'/'"));
    assert!(refusal(&["http://127.0.0.1:1/", "--concurrency", "1"]).contains("2 or more"));
    assert!(refusal(&["http://127.0.0.1:1/", "--max-requests", "5"]).contains("less than"));
    let same = refusal(&[
        "http://127.0.0.1:1/",
        "-H",
        "Authorization: Bearer a",
        "--other-tenant-header",
        "authorization: Bearer a",
    ]);
    assert!(same.contains("another tenant"), "{same}");
    assert!(refusal(&["http://u:p@127.0.0.1:1/"]).contains("credentials in the URL"));
}

#[test]
fn defaults_are_those_of_the_synopsis() {
    let a = parse(&["http://127.0.0.1:1/x"]);
    assert_eq!(a.method, "POST");
    assert_eq!(a.concurrency, 20);
    assert_eq!(a.max_requests, 200);
    assert_eq!(a.timeout, Duration::from_secs(10));
    assert_eq!(a.format, Format::Text);
    let t = target(&a).unwrap();
    assert_eq!(t.authority, "127.0.0.1:1");
    assert_eq!(&t.body[..], b"{}");
    assert!(matches!(t.kind, client::BodyKind::Json(_)));
}

#[test]
fn credential_headers_are_secret() {
    let a = parse(&[
        "http://127.0.0.1:1/x",
        "-H",
        "X-Tenant: a",
        "--other-tenant-header",
        "X-Tenant: b",
    ]);
    let t = target(&a).unwrap();
    for name in [
        "authorization",
        "cookie",
        "x-auth-token",
        "x-tenant",
        "x-api-key",
    ] {
        assert!(t.is_secret(&HeaderName::from_static(name)), "{name}");
    }
    for name in ["idempotency-key", "content-type", "location"] {
        assert!(!t.is_secret(&HeaderName::from_static(name)), "{name}");
    }
}

#[test]
fn only_the_mcp_profile_runs_the_mcp_probes_and_gives_fresh_ids() {
    for profile in Profile::ALL {
        let ids: Vec<&str> = probes_for(profile).iter().map(|(id, _)| *id).collect();
        let base: Vec<&str> = PROBES.iter().map(|(id, _)| *id).collect();
        if profile == Profile::Mcp {
            assert_eq!(ids[..base.len()], base[..]);
            assert_eq!(ids[base.len()..], ["mcp_replay_id", "mcp_envelope"]);
        } else {
            assert_eq!(ids, base, "{profile:?}");
        }
        for id in ids {
            assert!(!describe(id).is_empty(), "{id}");
        }
    }
    let mcp = target(&parse(&["http://127.0.0.1:1/mcp", "--profile", "mcp"])).unwrap();
    assert!(mcp.rpc);
    let ietf = target(&parse(&["http://127.0.0.1:1/mcp"])).unwrap();
    assert!(!ietf.rpc);
}
