//! The tenant from a verified bearer token (`--tenant-from jwt`, issue 39 §1): a
//! client whose answer was lost refreshes its access token and retries with the same
//! key; the retry replays and the upstream ran once. On the default (`headers`, a
//! digest of `Authorization`) that retry is a new tenant and executes again, which the
//! last test shows. Forged and expired tokens are 401 and reach nobody; a rotated key
//! is picked up from a file and from a URL without a restart.

use std::path::Path;

use idem_test_support::jwt::{Signer, epoch, jwks};
use serde_json::{Value, json};

use crate::common::{Answer, Gateway, Http, Upstream, idem_in, new_key};
use crate::jwks::JwksServer;

pub(crate) const ISSUER: &str = "https://login.example.test/";

pub(crate) fn claims(sub: &str, jti: &str) -> Value {
    json!({
        "iss": ISSUER, "aud": "payments", "sub": sub, "jti": jti,
        "iat": epoch(0), "exp": epoch(300),
    })
}

fn write_jwks(dir: &Path, signers: &[&Signer]) {
    std::fs::write(dir.join("jwks.json"), jwks(signers).to_string()).unwrap();
}

/// The gateway verifying tokens against `jwks.json` in `dir`.
async fn gateway(up: &Upstream, dir: &Path, extra: &[&str]) -> Gateway {
    let mut args = vec![
        "--tenant-from",
        "jwt",
        "--jwt-jwks-file",
        "jwks.json",
        "--jwt-issuer",
        ISSUER,
        "--jwt-audience",
        "payments",
    ];
    args.extend_from_slice(extra);
    Gateway::start(&up.url(), dir, &args).await
}

pub(crate) async fn charge(http: &Http, gw: &Gateway, key: &str, token: &str) -> Answer {
    let bearer = format!("Bearer {token}");
    http.post(
        &gw.url("/v1/charges"),
        key,
        r#"{"amount":100}"#,
        &[("authorization", bearer.as_str())],
    )
    .await
}

#[tokio::test]
async fn a_retry_after_a_token_refresh_replays_and_the_upstream_ran_once() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ed = Signer::ed25519("2026-12");
    let ec = Signer::es256("2026-11");
    write_jwks(dir.path(), &[&ed, &ec]);
    let gw = gateway(&up, dir.path(), &[]).await;
    let http = Http::new();
    let key = new_key();

    let token = ed.sign(&claims("cus_alice", "t1"));
    let first = charge(&http, &gw, &key, &token).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    // The answer was lost; the client refreshed its token (a new token, the same
    // principal, signed with the issuer's other key) and retries with its key.
    let refreshed = ec.sign(&claims("cus_alice", "t2"));
    let retry = charge(&http, &gw, &key, &refreshed).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed(), "the retry replays: {retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(up.started(&key), 1, "the upstream ran once");

    // Another principal with the same key is another tenant: its own execution.
    let bob = charge(&http, &gw, &key, &ed.sign(&claims("cus_bob", "t3"))).await;
    assert_eq!(bob.status, 201);
    assert!(!bob.replayed());
    assert_eq!(up.started(&key), 2);
    // The upstream still gets the token as sent: it authenticates as before.
    assert_eq!(
        up.seen()[0].headers["authorization"],
        format!("Bearer {token}").as_str()
    );
}

#[tokio::test]
async fn forged_and_expired_tokens_are_401_and_never_reach_the_upstream() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ed = Signer::ed25519("k1");
    write_jwks(dir.path(), &[&ed]);
    let gw = gateway(&up, dir.path(), &[]).await;
    let http = Http::new();
    let key = new_key();

    // A key the issuer never had, under the issuer's kid.
    let forger = Signer::ed25519("k1");
    let mut expired = claims("cus_alice", "old");
    expired["exp"] = json!(epoch(-600));
    let mut elsewhere = claims("cus_alice", "t1");
    elsewhere["aud"] = json!("reports");
    for (what, token) in [
        ("forged", forger.sign(&claims("cus_alice", "t1"))),
        ("expired", ed.sign(&expired)),
        ("another audience", ed.sign(&elsewhere)),
        ("not even base64", "abc.def.ghi".to_owned()),
    ] {
        let answer = charge(&http, &gw, &key, &token).await;
        assert_eq!(answer.status, 401, "{what}: {answer:?}");
        assert_eq!(
            answer.problem_type(),
            "https://idem.dev/problems/invalid-credential",
            "{what}"
        );
        assert_eq!(
            answer.header("www-authenticate"),
            Some("Bearer error=\"invalid_token\""),
            "{what}"
        );
        assert!(
            answer.header("content-type") == Some("application/problem+json"),
            "{what}: {answer:?}"
        );
    }
    assert_eq!(up.total(), 0, "no refused token reached the upstream");
    // A genuine token still executes the key the refusals never reserved.
    let ok = charge(&http, &gw, &key, &ed.sign(&claims("cus_alice", "t9"))).await;
    assert_eq!(ok.status, 201, "{ok:?}");
    assert!(!ok.replayed());
    // An unkeyed request is not looked at: the upstream authenticates it.
    let read = http
        .send(
            "GET",
            &gw.url("/v1/charges"),
            &[("authorization", "Bearer abc.def.ghi")],
            "",
        )
        .await;
    assert_eq!(read.status, 201);
    assert_eq!(up.total(), 2);
}

