//! Whose key is it (SPEC S3), seen from outside: the stored tenant cannot be reversed
//! from the store alone, every gateway on one store names a client the same way, the
//! auth-scheme's case does not matter, several headers name a tenant together, and
//! `--require-tenant` refuses a keyed request that names none.

use std::path::Path;
use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, check_config, new_key, over_both_protocols};

/// `Basic alice:hunter2`, the credential a word list recovers from its plain hash.
const ALICE: &str = "Basic alice:hunter2";

/// The lower-case hex SHA-256 of [`ALICE`], computed apart from this code
/// (`printf %s 'Basic alice:hunter2' | sha256sum`).
const ALICE_SHA256: &str = "5e57548c28572f1ce137d53263a52ab68753057ede6f4aa032f786fbd35a5988";

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("idem.db").display())
}

/// Every byte of the files the SQLite store keeps (the database, its WAL), as an
/// attacker who copied them would have them.
fn store_bytes(dir: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("idem.db") {
            all.extend(std::fs::read(&path).unwrap());
        }
    }
    all
}

/// The stored tenant names (`hmac-sha256:` and 64 hex digits) found in `bytes`.
fn stored_tenants(bytes: &[u8]) -> Vec<String> {
    let prefix = b"hmac-sha256:";
    let mut found = Vec::new();
    for i in 0..bytes.len().saturating_sub(prefix.len() + 64) {
        if &bytes[i..i + prefix.len()] == prefix {
            let hex = &bytes[i + prefix.len()..i + prefix.len() + 64];
            if hex.iter().all(|b| b.is_ascii_hexdigit()) {
                found.push(String::from_utf8(hex.to_vec()).unwrap());
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    count(haystack, needle) > 0
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| w == &needle)
        .count()
}

/// The "done when": after a keyed request with `Authorization: Basic
/// alice:hunter2`, the store's files hold a keyed tenant, and neither the credential
/// nor its SHA-256 in any spelling.
#[tokio::test]
async fn stored_tenant_is_not_the_sha256_of_the_credential() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", &sqlite_url(dir.path())]).await;
    let http = Http::new();
    let key = new_key();
    let a = http
        .post(
            &gw.url("/v1/charges"),
            &key,
            "{}",
            &[("authorization", ALICE)],
        )
        .await;
    assert_eq!(a.status, 201);
    let logs = gw.logs();
    assert!(gw.terminate().await.success());

    let bytes = store_bytes(dir.path());
    assert!(
        contains(&bytes, key.as_bytes()),
        "the record is in the file"
    );
    for plain in [ALICE_SHA256.to_owned(), ALICE_SHA256.to_uppercase()] {
        assert!(
            !contains(&bytes, plain.as_bytes()),
            "the plain SHA-256 is stored"
        );
    }
    assert!(!contains(&bytes, b"hunter2"), "the credential is stored");
    // Every `sha256:` is the end of an `hmac-sha256:`: no plain-hash tenant.
    assert_eq!(
        count(&bytes, b"sha256:"),
        count(&bytes, b"hmac-sha256:"),
        "a plain-hash tenant is stored"
    );
    let tenants = stored_tenants(&bytes);
    assert_eq!(tenants.len(), 1, "one keyed tenant: {tenants:?}");
    assert_ne!(tenants[0], ALICE_SHA256);
    assert!(!logs.contains("hunter2"), "the credential reached the log");
}

over_both_protocols! {
/// The secret the store generated on the first start names the tenant on every later
/// one, and for a second gateway on the same file: a retry after a restart, or through
/// the other gateway, replays.
async fn gateways_on_one_store_and_restarts_agree_on_the_tenant(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_url(dir.path());
    let up = Upstream::start().await;
    let http = Http::speaking(proto);
    let key = new_key();
    let auth = [("authorization", ALICE)];

    let first = Gateway::start(&up.url(), dir.path(), &["--store", &store]).await;
    let a = http
        .post(&first.url("/v1/charges"), &key, "{}", &auth)
        .await;
    assert_eq!(a.status, 201);
    assert!(first.terminate().await.success());

    let restarted = Gateway::start(&up.url(), dir.path(), &["--store", &store]).await;
    let second = Gateway::start(&up.url(), dir.path(), &["--store", &store]).await;
    for gw in [&restarted, &second] {
        let b = http.post(&gw.url("/v1/charges"), &key, "{}", &auth).await;
        assert_eq!(b.status, 201);
        assert!(b.replayed(), "{b:?}");
        assert_eq!(b.body, a.body);
    }
    assert_eq!(up.finished(&key), 1);
}
}

/// With the operator's secret (`--tenant-secret-file`, `IDEM_TENANT_SECRET`), the
/// tenant is keyed by it: the same secret again replays, another one is another
/// tenant, which executes again. The secret never reaches the log.
#[tokio::test]
async fn the_operators_secret_names_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_url(dir.path());
    let secret_file = dir.path().join("tenant.secret");
    let secret = "0123456789abcdef0123456789abcdef-first";
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let file_arg = secret_file.display().to_string();
    let up = Upstream::start().await;
    let http = Http::new();
    let key = new_key();
    let auth = [("authorization", ALICE)];

    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", &store, "--tenant-secret-file", &file_arg],
    )
    .await;
    assert_eq!(
        http.post(&gw.url("/v1/charges"), &key, "{}", &auth)
            .await
            .status,
        201
    );
    let logs = gw.logs();
    assert!(gw.terminate().await.success());
    assert!(!logs.contains(secret), "the secret reached the log");

    // The same secret, from the environment: the same tenant.
    let gw = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &["--store", &store],
        &[("IDEM_TENANT_SECRET", secret)],
    )
    .await;
    let b = http.post(&gw.url("/v1/charges"), &key, "{}", &auth).await;
    assert!(b.replayed(), "{b:?}");
    assert!(gw.terminate().await.success());
    assert_eq!(up.finished(&key), 1);

    // Another secret: another tenant.
    let gw = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &["--store", &store],
        &[(
            "IDEM_TENANT_SECRET",
            "another secret, also 32 bytes or more",
        )],
    )
    .await;
    let c = http.post(&gw.url("/v1/charges"), &key, "{}", &auth).await;
    assert_eq!(c.status, 201);
    assert!(!c.replayed(), "{c:?}");
    assert_eq!(up.finished(&key), 2);
}

