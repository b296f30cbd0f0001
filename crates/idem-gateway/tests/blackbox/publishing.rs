//! What the gateway publishes to clients about their keys (SPEC S23): under `acp` the
//! key echoed byte for byte as sent, the record's lifetime in a header the profile or a
//! setting names, the replay marker under the name a setting gives it and exposed to
//! browsers, and the idempotency document at its path; each setting's refusals.

use serde_json::{Value, json};

use idem_test_support::upstream::Reply;

use crate::common::{Answer, Gateway, Http, Upstream, check_config, new_key};

const JSON: (&str, &str) = ("content-type", "application/json");

/// The retention header's name and value a gateway is expected to publish, if any.
type Published = Option<(&'static str, &'static str)>;

/// POSTs `body` to `path` with `headers` besides the JSON content type.
async fn post(
    http: &Http,
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut all = vec![JSON];
    all.extend_from_slice(headers);
    http.send("POST", &gw.url(path), &all, body.to_owned())
        .await
}

fn output(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Under `acp` a bare key comes back bare and a quoted one quoted, on the first answer,
/// its replay and a refusal; the same key spelt the other way replays, echoed as that
/// request spelt it; where two key headers carry one key the echo is the first one's
/// spelling; a key from the body is echoed as a Structured Field string; a request with
/// two key fields is refused with no echo.
#[tokio::test(flavor = "multi_thread")]
async fn acp_echoes_the_key_byte_for_byte_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "profile = \"acp\"\n\n\
         [[route]]\npath = \"/two\"\nkey_header = [\"Idempotency-Key\", \"X-Idempotency-Key\"]\n\n\
         [[route]]\npath = \"/body\"\nkey_pointer = \"/idempotency_key\"\n",
    )
    .unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let http = Http::new();

    let bare = format!("68332aa6-{}", new_key());
    let quoted = format!("\"{}\\\"x\\\\\"", new_key());
    for sent in [bare.as_str(), quoted.as_str()] {
        let key = [("idempotency-key", sent)];
        let first = post(&http, &gw, "/v1/orders", &key, "{\"a\":1}").await;
        assert_eq!(first.status, 201);
        assert_eq!(first.header("idempotency-key"), Some(sent));
        let replay = post(&http, &gw, "/v1/orders", &key, "{\"a\":1}").await;
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(replay.header("idempotency-key"), Some(sent));
        let reused = post(&http, &gw, "/v1/orders", &key, "{\"a\":2}").await;
        assert_eq!(reused.status, 422);
        assert_eq!(reused.header("idempotency-key"), Some(sent));
    }
    assert_eq!(up.total(), 2, "one execution per key");

    // The bare key quoted names the same record: a replay, echoed as this request spelt it.
    let requoted = format!("\"{bare}\"");
    let again = [("idempotency-key", requoted.as_str())];
    let replay = post(&http, &gw, "/v1/orders", &again, "{\"a\":1}").await;
    assert!(replay.replayed());
    assert_eq!(replay.header("idempotency-key"), Some(requoted.as_str()));
    assert_eq!(up.total(), 2);

    // Two key headers with one key in two spellings: the first header's spelling.
    let two = new_key();
    let two_quoted = format!("\"{two}\"");
    let both = [
        ("x-idempotency-key", two.as_str()),
        ("idempotency-key", two_quoted.as_str()),
    ];
    let a = post(&http, &gw, "/two", &both, "{}").await;
    assert_eq!(a.status, 201);
    assert_eq!(a.header("idempotency-key"), Some(two_quoted.as_str()));
    let only_x = [("x-idempotency-key", two.as_str())];
    let a = post(&http, &gw, "/two", &only_x, "{}").await;
    assert!(a.replayed());
    assert_eq!(a.header("idempotency-key"), Some(two.as_str()));

    // A key from the body: its Structured Field string, which parses back to it.
    let in_body = new_key();
    let body = json!({"idempotency_key": in_body}).to_string();
    let a = post(&http, &gw, "/body", &[], &body).await;
    assert_eq!(a.status, 201);
    assert_eq!(
        a.header("idempotency-key"),
        Some(format!("\"{in_body}\"").as_str())
    );

    // Two key fields: refused before anything, and nothing echoed.
    let twice = [("idempotency-key", "k1"), ("idempotency-key", "k1")];
    let a = post(&http, &gw, "/v1/orders", &twice, "{}").await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["code"], "idempotency_key_invalid");
    assert!(a.header("idempotency-key").is_none(), "{a:?}");

    // An upstream that puts another value in `Idempotency-Key`: the client reads its own.
    let other =
        Upstream::scripted([Reply::with_header(201, "idempotency-key", "someone-else")]).await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&other.url(), dir.path(), &["--profile", "acp"]).await;
    let key = new_key();
    let first = post(
        &http,
        &gw,
        "/v1/orders",
        &[("idempotency-key", key.as_str())],
        "{}",
    )
    .await;
    assert_eq!(first.status, 201);
    assert_eq!(first.headers.get_all("idempotency-key").iter().count(), 1);
    assert_eq!(first.header("idempotency-key"), Some(key.as_str()));
}