/// An unsigned token (`alg: none`) and the algorithm confusion (an HS256 token whose
/// secret is the issuer's published public key) are 401 and reach nobody, though the
/// gateway holds an HS256 secret of its own beside the key set.
#[tokio::test]
async fn alg_none_and_a_public_key_as_an_hs256_secret_are_401() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ed = Signer::ed25519("k1");
    write_jwks(dir.path(), &[&ed]);
    std::fs::write(dir.path().join("secret"), [b'k'; 40]).unwrap();
    let gw = gateway(&up, dir.path(), &["--jwt-hs256-secret-file", "secret"]).await;
    let http = Http::new();
    let body = claims("cus_alice", "t1");
    let none = ed.sign_with_header(&json!({"alg": "none", "kid": "k1"}), &body);
    let unsigned = format!("{}.", none.rsplit_once('.').unwrap().0);
    let jwk = ed.jwk();
    let confused = |secret: &[u8]| Signer::hs256("k1", secret).sign(&body);
    for (what, token) in [
        ("alg none, signed", none.clone()),
        ("alg none, unsigned", unsigned),
        (
            "the public key as the secret",
            confused(jwk["x"].as_str().unwrap().as_bytes()),
        ),
        (
            "the JWK as the secret",
            confused(jwk.to_string().as_bytes()),
        ),
    ] {
        let answer = charge(&http, &gw, &new_key(), &token).await;
        assert_eq!(answer.status, 401, "{what}: {answer:?}");
        assert_eq!(
            answer.problem_type(),
            "https://idem.dev/problems/invalid-credential",
            "{what}"
        );
    }
    assert_eq!(up.total(), 0, "no refused token reached the upstream");
    let hs = Signer::hs256("any", &[b'k'; 40]).sign(&body);
    assert_eq!(charge(&http, &gw, &new_key(), &hs).await.status, 201);
}

#[tokio::test]
async fn a_rotated_key_in_the_jwks_file_is_used_without_a_restart() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = Signer::es256("2026-11");
    write_jwks(dir.path(), &[&old]);
    let gw = gateway(&up, dir.path(), &[]).await;
    let http = Http::new();
    let first = charge(&http, &gw, &new_key(), &old.sign(&claims("a", "1"))).await;
    assert_eq!(first.status, 201);
    let new = Signer::ed25519("2026-12");
    write_jwks(dir.path(), &[&old, &new]);
    let rotated = charge(&http, &gw, &new_key(), &new.sign(&claims("a", "2"))).await;
    assert_eq!(rotated.status, 201, "{rotated:?}\n{}", gw.logs());
}

#[tokio::test]
async fn keys_from_a_jwks_url_are_fetched_again_when_a_token_names_a_new_one() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = Signer::ed25519("old");
    let server = JwksServer::start(jwks(&[&old]), std::time::Duration::ZERO).await;
    let url = server.url();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--tenant-from", "jwt", "--jwt-jwks-url", &url],
    )
    .await;
    assert_eq!(server.fetches(), 1, "fetched once at start");
    let http = Http::new();
    let key = new_key();
    let first = charge(&http, &gw, &key, &old.sign(&claims("cus_1", "a"))).await;
    assert_eq!(first.status, 201);
    assert_eq!(server.fetches(), 1, "a known key fetches nothing");

    let new = Signer::es256("new");
    server.serve(jwks(&[&old, &new]));
    let retry = charge(&http, &gw, &key, &new.sign(&claims("cus_1", "b"))).await;
    assert_eq!(retry.status, 201, "{retry:?}\n{}", gw.logs());
    assert!(retry.replayed(), "same principal, new key: a replay");
    assert_eq!(up.started(&key), 1);
    assert_eq!(server.fetches(), 2, "fetched again for the new kid");
}

