//! Where the key comes from and what the payload is (issue 40 §2): a route's key from a
//! JSON pointer into the body (Square's and AdCP's clients send it there), left out of
//! the fingerprint; a route whose JSON is compared by its RFC 8785 (JCS) form.

use crate::common::{Answer, Gateway, Http, Upstream, new_key};

struct Rig {
    up: Upstream,
    gw: Gateway,
    http: Http,
    _dir: tempfile::TempDir,
}

/// A gateway on the memory store with these `[[route]]` tables.
async fn rig(routes: &str) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("idem.toml"), routes).unwrap();
    let up = Upstream::start().await;
    let args = ["--store", "memory://", "--config", "idem.toml"];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    Rig {
        up,
        gw,
        http: Http::new(),
        _dir: dir,
    }
}

const ROUTES: &str = "[[route]]\npath = \"/v2/payments\"\nkey_pointer = \"/idempotency_key\"\n\n\
                      [[route]]\npath = \"/v2/refunds\"\nkey_pointer = \"/idempotency_key\"\n\
                      require_key = true\n";

impl Rig {
    async fn post(&self, path: &str, key: Option<&str>, body: String) -> Answer {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(key) = key {
            headers.push(("idempotency-key", key));
        }
        self.http
            .send("POST", &self.gw.url(path), &headers, body)
            .await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_in_the_body_replays_and_is_left_out_of_the_fingerprint() {
    let r = rig(ROUTES).await;
    let key = new_key();
    let body = |amount: u32| format!(r#"{{"idempotency_key": "{key}", "amount": {amount}}}"#);
    let first = r.post("/v2/payments", None, body(100)).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    let retry = r.post("/v2/payments", None, body(100)).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    let other = r.post("/v2/payments", None, body(999)).await;
    assert_eq!(other.status, 422, "another payload under the body's key");
    // The key's field is no part of the payload: the same operation with the key in
    // the header alone, and with it in both, is the same request.
    let header_only = r
        .post("/v2/payments", Some(&key), r#"{"amount": 100}"#.into())
        .await;
    assert!(header_only.replayed(), "{header_only:?}");
    let both = r.post("/v2/payments", Some(&key), body(100)).await;
    assert!(both.replayed(), "{both:?}");
    assert_eq!(r.up.total(), 1, "the upstream ran once for five requests");
    assert_eq!(
        r.up.seen()[0].body.as_ref(),
        body(100).as_bytes(),
        "the upstream got the body as sent"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_header_and_a_body_that_disagree_or_a_bad_body_key_are_400_and_reach_nobody() {
    let r = rig(ROUTES).await;
    let (a, b) = (new_key(), new_key());
    let body = format!(r#"{{"idempotency_key": "{b}", "amount": 1}}"#);
    let answer = r.post("/v2/payments", Some(&a), body).await;
    assert_eq!(answer.status, 400);
    assert_eq!(
        answer.problem_type(),
        "https://idem.dev/problems/invalid-key"
    );
    assert!(
        answer.json()["detail"]
            .as_str()
            .unwrap()
            .contains("different keys")
    );
    for bad in [
        r#"{"idempotency_key": 42}"#.to_owned(),
        format!(r#"{{"idempotency_key": "{}"}}"#, "k".repeat(300)),
    ] {
        let answer = r.post("/v2/payments", None, bad).await;
        assert_eq!(answer.status, 400, "{answer:?}");
        assert_eq!(
            answer.problem_type(),
            "https://idem.dev/problems/invalid-key"
        );
    }
    assert_eq!(r.up.total(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_without_a_key_passes_through_as_read_unless_the_route_requires_one() {
    let r = rig(ROUTES).await;
    let body = r#"{"amount": 7, "note": "no key here"}"#;
    for _ in 0..2 {
        let a = r.post("/v2/payments", None, body.into()).await;
        assert_eq!(a.status, 201);
        assert!(!a.replayed(), "an unkeyed request is never a replay");
    }
    assert_eq!(r.up.total(), 2, "both ran: no key, no idempotency");
    assert!(
        r.up.seen()
            .iter()
            .all(|s| s.body.as_ref() == body.as_bytes())
    );

    let missing = r.post("/v2/refunds", None, body.into()).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.problem_type(),
        "https://idem.dev/problems/missing-key"
    );
    let detail = missing.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("/idempotency_key"), "{detail}");
    assert_eq!(r.up.total(), 2, "the refusal reached nobody");
}

/// `canonical_json = "jcs"`: RFC 8785's comparison, where numbers are doubles.
#[tokio::test(flavor = "multi_thread")]
async fn a_jcs_route_compares_json_by_its_rfc_8785_form() {
    let r = rig("[[route]]\npath = \"/adcp/{*rest}\"\ncanonical_json = \"jcs\"\n").await;
    let replays = |path: &'static str, first: &'static str, retry: &'static str| {
        let r = &r;
        async move {
            let key = new_key();
            let a = r.post(path, Some(&key), first.into()).await;
            assert_eq!(a.status, 201, "{a:?}");
            r.post(path, Some(&key), retry.into()).await
        }
    };
    let respelled = replays(
        "/adcp/media_buys",
        r#"{"budget": 4.50, "reach": 1E30, "name": "a"}"#,
        r#"{"name":"a","reach":1e+30,"budget":4.5}"#,
    )
    .await;
    assert!(respelled.replayed(), "{respelled:?}");
    // Digits past a double's precision: one value under JCS, two under the default.
    let (a, b) = (r#"{"rate": 0.1}"#, r#"{"rate": 0.10000000000000000001}"#);
    assert!(replays("/adcp/media_buys", a, b).await.replayed());
    assert_eq!(replays("/v1/charges", a, b).await.status, 422);
    let other = replays("/adcp/media_buys", r#"{"rate": 0.1}"#, r#"{"rate": 0.2}"#).await;
    assert_eq!(other.status, 422);
}

/// RFC 7493 (I-JSON): a keyed JSON body that repeats a member name — a payload field
/// under a header's key, or the key itself on a `key_pointer` route — is a 400
/// `duplicate-json-member` that reaches nobody; the same body unkeyed is forwarded.
#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_json_body_that_repeats_a_member_is_400_and_reaches_nobody() {
    let r = rig(ROUTES).await;
    let key = new_key();
    let amount = r#"{"amount":100,"amount":1}"#;
    let answers = [
        r.post("/v1/orders", Some(&key), amount.into()).await,
        r.post(
            "/v2/payments",
            None,
            r#"{"idempotency_key":"KA","idempotency_key":"KB"}"#.into(),
        )
        .await,
    ];
    for answer in &answers {
        assert_eq!(answer.status, 400, "{answer:?}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(
            answer.json()["type"],
            "https://idem.dev/problems/duplicate-json-member",
            "{answer:?}"
        );
    }
    assert_eq!(r.up.total(), 0, "nothing was forwarded");
    // Nothing was reserved: the key with the body sent right executes.
    let fixed = r
        .post("/v1/orders", Some(&key), r#"{"amount":100}"#.into())
        .await;
    assert_eq!(fixed.status, 201, "{fixed:?}");
    assert!(!fixed.replayed());
    // Unkeyed traffic is none of the gateway's business.
    let unkeyed = r.post("/v1/orders", None, amount.into()).await;
    assert_eq!(unkeyed.status, 201, "{unkeyed:?}");
    assert_eq!(r.up.total(), 2);
    assert_eq!(r.up.seen()[1].body.as_ref(), amount.as_bytes());
}