/// The record's lifetime: `Idempotency-TTL` under `acp` by default, on the first answer,
/// the replay and a refusal; no header under the other profiles unless a setting names
/// one; `off` turns it off, and a route names its own.
#[tokio::test(flavor = "multi_thread")]
async fn retention_is_published_where_the_profile_or_a_setting_says() {
    let up = Upstream::start().await;
    let http = Http::new();
    let cases: [(&[&str], Published); 6] = [
        (&["--profile", "acp"], Some(("idempotency-ttl", "7200"))),
        (&["--profile", "ietf"], None),
        (&["--profile", "stripe"], None),
        (&["--profile", "ucp"], None),
        (
            &["--profile", "ietf", "--retention-header", "X-Key-TTL"],
            Some(("x-key-ttl", "7200")),
        ),
        (&["--profile", "acp", "--retention-header", "off"], None),
    ];
    for (args, published) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut all = vec!["--ttl", "2h"];
        all.extend_from_slice(args);
        let gw = Gateway::start(&up.url(), dir.path(), &all).await;
        let key = new_key();
        let headers = [("idempotency-key", key.as_str())];
        let first = post(&http, &gw, "/v1/orders", &headers, "{\"a\":1}").await;
        let replay = post(&http, &gw, "/v1/orders", &headers, "{\"a\":1}").await;
        let reused = post(&http, &gw, "/v1/orders", &headers, "{\"a\":2}").await;
        assert!(replay.replayed(), "{args:?}");
        assert!(reused.status >= 400, "{args:?}");
        let unkeyed = post(&http, &gw, "/v1/orders", &[], "{}").await;
        for answer in [&first, &replay, &reused] {
            match published {
                Some((name, value)) => assert_eq!(answer.header(name), Some(value), "{args:?}"),
                None => {
                    assert!(answer.header("idempotency-ttl").is_none(), "{args:?}");
                    assert!(answer.header("x-key-ttl").is_none(), "{args:?}");
                }
            }
        }
        assert!(
            unkeyed.header("idempotency-ttl").is_none(),
            "an unkeyed answer"
        );
        assert_eq!(up.started(&key), 1);
    }

    // A route's own choice wins over the global one.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "retention_header = \"X-Key-TTL\"\n\n\
         [[route]]\npath = \"/quiet\"\nretention_header = \"off\"\n\n\
         [[route]]\npath = \"/short\"\nttl = \"90s\"\n",
    )
    .unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    for (path, expected) in [
        ("/quiet", None),
        ("/short", Some("90")),
        ("/v1/x", Some("86400")),
    ] {
        let key = new_key();
        let a = post(&http, &gw, path, &[("idempotency-key", key.as_str())], "{}").await;
        assert_eq!(a.status, 201);
        assert_eq!(a.header("x-key-ttl"), expected, "{path}");
    }
}