#[test]
fn settings_that_cannot_verify_a_token_stop_the_start_and_say_which() {
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "memory://",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let out = idem_in(dir.path(), &args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A key without `jwt` in tenant_from would verify nothing: said, not ignored.
    let (code, err) = run(&["--jwt-jwks-file", "jwks.json"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("jwt_jwks_file") && err.contains("tenant_from"),
        "{err}"
    );
    // `jwt` with nothing to verify with.
    let (code, err) = run(&["--tenant-from", "jwt"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("jwt_jwks_file, jwt_jwks_url or"), "{err}");
    let (code, err) = run(&["--tenant-from", "headers,jwt"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("in the order jwt, cert, headers"), "{err}");
    // No such file, or not a key set.
    let (code, err) = run(&["--tenant-from", "jwt", "--jwt-jwks-file", "missing.json"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("jwt_jwks_file") && err.contains("missing.json"),
        "{err}"
    );
    std::fs::write(dir.path().join("bad.json"), "{\"keys\": 1}").unwrap();
    let (code, err) = run(&["--tenant-from", "jwt", "--jwt-jwks-file", "bad.json"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no \"keys\" array"), "{err}");
    // A short HS256 secret; a JWKS in the clear from elsewhere than loopback.
    std::fs::write(dir.path().join("short"), "0123456789").unwrap();
    let (code, err) = run(&["--tenant-from", "jwt", "--jwt-hs256-secret-file", "short"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("at least 32"), "{err}");
    let (code, err) = run(&[
        "--tenant-from",
        "jwt",
        "--jwt-jwks-url",
        "http://issuer.example/jwks",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("https://"), "{err}");
    // A URL that cannot be fetched now is a failure at run time, after its retries.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/jwks");
    let (code, err) = run(&["--tenant-from", "jwt", "--jwt-jwks-url", &url]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("jwt_jwks_url") && err.contains("tried 3 times"),
        "{err}"
    );
}

/// Today's default, for contrast: the tenant is a digest of `Authorization`, so the
/// same refresh makes the retry another tenant's, and it executes again. (Behind
/// long-lived API keys, as Stripe's, the digest is what is wanted.)
#[tokio::test]
async fn on_the_default_a_refreshed_token_is_another_tenant() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &[]).await;
    let http = Http::new();
    let key = new_key();
    let ed = Signer::ed25519("k");
    assert_eq!(
        charge(&http, &gw, &key, &ed.sign(&claims("cus_alice", "t1")))
            .await
            .status,
        201
    );
    let retry = charge(&http, &gw, &key, &ed.sign(&claims("cus_alice", "t2"))).await;
    assert!(!retry.replayed());
    assert_eq!(up.started(&key), 2, "executed twice: the digest changed");
    // HS256 from a secret file, and a request without a bearer token named by its
    // headers (`jwt,headers`): a second gateway on its own store.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), [b'k'; 40]).unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--tenant-from",
            "jwt,headers",
            "--jwt-hs256-secret-file",
            "secret",
        ],
    )
    .await;
    let hs = Signer::hs256("any", &[b'k'; 40]);
    let key = new_key();
    let first = charge(&http, &gw, &key, &hs.sign(&claims("cus_alice", "t1"))).await;
    assert_eq!(first.status, 201, "{first:?}");
    let retry = charge(&http, &gw, &key, &hs.sign(&claims("cus_alice", "t2"))).await;
    assert!(retry.replayed(), "{retry:?}");
    let api_key = http
        .post(
            &gw.url("/v1/charges"),
            &key,
            r#"{"amount":100}"#,
            &[("authorization", "Basic c2tfbGl2ZTo=")],
        )
        .await;
    assert!(!api_key.replayed(), "another tenant, by its header digest");
    assert_eq!(up.started(&key), 2);
}

/// Sources per route: the gateway names tenants by their headers, but one route's
/// `tenant_from = ["jwt", "headers"]` names them by a verified token there. On that
/// route a retry after a refresh replays, and a forged token is 401; on the others the
/// headers still decide (a refreshed token there is a new tenant), and no token is
/// verified.
#[tokio::test]
async fn a_route_names_its_tenant_from_its_own_sources() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ed = Signer::ed25519("2026-12");
    write_jwks(dir.path(), &[&ed]);
    std::fs::write(
        dir.path().join("idem.toml"),
        "[[route]]\nmethod = \"POST\"\npath = \"/v1/payments\"\ntenant_from = [\"jwt\", \"headers\"]\n",
    )
    .unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--config",
            "idem.toml",
            "--jwt-jwks-file",
            "jwks.json",
            "--jwt-issuer",
            ISSUER,
            "--jwt-audience",
            "payments",
        ],
    )
    .await;
    let http = Http::new();
    let post = |path: &'static str, key: String, token: String| {
        let (http, url) = (http.clone(), gw.url(path));
        async move {
            let bearer = format!("Bearer {token}");
            http.post(&url, &key, "{}", &[("authorization", bearer.as_str())])
                .await
        }
    };
    let (t1, t2) = (
        ed.sign(&claims("cus_route", "r1")),
        ed.sign(&claims("cus_route", "r2")),
    );

    let key = new_key();
    assert_eq!(
        post("/v1/payments", key.clone(), t1.clone()).await.status,
        201
    );
    let retry = post("/v1/payments", key.clone(), t2.clone()).await;
    assert!(
        retry.replayed(),
        "the route's tenant is the token's sub: {retry:?}"
    );
    assert_eq!(up.started(&key), 1);
    let forged = post("/v1/payments", new_key(), format!("{t1}x")).await;
    assert_eq!(forged.status, 401, "{forged:?}");

    let other = new_key();
    assert_eq!(
        post("/v1/charges", other.clone(), t1.clone()).await.status,
        201
    );
    let refreshed = post("/v1/charges", other.clone(), t2).await;
    assert!(
        !refreshed.replayed(),
        "the headers decide there: {refreshed:?}"
    );
    assert_eq!(up.started(&other), 2);
    let unverified = post("/v1/charges", new_key(), format!("{t1}x")).await;
    assert_eq!(unverified.status, 201, "no token is verified there");
}