/// `idem serve` as a process that should refuse to start: its exit status and what
/// it wrote.
async fn refused_start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(crate::common::binary());
    cmd.arg("serve")
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .args(["--store", &sqlite_url(dir)])
        .args(args)
        .current_dir(dir)
        .kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEM_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the gateway exits at once")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A secret shorter than 32 bytes, an empty or missing file, or both sources at once
/// stop the gateway before it serves, with an error that says why and shows nothing
/// of the secret.
#[tokio::test]
async fn unusable_tenant_secrets_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "hunter2-but-short\n").unwrap();
    let good = dir.path().join("good.secret");
    std::fs::write(&good, "0123456789abcdef0123456789abcdef").unwrap();
    let short_arg = short.display().to_string();
    let good_arg = good.display().to_string();
    let missing = dir.path().join("missing").display().to_string();
    for (args, env, says) in [
        (
            vec![],
            vec![("IDEM_TENANT_SECRET", "hunter2")],
            "at least 32",
        ),
        (
            vec!["--tenant-secret-file", short_arg.as_str()],
            vec![],
            "at least 32",
        ),
        (
            vec!["--tenant-secret-file", missing.as_str()],
            vec![],
            "tenant_secret_file",
        ),
        (
            vec!["--tenant-secret-file", good_arg.as_str()],
            vec![("IDEM_TENANT_SECRET", "0123456789abcdef0123456789abcdef")],
            "IDEM_TENANT_SECRET",
        ),
    ] {
        let (ok, text) = refused_start(dir.path(), &args, &env).await;
        assert!(!ok, "{args:?} {env:?} started:\n{text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!text.contains("hunter2"), "the secret was shown: {text}");
        assert!(!text.contains("listening"), "{text}");
    }
}

over_both_protocols! {
/// RFC 9110 §11.1: the auth-scheme is case-insensitive and followed by one or more
/// spaces, so `bearer X`, `Bearer X` and `BEARER  X` are one client; the credential
/// itself is exact, so `Bearer x` is another.
async fn auth_scheme_case_and_spacing_name_one_tenant(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let http = Http::speaking(proto);
    let key = new_key();
    let url = gw.url("/v1/charges");
    let first = http
        .post(&url, &key, "{}", &[("authorization", "bearer sk_ABC")])
        .await;
    assert_eq!(first.status, 201);
    for same in ["Bearer sk_ABC", "BEARER  sk_ABC", "bEaReR sk_ABC"] {
        let a = http
            .post(&url, &key, "{}", &[("authorization", same)])
            .await;
        assert!(a.replayed(), "{same:?}: {a:?}");
    }
    assert_eq!(up.finished(&key), 1);
    let other = http
        .post(&url, &key, "{}", &[("authorization", "Bearer sk_abc")])
        .await;
    assert_eq!(other.status, 201);
    assert!(!other.replayed(), "the credential's case matters");
    assert_eq!(up.finished(&key), 2);
}
}

