//! SPEC S14 at the gateway: its rules hold whatever the spelling. A method in any case
//! is keyed as the keyed method it spells; a path is normalised before route matching,
//! scoping and forwarding, and the upstream gets the normalised path; a path that
//! cannot be normalised is a 400 and reaches nobody.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::common::{Gateway, Http, Upstream, new_key, over_both_protocols, read_message};

struct Setup {
    up: Upstream,
    gw: Gateway,
    http: Http,
    _dir: tempfile::TempDir,
}

/// A gateway on the memory store with `extra` arguments, `toml` as its `--config` when
/// given, and `env` in its environment.
async fn setup(extra: &[&str], toml: Option<&str>, env: &[(&str, &str)]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut args = vec!["--store", "memory://"];
    if let Some(toml) = toml {
        std::fs::write(dir.path().join("idem.toml"), toml).unwrap();
        args.extend(["--config", "idem.toml"]);
    }
    args.extend_from_slice(extra);
    let gw = Gateway::start_with_env(&up.url(), dir.path(), &args, env).await;
    Setup {
        up,
        gw,
        http: Http::new(),
        _dir: dir,
    }
}

/// Six spellings of `/v1/charges` to an upstream that normalises its paths.
const SPELLINGS: [&str; 6] = [
    "/v1/charges",
    "/v1//charges",
    "/v1/%63harges",
    "/v1/./charges",
    "/v1/x/../charges",
    "/v1/x/%2E%2e/charges",
];

/// Sends a raw request on a fresh connection and reads the answer's head and body.
async fn raw(addr: std::net::SocketAddr, request: &str) -> (String, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), read_message(&mut stream))
        .await
        .expect("an answer within 10 s")
        .expect("a whole answer")
}

