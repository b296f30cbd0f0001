//! Rules and tenants reloaded without a restart (issue 39 §3): SIGHUP and
//! `POST /reload` read the `--config` file again and put what may change in force for
//! new requests; a file that does not validate keeps the rules in force; requests in
//! progress and open connections carry on; a record keeps the fingerprint rules it was
//! reserved under; settings that take a restart are named and kept;
//! `check-config --diff` shows what a reload would change.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, check_config, new_key};

const TOKEN: &str = "reload-test-admin-token-0123456789";

/// A gateway whose `--config` file (kept in a directory of its own) the test rewrites,
/// with an admin listener and token, its upstream, and a client.
struct Rig {
    up: Upstream,
    file: PathBuf,
    gw: Gateway,
    http: Http,
    /// Holds the file and the gateway's log until the test ends.
    dir: tempfile::TempDir,
}

impl Rig {
    /// The gateway started with `contents` as its configuration file.
    async fn start(contents: &str) -> Rig {
        let up = Upstream::start().await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("idem.toml");
        std::fs::write(&file, contents).unwrap();
        let args = [
            "--config",
            file.to_str().unwrap(),
            "--admin",
            "127.0.0.1:0",
            "--admin-token",
            TOKEN,
        ];
        let gw = Gateway::start(&up.url(), dir.path(), &args).await;
        Rig {
            up,
            file,
            gw,
            http: Http::new(),
            dir,
        }
    }
}

/// Waits until `/readyz` names configuration generation `n`.
async fn wait_for_generation(http: &Http, gw: &Gateway, n: u64) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ready = http.send("GET", &gw.admin_url("/readyz"), &[], "").await;
        let body = String::from_utf8_lossy(&ready.body).into_owned();
        if ready.header("idem-config-generation") == Some(&n.to_string()) {
            assert!(
                body.contains(&format!("configuration generation {n}")),
                "{body}"
            );
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "generation {n} never came: {body}\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn post_reload(http: &Http, gw: &Gateway) -> crate::common::Answer {
    let auth = format!("Bearer {TOKEN}");
    http.send(
        "POST",
        &gw.admin_url("/reload"),
        &[("authorization", &auth)],
        "",
    )
    .await
}

/// SIGHUP puts a new route rule in force for new requests; a request in progress when
/// it came finishes under the rules it started with, on its open connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_new_route_rules_and_drops_nothing_in_progress() {
    let Rig {
        up,
        file,
        gw,
        http,
        dir: _dir,
    } = Rig::start("ttl = \"1h\"\n").await;
    let body = wait_for_generation(&http, &gw, 1).await;
    assert!(!body.contains("refused"), "{body}");

    let unkeyed = http.send("POST", &gw.url("/v1/orders"), &[], "{}").await;
    assert_eq!(unkeyed.status, 201, "no rule requires a key yet");
    let slow_key = new_key();
    let slow = tokio::spawn({
        let (http, url, key) = (http.clone(), gw.url("/v1/charges"), slow_key.clone());
        async move {
            http.post(&url, &key, "{}", &[("x-test-delay-ms", "1500")])
                .await
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while up.started(&slow_key) == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    std::fs::write(
        &file,
        "ttl = \"1h\"\n\n[[route]]\nmethod = \"POST\"\npath = \"/v1/orders\"\nrequire_key = true\n",
    )
    .unwrap();
    gw.signal("HUP");
    wait_for_generation(&http, &gw, 2).await;

    let refused = http.send("POST", &gw.url("/v1/orders"), &[], "{}").await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idem.dev/problems/missing-key"
    );
    let slow = slow.await.unwrap();
    assert_eq!(
        slow.status, 201,
        "the request in progress finished: {slow:?}"
    );
    assert_eq!(up.started(&slow_key), 1);
    let replay = http
        .post(&gw.url("/v1/charges"), &slow_key, "{}", &[])
        .await;
    assert!(replay.replayed(), "{replay:?}");
    assert!(
        gw.logs().contains("configuration reloaded"),
        "{}",
        gw.logs()
    );
}

/// A file that does not validate is refused: `POST /reload` says why (422
/// `reload-refused`), `/readyz` keeps the generation in force and says the last reload
/// was refused, and the rules in force still apply. The reload after it is fixed works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_does_not_validate_keeps_the_rules_in_force() {
    let rules = "[[route]]\nmethod = \"POST\"\npath = \"/v1/orders\"\nrequire_key = true\n";
    let Rig {
        up: _up,
        file,
        gw,
        http,
        dir: _dir,
    } = Rig::start(rules).await;

    let unauthorised = http.send("POST", &gw.admin_url("/reload"), &[], "").await;
    assert_eq!(unauthorised.status, 401, "the admin token is required");

    std::fs::write(&file, format!("ttl = \"soon\"\n{rules}")).unwrap();
    let refused = post_reload(&http, &gw).await;
    assert_eq!(refused.status, 422, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idem.dev/problems/reload-refused"
    );
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("ttl"), "{detail}");
    assert!(detail.contains("generation 1 stays in force"), "{detail}");
    let ready = wait_for_generation(&http, &gw, 1).await;
    assert!(ready.contains("last reload refused"), "{ready}");
    let still = http.send("POST", &gw.url("/v1/orders"), &[], "{}").await;
    assert_eq!(still.status, 400, "the rules in force still apply");
    assert!(gw.logs().contains("reload refused"), "{}", gw.logs());

    std::fs::write(&file, "ttl = \"1h\"\n").unwrap();
    let done = post_reload(&http, &gw).await;
    assert_eq!(done.status, 200, "{done:?}");
    let json = done.json();
    assert_eq!(json["generation"], 2, "{json}");
    let applied: Vec<&str> = json["applied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        applied.contains(&"ttl") && applied.contains(&"route 1"),
        "{json}"
    );
    let ready = wait_for_generation(&http, &gw, 2).await;
    assert!(!ready.contains("refused"), "{ready}");
    let open = http.send("POST", &gw.url("/v1/orders"), &[], "{}").await;
    assert_eq!(open.status, 201, "the rule is gone");
}