/// The replay marker under the name a setting gives it, only on replays; exposed to a
/// page whose origin the answer allows, as the retention header, the echo and the
/// operation's state are.
#[tokio::test(flavor = "multi_thread")]
async fn the_replay_marker_is_named_by_its_setting_and_exposed_to_browsers() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let args = [
        "--profile",
        "acp",
        "--replay-header",
        "X-Idempotent-Replayed",
    ];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let http = Http::new();
    let key = new_key();
    let headers = [
        ("idempotency-key", key.as_str()),
        ("origin", "https://shop.example"),
    ];
    let first = post(&http, &gw, "/v1/orders", &headers, "{}").await;
    assert_eq!(first.status, 201);
    assert!(first.header("x-idempotent-replayed").is_none());
    let replay = post(&http, &gw, "/v1/orders", &headers, "{}").await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("x-idempotent-replayed"), Some("true"));
    assert!(replay.header("idempotent-replayed").is_none(), "{replay:?}");
    assert_eq!(up.started(&key), 1);
    assert_eq!(
        replay.header("access-control-allow-origin"),
        Some("https://shop.example")
    );
    // The upstream exposed `location, idempotent-replayed`; the gateway adds what it
    // writes itself.
    assert_eq!(
        replay.header("access-control-expose-headers"),
        Some(
            "location, idempotent-replayed, idempotency-key, idempotency-operation-state, \
             idempotency-ttl, x-idempotent-replayed"
        )
    );
    assert_eq!(
        first.header("access-control-expose-headers"),
        Some(
            "location, idempotent-replayed, idempotency-key, idempotency-operation-state, \
             idempotency-ttl"
        )
    );

    // A refusal the gateway makes itself is exposed as well.
    let reused = post(&http, &gw, "/v1/orders", &headers, "{\"b\":1}").await;
    assert_eq!(reused.status, 422);
    assert_eq!(
        reused.header("access-control-expose-headers"),
        Some("idempotency-key, idempotency-operation-state, idempotency-ttl")
    );
    // Without an allowed origin, nothing is exposed.
    let fresh = new_key();
    let plain = post(
        &http,
        &gw,
        "/v1/orders",
        &[("idempotency-key", fresh.as_str())],
        "{}",
    )
    .await;
    assert_eq!(plain.status, 201);
    assert!(plain.header("access-control-allow-origin").is_none());
    assert!(plain.header("access-control-expose-headers").is_none());
}

/// The idempotency document: the exact JSON of the global rules and each route's, to
/// `GET` and (without its body) `HEAD` at its path on the proxy listener; another
/// method there goes to the upstream; nothing of the upstream or the store in it; no
/// document where no path is set.
#[tokio::test(flavor = "multi_thread")]
async fn the_idempotency_document_lists_each_routes_rules() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "idempotency_document = \"/.well-known/idempotency\"\n\
         ttl = \"24h\"\nreplay_header = \"X-Idempotent-Replayed\"\n\n\
         [[route]]\nmethod = \"POST\"\npath = \"/checkout_sessions/{*rest}\"\nprofile = \"acp\"\n\
         require_key = true\nttl = \"1h\"\n\n\
         [[route]]\npath = \"/v1/payouts\"\nkey_header = [\"X-Idempotency-Key\"]\n\
         retention_header = \"X-Key-TTL\"\n",
    )
    .unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let http = Http::new();
    let doc = http
        .send("GET", &gw.url("/.well-known/idempotency?x=1"), &[], "")
        .await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.header("content-type"), Some("application/json"));
    assert_eq!(doc.header("cache-control"), Some("no-cache"));
    let expected = json!({
        "methods": ["POST", "PATCH"],
        "key_headers": ["idempotency-key"],
        "require_key": false,
        "replay_ttl_seconds": 86400,
        "profile": "ietf",
        "retention_header": null,
        "replay_header": "x-idempotent-replayed",
        "routes": [
            {
                "path": "/checkout_sessions/{*rest}",
                "methods": ["POST"],
                "key_headers": ["idempotency-key"],
                "require_key": true,
                "replay_ttl_seconds": 3600,
                "profile": "acp",
                "retention_header": "idempotency-ttl",
                "replay_header": "x-idempotent-replayed",
            },
            {
                "path": "/v1/payouts",
                "methods": ["POST", "PATCH"],
                "key_headers": ["x-idempotency-key"],
                "require_key": false,
                "replay_ttl_seconds": 86400,
                "profile": "ietf",
                "retention_header": "x-key-ttl",
                "replay_header": "x-idempotent-replayed",
            },
        ],
    });
    assert_eq!(doc.json(), expected);
    let text = String::from_utf8_lossy(&doc.body);
    for secret in [up.url().as_str(), "127.0.0.1", "sqlite", "memory"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    let head = http
        .send("HEAD", &gw.url("/.well-known/idempotency"), &[], "")
        .await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        head.header("content-length").map(str::to_owned),
        Some(doc.body.len().to_string())
    );
    assert_eq!(up.total(), 0, "the gateway answered both itself");
    // Another method at the path, and any other path, is the upstream's.
    let key = new_key();
    let posted = post(
        &http,
        &gw,
        "/.well-known/idempotency",
        &[("idempotency-key", key.as_str())],
        "{}",
    )
    .await;
    assert_eq!(posted.status, 201);
    assert_eq!(up.started(&key), 1);
    let beside = http
        .send("GET", &gw.url("/.well-known/idempotency/x"), &[], "")
        .await;
    assert_eq!(beside.json()["path"], "/.well-known/idempotency/x");

    // Off by default, and in pass-through mode, where no key is kept: the path is
    // the upstream's.
    let passthrough = [
        "--passthrough",
        "--idempotency-document",
        "/.well-known/idempotency",
    ];
    for args in [&[][..], &passthrough[..]] {
        let dir = tempfile::tempdir().unwrap();
        let gw = Gateway::start(&up.url(), dir.path(), args).await;
        let a = http
            .send("GET", &gw.url("/.well-known/idempotency"), &[], "")
            .await;
        let body: Value = a.json();
        assert_eq!(body["path"], "/.well-known/idempotency", "{args:?}: {body}");
    }
}

