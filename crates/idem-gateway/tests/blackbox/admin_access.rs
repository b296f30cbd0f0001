//! Who may call the admin listener (issue 61 §4, §5): without a token the routes that
//! show or change records and the configuration are refused unless the operator says
//! `--admin-open`; a browser's cross-site request is refused whatever the token; a
//! secret changed in the configuration is either put in force by a reload (the admin
//! token, the HS256 secret: the old one refused from that moment) or named in its
//! `restart_required` (the tenant secret, the record keys, a store password).

use std::path::{Path, PathBuf};

use idem_test_support::jwt::{Signer, epoch};
use serde_json::json;

use crate::common::{Answer, Gateway, Http, Upstream, new_key};

/// `path` on the admin listener, with `headers`.
async fn admin(
    http: &Http,
    gw: &Gateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    http.send(method, &gw.admin_url(path), headers, "").await
}

/// A gateway whose `--config` file is `contents`, with an admin listener and `extra`.
async fn with_config(up: &Upstream, dir: &Path, contents: &str, extra: &[&str]) -> Gateway {
    let file = dir.join("idem.toml");
    std::fs::write(&file, contents).unwrap();
    let mut args = vec![
        "--config",
        file.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
        "--store",
        "memory://",
    ];
    args.extend_from_slice(extra);
    Gateway::start(&up.url(), dir, &args).await
}

/// The names a reload's answer lists under `field`.
fn named(answer: &Answer, field: &str) -> Vec<String> {
    let json = answer.json();
    json[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field}: {json}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Without a token, `/keys` (a record, a listing, a deletion, the purge) and `/reload`
/// are 403 `admin-route-closed`, and nothing is deleted or reloaded; the probes and
/// `/metrics` are served; the log says so at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_records_and_reload_are_closed() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = with_config(&up, dir.path(), "ttl = \"1h\"\n", &[]).await;
    let http = Http::new();
    let key = new_key();
    assert_eq!(
        http.post(&gw.url("/v1/charges"), &key, "{}", &[])
            .await
            .status,
        201
    );
    let record = format!("/keys?key={key}&endpoint=POST%20/v1/charges");
    for (method, path) in [
        ("GET", record.as_str()),
        ("GET", "/keys"),
        ("GET", "/keys?state=completed"),
        ("DELETE", record.as_str()),
        ("POST", "/keys/purge-expired"),
        ("POST", "/reload"),
    ] {
        let a = admin(&http, &gw, method, path, &[]).await;
        assert_eq!(a.status, 403, "{method} {path}: {a:?}");
        assert_eq!(
            a.problem_type(),
            "https://idem.dev/problems/admin-route-closed",
            "{method} {path}"
        );
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            admin(&http, &gw, "GET", path, &[]).await.status,
            200,
            "{path}"
        );
    }
    let ready = admin(&http, &gw, "GET", "/readyz", &[]).await;
    assert_eq!(
        ready.header("idem-config-generation"),
        Some("1"),
        "no reload ran"
    );
    let replay = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert!(replay.replayed(), "the record was not deleted: {replay:?}");
    assert_eq!(up.started(&key), 1);
    assert!(
        gw.logs().contains("admin listener has no --admin-token"),
        "{}",
        gw.logs()
    );
}

/// `--admin-open` serves them without a token, and warns at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_open_serves_them_and_warns() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = with_config(&up, dir.path(), "ttl = \"1h\"\n", &["--admin-open"]).await;
    let http = Http::new();
    let key = new_key();
    http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    let listing = admin(&http, &gw, "GET", "/keys", &[]).await;
    assert_eq!(listing.status, 200, "{listing:?}");
    assert!(String::from_utf8_lossy(&listing.body).contains(&key));
    let reload = admin(&http, &gw, "POST", "/reload", &[]).await;
    assert_eq!(reload.status, 200, "{reload:?}");
    let logs = gw.logs();
    assert!(
        logs.contains("WARN") && logs.contains("--admin-open"),
        "{logs}"
    );
}