over_both_protocols! {
/// `--tenant-header Authorization,Stripe-Account`: a platform key acting for two
/// accounts is two tenants, each replaying its own; a request without the second
/// header is a third.
async fn several_tenant_headers_keep_accounts_apart(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--tenant-header",
            "Authorization,Stripe-Account",
        ],
    )
    .await;
    let http = Http::speaking(proto);
    let key = new_key();
    let url = gw.url("/v1/charges");
    let platform = ("authorization", "Bearer sk_platform");
    let one = http
        .post(&url, &key, "{}", &[platform, ("stripe-account", "acct_1")])
        .await;
    let two = http
        .post(&url, &key, "{}", &[platform, ("stripe-account", "acct_2")])
        .await;
    assert_eq!((one.status, two.status), (201, 201));
    assert!(
        !two.replayed(),
        "another account got the first one's answer"
    );
    assert_eq!(up.finished(&key), 2);
    let again = http
        .post(&url, &key, "{}", &[platform, ("stripe-account", "acct_2")])
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, two.body);
    let none = http.post(&url, &key, "{}", &[platform]).await;
    assert!(!none.replayed(), "no account is a tenant of its own");
    assert_eq!(up.finished(&key), 3);
}
}

over_both_protocols! {
/// `--require-tenant`: a keyed request that carries none of the tenant headers is
/// answered 401 `missing-tenant` with a challenge, and nothing is reserved or
/// forwarded; one that carries any of them, and an unkeyed one, go through.
async fn require_tenant_refuses_a_keyed_request_without_one(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--require-tenant",
            "--tenant-header",
            "Authorization,Stripe-Account",
        ],
    )
    .await;
    let http = Http::speaking(proto);
    let key = new_key();
    let url = gw.url("/v1/charges");
    let refused = http.post(&url, &key, "{}", &[]).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idem.dev/problems/missing-tenant"
    );
    assert!(refused.header("www-authenticate").is_some(), "{refused:?}");
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("authorization") && detail.contains("stripe-account"),
        "{detail}"
    );
    assert_eq!(up.total(), 0, "nothing was forwarded");

    // Nothing was reserved: the same key with a tenant executes.
    let ok = http
        .post(&url, &key, "{}", &[("stripe-account", "acct_1")])
        .await;
    assert_eq!(ok.status, 201);
    assert!(!ok.replayed());
    let unkeyed = http.send("GET", &url, &[], "").await;
    assert_eq!(unkeyed.status, 201);
    assert_eq!(up.total(), 2);
}
}

/// `idem keys show --tenant-credential-env` names the tenant as the gateway does,
/// from one variable per tenant header under the secret the store keeps, and says so
/// when the variables do not match the headers.
#[tokio::test]
async fn keys_command_names_a_tenant_of_several_headers() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_url(dir.path());
    let headers = "Authorization,Stripe-Account";
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", &store, "--tenant-header", headers],
    )
    .await;
    let key = new_key();
    let a = Http::new()
        .post(
            &gw.url("/v1/charges"),
            &key,
            "{}",
            &[
                ("authorization", "Bearer sk_platform"),
                ("stripe-account", "acct_1"),
            ],
        )
        .await;
    assert_eq!(a.status, 201);
    assert!(gw.terminate().await.success());

    let show = |vars: &str, account: &str| {
        let mut cmd = std::process::Command::new(crate::common::binary());
        cmd.args(["keys", "show", &key, "--endpoint", "POST /v1/charges"])
            .args(["--store", &store, "--tenant-header", headers])
            .args(["--tenant-credential-env", vars])
            .env("AUTH", "BEARER sk_platform")
            .env("ACCOUNT", account)
            .current_dir(dir.path());
        for (k, _) in std::env::vars() {
            if k.starts_with("IDEM_") {
                cmd.env_remove(k);
            }
        }
        cmd.output().unwrap()
    };
    let found = show("AUTH,ACCOUNT", "acct_1");
    assert!(found.status.success(), "{found:?}");
    let v: serde_json::Value = serde_json::from_slice(&found.stdout).unwrap();
    assert!(
        v["tenant"].as_str().unwrap().starts_with("hmac-sha256:"),
        "{v}"
    );
    assert!(!String::from_utf8_lossy(&found.stdout).contains("sk_platform"));
    assert_eq!(
        show("AUTH,ACCOUNT", "acct_2").status.code(),
        Some(1),
        "another account"
    );
    let one = show("AUTH", "acct_1");
    assert_eq!(one.status.code(), Some(2));
    let said = String::from_utf8_lossy(&one.stderr);
    assert!(said.contains("one per tenant header"), "{said}");
}