/// `check-config` shows the three settings, and refuses a name that is no header name,
/// one the gateway writes for something else, a marker and a retention header under one
/// name, and a document path that is not a plain absolute path, each naming its setting.
#[test]
fn publishing_settings_are_printed_and_bad_names_refused() {
    let ok = check_config(&[]);
    let printed = output(&ok);
    assert!(ok.status.success(), "{printed}");
    for line in [
        "# retention_header: the profile's: Idempotency-TTL under acp, none otherwise\n",
        "# replay_header: the profile's: Idempotent-Replayed\n",
        "# idempotency_document: off\n",
    ] {
        assert!(printed.contains(line), "{line:?} in {printed}");
    }
    let set = check_config(&[
        "--retention-header",
        "Idempotency-TTL",
        "--replay-header",
        "Idempotency-Replayed",
        "--idempotency-document",
        "/.well-known/idempotency",
    ]);
    let printed = output(&set);
    assert!(set.status.success(), "{printed}");
    for line in [
        "retention_header = \"idempotency-ttl\"\n",
        "replay_header = \"idempotency-replayed\"\n",
        "idempotency_document = \"/.well-known/idempotency\"\n",
    ] {
        assert!(printed.contains(line), "{line:?} in {printed}");
    }

    let refused: [(&[&str], &str); 7] = [
        (
            &["--replay-header", "Retry-After"],
            "replay_header: \"Retry-After\" is a header the gateway already writes",
        ),
        (
            &["--replay-header", "bad name"],
            "replay_header: \"bad name\" is no header name",
        ),
        (
            &["--retention-header", "Idempotency-Key"],
            "retention_header: \"Idempotency-Key\" is a header the gateway already writes",
        ),
        (
            &["--retention-header", "Idempotent-Replayed"],
            "retention_header: idempotent-replayed is the replay marker's header",
        ),
        (
            &["--replay-header", "X-Request-Id"],
            "replay_header: x-request-id is the request id's header",
        ),
        (
            &["--idempotency-document", "well-known"],
            "idempotency_document: \"well-known\" is not an absolute path",
        ),
        (
            &["--idempotency-document", "/a/../b"],
            "idempotency_document: \"/a/../b\" has an empty, `.` or `..` segment",
        ),
    ];
    for (args, said) in refused {
        let out = check_config(args);
        let text = output(&out);
        assert!(!out.status.success(), "{args:?}: {text}");
        assert!(text.contains(said), "{args:?}: {said:?} in {text}");
    }

    // A route's retention header is checked, and named by its route.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "replay_header = \"X-Replayed\"\n\n[[route]]\npath = \"/a\"\nretention_header = \"X-Replayed\"\n",
    )
    .unwrap();
    let out = check_config(&["--config", config.to_str().unwrap()]);
    let text = output(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("route[0] (/a) retention_header: x-replayed is the replay marker's header"),
        "{text}"
    );
}