/// A request a browser marks as cross-site (`Sec-Fetch-Site`, `Origin`) is 403
/// `admin-cross-site` on every route but the probes, the right token or not; the same
/// request from the listener's own origin, or from a client that is not a browser,
/// is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_browser_request_is_refused() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let token = "cross-site-test-token-0123456789";
    let gw = with_config(&up, dir.path(), "", &["--admin-token", token]).await;
    let http = Http::new();
    let auth = bearer(token);
    let own = format!("http://{}", gw.admin.unwrap());
    let refused: [&[(&str, &str)]; 4] = [
        &[("sec-fetch-site", "cross-site")],
        &[("sec-fetch-site", "same-site")],
        &[("origin", "http://localhost:3000")],
        &[("origin", "null")],
    ];
    for browser in refused {
        for (method, path) in [
            ("POST", "/reload"),
            ("POST", "/keys/purge-expired"),
            ("GET", "/metrics"),
        ] {
            let mut headers = vec![("authorization", auth.as_str())];
            headers.extend_from_slice(browser);
            let a = admin(&http, &gw, method, path, &headers).await;
            assert_eq!(a.status, 403, "{method} {path} {browser:?}: {a:?}");
            assert_eq!(
                a.problem_type(),
                "https://idem.dev/problems/admin-cross-site"
            );
        }
        let probe = admin(&http, &gw, "GET", "/healthz", browser).await;
        assert_eq!(probe.status, 200, "probes are not checked");
    }
    let ready = admin(&http, &gw, "GET", "/readyz", &[]).await;
    assert_eq!(
        ready.header("idem-config-generation"),
        Some("1"),
        "no reload ran"
    );
    let allowed: [&[(&str, &str)]; 3] = [
        &[("sec-fetch-site", "same-origin"), ("origin", own.as_str())],
        &[("sec-fetch-site", "none")],
        &[],
    ];
    for browser in allowed {
        let mut headers = vec![("authorization", auth.as_str())];
        headers.extend_from_slice(browser);
        let a = admin(&http, &gw, "POST", "/keys/purge-expired", &headers).await;
        assert_eq!(a.status, 200, "{browser:?}: {a:?}");
    }
}

/// A new admin token in the file is put in force by the reload: the answer names
/// `admin_token` as applied, and from then on the old token is refused and the new one
/// served; the same with the token in a file of its own, rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_admin_token_replaces_the_old_one_at_once() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = ("old-admin-token-0123456789", "new-admin-token-9876543210");
    let gw = with_config(&up, dir.path(), &format!("admin_token = \"{old}\"\n"), &[]).await;
    let http = Http::new();
    let (old_auth, new_auth) = (bearer(old), bearer(new));
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, format!("admin_token = \"{new}\"\n")).unwrap();
    let done = admin(
        &http,
        &gw,
        "POST",
        "/reload",
        &[("authorization", &old_auth)],
    )
    .await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(
        named(&done, "applied"),
        ["admin_token"],
        "{:?}",
        done.json()
    );
    assert!(named(&done, "restart_required").is_empty());
    for path in ["/metrics", "/keys"] {
        let a = admin(&http, &gw, "GET", path, &[("authorization", &old_auth)]).await;
        assert_eq!(a.status, 401, "the old token is refused on {path}: {a:?}");
        let a = admin(&http, &gw, "GET", path, &[("authorization", &new_auth)]).await;
        assert_eq!(a.status, 200, "the new token is served on {path}: {a:?}");
    }

    // The token in a file of its own, whose contents change.
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{old}\n")).unwrap();
    set_private(&token_file);
    std::fs::write(&file, "admin_token_file = \"admin.token\"\n").unwrap();
    let done = admin(
        &http,
        &gw,
        "POST",
        "/reload",
        &[("authorization", &new_auth)],
    )
    .await;
    assert_eq!(done.status, 200, "{done:?}");
    std::fs::write(&token_file, format!("{new}\n")).unwrap();
    let done = admin(
        &http,
        &gw,
        "POST",
        "/reload",
        &[("authorization", &old_auth)],
    )
    .await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(
        named(&done, "applied"),
        ["admin_token"],
        "{:?}",
        done.json()
    );
    let a = admin(
        &http,
        &gw,
        "GET",
        "/metrics",
        &[("authorization", &old_auth)],
    )
    .await;
    assert_eq!(a.status, 401, "the file's old token is refused: {a:?}");
    let a = admin(
        &http,
        &gw,
        "GET",
        "/metrics",
        &[("authorization", &new_auth)],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
}

fn set_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `path` in `dir`, written with `contents` and readable by its owner alone.
fn private_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    set_private(&path);
    path
}

const TOKEN: &str = "secrets-test-admin-token-0123456789";