/// Settings that take a restart are named in the answer and the log, and keep their
/// running values; the others in the same file are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_take_a_restart_are_named_and_kept() {
    let Rig {
        up: _up,
        file,
        gw,
        http,
        dir: _dir,
    } = Rig::start("sweep_interval = \"1m\"\n").await;
    std::fs::write(
        &file,
        "sweep_interval = \"30s\"\nbody_limit = 10\nscope = \"internal\"\n",
    )
    .unwrap();
    let done = post_reload(&http, &gw).await;
    assert_eq!(done.status, 200, "{done:?}");
    let json = done.json();
    let named = |field: &str| -> Vec<String> {
        json[field]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        named("restart_required"),
        ["scope", "sweep_interval"],
        "{json}"
    );
    assert_eq!(named("applied"), ["body_limit"], "{json}");
    let big = http
        .post(&gw.url("/v1/charges"), &new_key(), "{\"a\":12345}", &[])
        .await;
    assert_eq!(big.status, 413, "the new body limit applies: {big:?}");
    assert!(
        gw.logs().contains("take a restart"),
        "the log names them: {}",
        gw.logs()
    );
}

/// A record keeps the fingerprint rules it was reserved under: after a reload that
/// leaves a field out of the route's fingerprint, a retry of a key stored before it
/// replays (the new rules alone would answer 422), a retry that changes that field is
/// still a 422 (the record counted it), and a key stored after it is compared by the
/// new rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_keeps_the_fingerprint_rules_it_was_reserved_under() {
    let route = "[[route]]\nmethod = \"POST\"\npath = \"/v1/charges\"\n";
    let Rig {
        up,
        file,
        gw,
        http,
        dir: _dir,
    } = Rig::start(route).await;
    let url = gw.url("/v1/charges");
    let before = new_key();
    let first = http
        .post(&url, &before, r#"{"amount":1,"sent_at":"a"}"#, &[])
        .await;
    assert_eq!(first.status, 201);

    std::fs::write(&file, format!("{route}ignore = [\"/sent_at\"]\n")).unwrap();
    gw.signal("HUP");
    wait_for_generation(&http, &gw, 2).await;

    let retry = http
        .post(&url, &before, r#"{"amount":1,"sent_at":"a"}"#, &[])
        .await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed(), "a replay, not a 422: {retry:?}");
    let changed = http
        .post(&url, &before, r#"{"amount":1,"sent_at":"b"}"#, &[])
        .await;
    assert_eq!(
        changed.status, 422,
        "the record counted sent_at: {changed:?}"
    );
    assert_eq!(up.started(&before), 1);

    let after = new_key();
    let first = http
        .post(&url, &after, r#"{"amount":1,"sent_at":"a"}"#, &[])
        .await;
    assert_eq!(first.status, 201);
    let retry = http
        .post(&url, &after, r#"{"amount":1,"sent_at":"b"}"#, &[])
        .await;
    assert!(
        retry.replayed(),
        "the new rules leave sent_at out: {retry:?}"
    );
    let changed = http
        .post(&url, &after, r#"{"amount":2,"sent_at":"a"}"#, &[])
        .await;
    assert_eq!(changed.status, 422, "{changed:?}");
    assert_eq!(up.started(&after), 1);
}

/// A tenant's own limits, put in force by a reload: with a global rate of one new key
/// a minute, a second key is refused; its tenant, as `/metrics` labels it, given
/// `key_rate = "none"` in a `[[tenant]]` table, goes on at once, while another tenant
/// stays limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_override_reloaded_lifts_that_tenant_only() {
    let global = "tenant_key_rate = \"1/min,1\"\n";
    let Rig {
        up: _up,
        file,
        gw,
        http,
        dir: _dir,
    } = Rig::start(global).await;
    let url = gw.url("/v1/charges");
    let alice = ("authorization", "Bearer sk_alice_override");
    let bob = ("authorization", "Bearer sk_bob_override");

    assert_eq!(
        http.post(&url, &new_key(), "{}", &[alice]).await.status,
        201
    );
    let refused = http.post(&url, &new_key(), "{}", &[alice]).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    let auth = format!("Bearer {TOKEN}");
    let scraped = http
        .send(
            "GET",
            &gw.admin_url("/metrics"),
            &[("authorization", &auth)],
            "",
        )
        .await;
    let text = String::from_utf8_lossy(&scraped.body).into_owned();
    let label = text
        .lines()
        .find(|l| {
            l.starts_with("idem_tenant_limited_requests_total{")
                && l.contains("key_rate")
                && l.ends_with(" 1")
        })
        .and_then(|l| l.split("tenant=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("alice's refusal is counted by tenant:\n{text}"))
        .to_owned();
    assert!(
        label.starts_with("hmac-sha256:") && label.len() == 12 + 16,
        "{label}"
    );

    std::fs::write(
        &file,
        format!("{global}\n[[tenant]]\nid = \"{label}\"\nkey_rate = \"none\"\n"),
    )
    .unwrap();
    let done = post_reload(&http, &gw).await;
    assert_eq!(done.status, 200, "{done:?}");
    for _ in 0..3 {
        let ok = http.post(&url, &new_key(), "{}", &[alice]).await;
        assert_eq!(ok.status, 201, "alice is no longer limited: {ok:?}");
    }
    assert_eq!(http.post(&url, &new_key(), "{}", &[bob]).await.status, 201);
    let bob_again = http.post(&url, &new_key(), "{}", &[bob]).await;
    assert_eq!(bob_again.status, 429, "bob still is: {bob_again:?}");
}

/// `check-config --diff FILE` prints what a reload with FILE would change, and which
/// of those changes take a restart; a FILE that does not validate exits 2 and says a
/// reload would be refused.
#[test]
fn check_config_diff_shows_what_a_reload_would_change() {
    let dir = tempfile::tempdir().unwrap();
    let (now, next, bad) = (
        dir.path().join("now.toml"),
        dir.path().join("next.toml"),
        dir.path().join("bad.toml"),
    );
    std::fs::write(&now, "ttl = \"24h\"\n").unwrap();
    std::fs::write(
        &next,
        "ttl = \"1h\"\nsweep_interval = \"30s\"\n\n[[route]]\npath = \"/v1/orders\"\nrequire_key = true\n",
    )
    .unwrap();
    std::fs::write(&bad, "ttl = 5\n").unwrap();
    let out = check_config(&[
        "--config",
        now.to_str().unwrap(),
        "--diff",
        next.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("- ttl = \"1day\"\n+ ttl = \"1h\"\n"),
        "{text}"
    );
    assert!(text.contains("+ [[route 1]]\n"), "{text}");
    assert!(text.contains("+     require_key = true\n"), "{text}");
    assert!(
        text.ends_with("these take a restart: sweep_interval\n"),
        "{text}"
    );
    let same = check_config(&[
        "--config",
        now.to_str().unwrap(),
        "--diff",
        now.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&same.stdout).contains("would change nothing"));
    let refused = check_config(&[
        "--config",
        now.to_str().unwrap(),
        "--diff",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("a reload with it would be refused"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// Reloads under load: while clients send keyed requests (each key twice) on
/// keep-alive connections, the rules are reloaded again and again. No request fails
/// or is dropped, every key executes once and its duplicate replays, and the last
/// generation is in force at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_drop_nothing_and_execute_each_key_once() {
    const CLIENTS: usize = 4;
    const KEYS: usize = 40;
    const RELOADS: u64 = 6;
    let Rig {
        up,
        file,
        gw,
        http,
        dir: _dir,
    } = Rig::start("ttl = \"1h\"\n").await;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (http, url) = (http.clone(), gw.url("/v1/charges"));
            tokio::spawn(async move {
                let mut keys = Vec::new();
                for i in 0..KEYS {
                    let key = new_key();
                    let body = format!("{{\"n\":{i}}}");
                    let first = http.post(&url, &key, &body, &[]).await;
                    assert_eq!(first.status, 201, "{first:?}");
                    let again = http.post(&url, &key, &body, &[]).await;
                    assert!(again.replayed(), "{again:?}");
                    keys.push(key);
                }
                keys
            })
        })
        .collect();
    for n in 0..RELOADS {
        // Each reload changes a live rule: the TTL, and a route's stored headers.
        std::fs::write(
            &file,
            format!(
                "ttl = \"{}h\"\n\n[[route]]\npath = \"/v1/refunds\"\nstore_headers = [\"x-n-{n}\"]\n",
                n + 2
            ),
        )
        .unwrap();
        let done = post_reload(&http, &gw).await;
        assert_eq!(done.status, 200, "{done:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in clients {
        for key in c.await.unwrap() {
            assert_eq!(up.started(&key), 1, "{key} ran once");
        }
    }
    wait_for_generation(&http, &gw, RELOADS + 1).await;
}