fn problem_type(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["type"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_in_any_case_executes_once_and_reaches_the_upstream_as_sent() {
    let s = setup(&[], None, &[]).await;
    let key = new_key();
    let url = s.gw.url("/v1/charges");
    let headers = [
        ("idempotency-key", key.as_str()),
        ("content-type", "application/json"),
    ];
    let first = s.http.send("post", &url, &headers, "{}").await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    for spelling in ["PoSt", "POST"] {
        let again = s.http.send(spelling, &url, &headers, "{}").await;
        assert_eq!(again.status, 201, "{spelling}: {again:?}");
        assert!(again.replayed(), "{spelling} replays the first answer");
        assert_eq!(again.body, first.body, "{spelling}");
    }
    assert_eq!(s.up.started(&key), 1, "one execution for three spellings");
    let seen = s.up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "post", "forwarded as sent");
    assert_eq!(
        seen[0].headers["idempotency-attempt"], "1",
        "forwarded keyed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_key_holds_for_a_method_in_any_case() {
    let s = setup(&["--require-key"], None, &[]).await;
    for spelling in ["post", "PoSt", "patch"] {
        let a = s
            .http
            .send(
                spelling,
                &s.gw.url("/v1/charges"),
                &[("content-type", "application/json")],
                "{}",
            )
            .await;
        assert_eq!(a.status, 400, "{spelling}: {a:?}");
        assert_eq!(
            a.problem_type(),
            "https://idem.dev/problems/missing-key",
            "{spelling}"
        );
    }
    assert_eq!(s.up.total(), 0, "nothing forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_spellings_of_one_path_execute_once_and_the_upstream_sees_the_normal_one() {
    let s = setup(&[], None, &[]).await;
    let key = new_key();
    let first = s
        .http
        .post(&s.gw.url(SPELLINGS[0]), &key, r#"{"amount":100}"#, &[])
        .await;
    assert_eq!(first.status, 201);
    for spelling in &SPELLINGS[1..] {
        let again = s
            .http
            .post(&s.gw.url(spelling), &key, r#"{"amount":100}"#, &[])
            .await;
        assert_eq!(again.status, 201, "{spelling}: {again:?}");
        assert!(again.replayed(), "{spelling} replays");
        assert_eq!(again.body, first.body, "{spelling}");
    }
    assert_eq!(s.up.started(&key), 1, "six spellings, one execution");

    // Unkeyed traffic is normalised as well: the upstream never sees a raw spelling.
    for spelling in SPELLINGS {
        let a = s.http.send("GET", &s.gw.url(spelling), &[], "").await;
        assert_eq!(a.status, 201, "{spelling}");
    }
    let seen = s.up.seen();
    assert_eq!(seen.len(), 7);
    for request in &seen {
        assert_eq!(request.path, "/v1/charges");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_require_key_route_needs_a_key() {
    let toml = r#"
        [[route]]
        method = "POST"
        path = "/v1/charges"
        require_key = true
    "#;
    let s = setup(&[], Some(toml), &[]).await;
    for spelling in SPELLINGS {
        for method in ["POST", "post"] {
            let a = s
                .http
                .send(
                    method,
                    &s.gw.url(spelling),
                    &[("content-type", "application/json")],
                    "{}",
                )
                .await;
            assert_eq!(a.status, 400, "{method} {spelling}: {a:?}");
            assert_eq!(a.problem_type(), "https://idem.dev/problems/missing-key");
        }
    }
    assert_eq!(s.up.total(), 0, "nothing forwarded");
    // Other paths keep the global default: an optional key.
    let other = s
        .http
        .send("POST", &s.gw.url("/v1/refunds"), &[], "{}")
        .await;
    assert_eq!(other.status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_ignore_pointer_applies_to_every_spelling() {
    let toml = r#"
        [[route]]
        method = "POST"
        path = "/v1/charges"
        ignore = ["/sent_at"]
    "#;
    let s = setup(&[], Some(toml), &[]).await;
    let key = new_key();
    let first = s
        .http
        .post(
            &s.gw.url("/v1/charges"),
            &key,
            r#"{"amount":100,"sent_at":0}"#,
            &[],
        )
        .await;
    assert_eq!(first.status, 201);
    for (n, spelling) in SPELLINGS.iter().enumerate().skip(1) {
        let body = format!(r#"{{"amount":100,"sent_at":{n}}}"#);
        let again = s.http.post(&s.gw.url(spelling), &key, &body, &[]).await;
        assert_eq!(again.status, 201, "{spelling}: {again:?}");
        assert!(again.replayed(), "{spelling}: the route's ignore applies");
    }
    // And what the pointer does not cover is still a mismatch, in every spelling.
    let changed = s
        .http
        .post(
            &s.gw.url("/v1//charges"),
            &key,
            r#"{"amount":999,"sent_at":0}"#,
            &[],
        )
        .await;
    assert_eq!(changed.status, 422);
    assert_eq!(s.up.started(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_that_cannot_be_normalised_are_400_and_never_forwarded() {
    let s = setup(&["--admin", "0"], None, &[]).await;
    let key = new_key();
    let paths = [
        "/../v1/charges",
        "/v1/x/../../../charges",
        "/%2e%2e/v1/charges",
        "/v1/%G1",
        "/v1/charges%4",
        "/v1/charges%00.json",
        "/v1/%0d%0aset-cookie:x",
        "/v1/x/%C0%AE%C0%AE/charges",
        "/v1/%FF",
        "/v1\\charges",
    ];
    for path in paths {
        for method in ["POST", "GET"] {
            let a = s
                .http
                .send(
                    method,
                    &s.gw.url(path),
                    &[("idempotency-key", key.as_str())],
                    "{}",
                )
                .await;
            assert_eq!(a.status, 400, "{method} {path}: {a:?}");
            assert_eq!(a.problem_type(), "https://idem.dev/problems/invalid-path");
            let detail = a.json()["detail"].as_str().unwrap().to_owned();
            assert!(detail.contains("cannot be normalised"), "{detail}");
        }
    }
    assert_eq!(s.up.total(), 0, "nothing forwarded");
    let metrics = s
        .http
        .send("GET", &s.gw.admin_url("/metrics"), &[], "")
        .await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    let rejected = format!(
        "idem_requests_total{{outcome=\"rejected\"}} {}",
        2 * paths.len()
    );
    assert!(metrics.contains(&rejected), "{rejected} in:\n{metrics}");
    // Nothing was reserved either: the key is fresh for a request that can be served.
    let ok = s.http.post(&s.gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(ok.status, 201);
    assert!(!ok.replayed());
    assert_eq!(s.up.started(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_and_asterisk_targets() {
    let s = setup(&[], None, &[]).await;
    let key = new_key();
    // An absolute-form target (RFC 9112 §3.2.2) is normalised like any other.
    let request = format!(
        "POST http://api.example.test/v1//./charges HTTP/1.1\r\nhost: api.example.test\r\n\
         idempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\
         connection: close\r\n\r\n{{}}"
    );
    let (head, _) = raw(s.gw.addr, &request).await;
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    let again = s.http.post(&s.gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(s.up.started(&key), 1);
    assert_eq!(s.up.seen()[0].path, "/v1/charges");

    // `*` names no path: for anything but OPTIONS it is an invalid target.
    let request = format!(
        "POST * HTTP/1.1\r\nhost: api.example.test\r\nidempotency-key: {key}\r\n\
         content-length: 2\r\nconnection: close\r\n\r\n{{}}"
    );
    let (head, body) = raw(s.gw.addr, &request).await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert_eq!(
        problem_type(&body),
        "https://idem.dev/problems/invalid-path"
    );
    assert_eq!(s.up.total(), 1, "nothing more forwarded");

    // `OPTIONS *` asks about the server as a whole: it passes as it came.
    let (head, _) = raw(
        s.gw.addr,
        "OPTIONS * HTTP/1.1\r\nhost: api.example.test\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 201"), "{head}");
    assert_eq!(s.up.seen()[1].method, "OPTIONS");
    assert_eq!(s.up.seen()[1].path, "*");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_path_normalization_none_the_raw_path_reaches_the_upstream() {
    let s = setup(&["--path-normalization", "none"], None, &[]).await;
    let key = new_key();
    for path in ["/v1/charges", "/v1//charges", "/v1/./charges"] {
        let a = s.http.post(&s.gw.url(path), &key, "{}", &[]).await;
        assert_eq!(a.status, 201, "{path}");
        assert!(!a.replayed(), "{path}: an endpoint of its own");
    }
    let paths: Vec<String> = s.up.seen().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/charges", "/v1//charges", "/v1/./charges"]);
    // Nor is anything refused: the upstream gets what came.
    let a = s.http.send("GET", &s.gw.url("/v1/%G1"), &[], "").await;
    assert_eq!(a.status, 201);
    assert_eq!(s.up.seen()[3].path, "/v1/%G1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opt_in_trailing_slash_and_lowercase_are_one_path_too() {
    let s = setup(
        &[],
        None,
        &[(
            "IDEM_PATH_NORMALIZATION",
            "rfc3986,merge-slashes,trailing-slash,lowercase",
        )],
    )
    .await;
    let key = new_key();
    let first = s
        .http
        .post(&s.gw.url("/V1/Charges/"), &key, "{}", &[])
        .await;
    assert_eq!(first.status, 201);
    for spelling in ["/v1/charges", "/v1/charges//", "/V1/%43harges"] {
        let again = s.http.post(&s.gw.url(spelling), &key, "{}", &[]).await;
        assert!(again.replayed(), "{spelling}: {again:?}");
    }
    assert_eq!(s.up.started(&key), 1);
    assert_eq!(s.up.seen()[0].path, "/v1/charges");
}

/// What the gateway does with a spelling of a path that an upstream framework routes
/// to the handler of its canonical spelling.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Spelt {
    /// One resource with the canonical spelling: the rule holds, one scope.
    Same,
    /// A 400 `invalid-path`: upstreams read it each their own way.
    Refused,
}

/// Spellings that Tomcat, Spring, Express, Rails, WSGI servers or ASP.NET route to
/// `POST /v1/charges` or `POST /v1/orders/{id}/capture`, with what the gateway makes
/// of each by default.
const FRAMEWORK_SPELLINGS: [(&str, &str, Spelt); 20] = [
    ("/v1/charges", "/v1/charges/", Spelt::Same),
    ("/v1/charges", "/v1/charges/.", Spelt::Same),
    ("/v1/charges", "/v1/charges//", Spelt::Same),
    ("/v1/charges", "/V1/CHARGES", Spelt::Same),
    ("/v1/charges", "/v1/Charges/", Spelt::Same),
    ("/v1/charges", "/v1/charges;jsessionid=x", Spelt::Same),
    ("/v1/charges", "/v1;a=b/charges;jsessionid=x/", Spelt::Same),
    ("/v1/charges", "/v1%2Fcharges", Spelt::Refused),
    ("/v1/charges", "/v1/charges%2F", Spelt::Refused),
    ("/v1/charges", "/v1/charges%5C", Spelt::Refused),
    ("/v1/charges", "/v1/charges%20", Spelt::Refused),
    ("/v1/charges", "/v1/%20charges", Spelt::Refused),
    ("/v1/charges", "/v1/charges%3Bjsessionid=x", Spelt::Refused),
    ("/v1/charges", "/v1/%EF%BD%83harges", Spelt::Refused),
    ("/v1/charges", "/v1/charge%EF%BC%B3", Spelt::Refused),
    ("/v1/charges", "/v1/x/..;/charges", Spelt::Refused),
    ("/v1/charges", "/v1/charges/;x", Spelt::Refused),
    (
        "/v1/orders/42/capture",
        "/V1/Orders/42/CAPTURE/",
        Spelt::Same,
    ),
    (
        "/v1/orders/42/capture",
        "/v1/orders/42;v=1/capture;x",
        Spelt::Same,
    ),
    (
        "/v1/orders/42/capture",
        "/v1/orders/42/capture%2F",
        Spelt::Refused,
    ),
];

const REQUIRE_KEY_ROUTES: &str = r#"
    [[route]]
    method = "POST"
    path = "/v1/charges"
    require_key = true

    [[route]]
    method = "POST"
    path = "/v1/orders/{id}/capture"
    require_key = true
"#;

over_both_protocols! {
    /// No spelling of a `require_key = true` route is forwarded without a key: each is
    /// the canonical resource (its retry under the same key replays the first answer)
    /// or a 400 `invalid-path` that reaches nobody.
    async fn no_spelling_skips_a_require_key_route(proto: Proto) {
        let mut s = setup(&[], Some(REQUIRE_KEY_ROUTES), &[]).await;
        s.http = Http::speaking(proto);
        let json = [("content-type", "application/json")];
        for (ran, (canonical, spelling, spelt)) in FRAMEWORK_SPELLINGS.into_iter().enumerate() {
            // Unkeyed: never forwarded.
            let a = s.http.send("POST", &s.gw.url(spelling), &json, "{}").await;
            assert_eq!(a.status, 400, "unkeyed {spelling}: {a:?}");
            let expected = match spelt {
                Spelt::Same => "https://idem.dev/problems/missing-key",
                Spelt::Refused => "https://idem.dev/problems/invalid-path",
            };
            assert_eq!(a.problem_type(), expected, "unkeyed {spelling}");
            assert_eq!(s.up.total(), ran, "unkeyed {spelling} was forwarded");

            // Keyed: one scope with the canonical spelling, or refused.
            let key = new_key();
            let first = s.http.post(&s.gw.url(canonical), &key, "{}", &[]).await;
            assert_eq!(first.status, 201, "{canonical}: {first:?}");
            let again = s.http.post(&s.gw.url(spelling), &key, "{}", &[]).await;
            match spelt {
                Spelt::Same => {
                    assert_eq!(again.status, 201, "{spelling}: {again:?}");
                    assert!(again.replayed(), "{spelling} is another scope: {again:?}");
                    assert_eq!(again.body, first.body, "{spelling}");
                }
                Spelt::Refused => {
                    assert_eq!(again.status, 400, "{spelling}: {again:?}");
                    assert_eq!(again.problem_type(), expected, "{spelling}");
                }
            }
            assert_eq!(s.up.started(&key), 1, "{spelling}: one execution");
            assert_eq!(s.up.total(), ran + 1, "{spelling}: only the canonical one ran");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_matching_exact_is_a_setting_and_path_parameters_still_match() {
    let s = setup(
        &["--route-matching", "exact"],
        Some(REQUIRE_KEY_ROUTES),
        &[],
    )
    .await;
    let json = [("content-type", "application/json")];
    // Case and a trailing slash name other routes now: the operator said the upstream
    // tells them apart.
    for spelling in ["/V1/CHARGES", "/v1/charges/"] {
        let a = s.http.send("POST", &s.gw.url(spelling), &json, "{}").await;
        assert_eq!(a.status, 201, "{spelling}: {a:?}");
    }
    assert_eq!(s.up.total(), 2);
    // Path parameters never name a segment: the rule holds whatever the setting.
    let a = s
        .http
        .send("POST", &s.gw.url("/v1/charges;jsessionid=x"), &json, "{}")
        .await;
    assert_eq!(a.status, 400, "{a:?}");
    assert_eq!(a.problem_type(), "https://idem.dev/problems/missing-key");
    assert_eq!(s.up.total(), 2);
}