/// The tenant secret's file and the record key file rewritten with other secrets (the
/// same paths): the reload names both in `restart_required` and keeps the running
/// ones, so a key recorded before it still replays, opened with the key in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tenant_and_record_secrets_are_named_as_taking_a_restart() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    private_file(dir.path(), "tenant.secret", &"a".repeat(40));
    private_file(
        dir.path(),
        "records.keys",
        &format!("k1:{}\n", "11".repeat(32)),
    );
    let config = "tenant_secret_file = \"tenant.secret\"\nrecord_key_file = \"records.keys\"\n";
    let gw = with_config(&up, dir.path(), config, &["--admin-token", TOKEN]).await;
    let http = Http::new();
    let auth = bearer(TOKEN);
    let tenant = ("authorization", "Bearer sk_live_secrets");
    let key = new_key();
    let first = http
        .post(&gw.url("/v1/charges"), &key, "{}", &[tenant])
        .await;
    assert_eq!(first.status, 201);

    private_file(dir.path(), "tenant.secret", &"b".repeat(40));
    private_file(
        dir.path(),
        "records.keys",
        &format!("k1:{}\n", "22".repeat(32)),
    );
    let done = admin(&http, &gw, "POST", "/reload", &[("authorization", &auth)]).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(
        named(&done, "restart_required"),
        ["tenant_secret_file", "record_key_file"],
        "{:?}",
        done.json()
    );
    assert!(named(&done, "applied").is_empty(), "{:?}", done.json());
    let replay = http
        .post(&gw.url("/v1/charges"), &key, "{}", &[tenant])
        .await;
    assert!(
        replay.replayed(),
        "the running tenant secret and record key stay: {replay:?}"
    );
    assert_eq!(up.started(&key), 1);
    assert!(gw.logs().contains("take a restart"), "{}", gw.logs());
}

/// The HS256 secret's file rewritten: the reload names it as applied, and from then on
/// a token signed with the old secret is 401 and one signed with the new is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_hs256_secret_is_applied_and_the_old_one_refused() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = ([b'o'; 40], [b'n'; 40]);
    std::fs::write(dir.path().join("hs.secret"), old).unwrap();
    set_private(&dir.path().join("hs.secret"));
    let config = "tenant_from = \"jwt\"\njwt_hs256_secret_file = \"hs.secret\"\n";
    let gw = with_config(&up, dir.path(), config, &["--admin-token", TOKEN]).await;
    let http = Http::new();
    let claims = json!({"sub": "cus_hs", "iat": epoch(0), "exp": epoch(300)});
    let charge = |secret: &[u8]| {
        let token = bearer(&Signer::hs256("k", secret).sign(&claims));
        let (http, url) = (http.clone(), gw.url("/v1/charges"));
        async move {
            http.post(&url, &new_key(), "{}", &[("authorization", &token)])
                .await
        }
    };
    assert_eq!(charge(&old).await.status, 201);

    std::fs::write(dir.path().join("hs.secret"), new).unwrap();
    let auth = bearer(TOKEN);
    let done = admin(&http, &gw, "POST", "/reload", &[("authorization", &auth)]).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(
        named(&done, "applied"),
        ["jwt_hs256_secret_file"],
        "{:?}",
        done.json()
    );
    let refused = charge(&old).await;
    assert_eq!(
        refused.status, 401,
        "the old secret is refused: {refused:?}"
    );
    assert_eq!(charge(&new).await.status, 201);
}

/// A store URL whose password alone changes (the file's form hides it) is named in
/// `restart_required`; the store in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_store_password_is_named_as_taking_a_restart() {
    let Some(base) = crate::shared::postgres().await else {
        return;
    };
    // The server trusts local connections: the password is not checked.
    let with_password = |password: &str| {
        let (scheme, rest) = base.split_once("://").unwrap();
        let (user, host) = match rest.split_once('@') {
            Some((userinfo, host)) => (userinfo.split(':').next().unwrap(), host),
            None => ("postgres", rest),
        };
        format!("{scheme}://{user}:{password}@{host}")
    };
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let namespace = format!("admin_access_{}", std::process::id());
    let config = |password: &str| {
        format!(
            "store = \"{}\"\nstore_namespace = \"{namespace}\"\n",
            with_password(password)
        )
    };
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, config("first-password")).unwrap();
    let args = [
        "--config",
        file.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
        "--admin-token",
        TOKEN,
    ];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let http = Http::new();
    std::fs::write(&file, config("second-password")).unwrap();
    let auth = bearer(TOKEN);
    let done = admin(&http, &gw, "POST", "/reload", &[("authorization", &auth)]).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(
        named(&done, "restart_required"),
        ["store"],
        "{:?}",
        done.json()
    );
    let body = String::from_utf8_lossy(&done.body);
    assert!(!body.contains("password"), "no secret is shown: {body}");
    assert_eq!(
        http.post(&gw.url("/v1/charges"), &new_key(), "{}", &[])
            .await
            .status,
        201,
        "the store in force serves"
    );
}