/// `--trusted-headers` (issue 39 §1): an identity header the ingress sets names the
/// tenant only on connections from the ingress. A client that reaches the gateway
/// directly and sends the header itself neither picks that tenant's records nor passes
/// the claim upstream.
#[tokio::test]
async fn a_trusted_header_names_the_tenant_only_from_a_trusted_proxy() {
    let up = Upstream::start().await;
    let http = Http::new();
    let key = new_key();
    let as_alice = [("x-user-id", "alice"), ("authorization", "Bearer t-1")];
    let common = [
        "--tenant-header",
        "X-User-Id",
        "--require-tenant",
        "--trusted-headers",
        "X-User-Id",
    ];

    // The test's connections come from 127.0.0.1: here the ingress.
    let dir = tempfile::tempdir().unwrap();
    let mut args = common.to_vec();
    args.extend(["--trusted-proxies", "127.0.0.1"]);
    let ingress = Gateway::start(&up.url(), dir.path(), &args).await;
    let url = ingress.url("/v1/charges");
    let first = http.post(&url, &key, "{}", &as_alice).await;
    assert_eq!(first.status, 201, "{first:?}");
    // A refreshed token, the same principal: the same tenant.
    let retry = http
        .post(
            &url,
            &key,
            "{}",
            &[("x-user-id", "alice"), ("authorization", "Bearer t-2")],
        )
        .await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(up.started(&key), 1);
    assert_eq!(up.seen()[0].headers["x-user-id"], "alice");

    // Trusting only another network, the same request names no tenant: the header was
    // removed before anything read it.
    let dir = tempfile::tempdir().unwrap();
    let mut args = common.to_vec();
    args.extend(["--trusted-proxies", "10.0.0.0/8"]);
    let direct = Gateway::start(&up.url(), dir.path(), &args).await;
    let url = direct.url("/v1/charges");
    let refused = http.post(&url, &new_key(), "{}", &as_alice).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idem.dev/problems/missing-tenant"
    );
    // Unkeyed, it passes, without the claim.
    let read = http.send("GET", &url, &as_alice, "").await;
    assert_eq!(read.status, 201);
    let seen = up.seen();
    let last = seen.last().unwrap();
    assert!(
        last.headers.get("x-user-id").is_none(),
        "{:?}",
        last.headers
    );
    assert_eq!(last.headers["authorization"], "Bearer t-1");
}

#[test]
fn trusted_headers_without_trusted_proxies_stop_the_start() {
    let out = check_config(&["--trusted-headers", "x-user-id"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trusted_headers") && err.contains("trusted_proxies"),
        "{err}"
    );
}

/// A route may say the tenant is optional (issue 39 §1): with `--require-tenant`, a
/// keyed request that names no tenant is 401 everywhere but on the route whose rule
/// says `require_tenant = false`, where it is keyed as `anonymous`.
#[tokio::test]
async fn a_route_may_make_the_tenant_optional() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("idem.toml"),
        "[[route]]\nmethod = \"POST\"\npath = \"/v1/quotes\"\nrequire_tenant = false\n",
    )
    .unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--config", "idem.toml", "--require-tenant"],
    )
    .await;
    let http = Http::new();
    let key = new_key();
    let quote = http.post(&gw.url("/v1/quotes"), &key, "{}", &[]).await;
    assert_eq!(quote.status, 201, "{quote:?}");
    let again = http.post(&gw.url("/v1/quotes"), &key, "{}", &[]).await;
    assert!(again.replayed(), "keyed as anonymous: {again:?}");
    let charge = http
        .post(&gw.url("/v1/charges"), &new_key(), "{}", &[])
        .await;
    assert_eq!(charge.status, 401, "{charge:?}");
    assert_eq!(
        charge.problem_type(),
        "https://idem.dev/problems/missing-tenant"
    );
    assert_eq!(up.total(), 1);
}
