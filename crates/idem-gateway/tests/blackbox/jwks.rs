//! The JWKS the gateway verifies bearer tokens with, against a real, slow HTTP
//! endpoint on 127.0.0.1 (issue 61 items 2, 6 and 7): tokens naming unknown `kid`s
//! share one fetch instead of queueing one each, a request waits for keys at most
//! `--jwt-jwks-wait`, a key of an algorithm the gateway does not verify is skipped
//! rather than making the whole set refused, and a number claim is not the tenant of
//! the same digits as a string.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_test_support::jwt::{Signer, jwks};
use idem_test_support::{WAIT, eventually};
use serde_json::{Value, json};

use crate::common::{Answer, Gateway, Http, Upstream, idem_in, metric, metrics, new_key};
use crate::jwt::{ISSUER, charge, claims};

/// A JWKS document served on 127.0.0.1, swappable, each answer `delay` late; its
/// fetches counted, and the most going on at once. Stopped on drop.
pub(crate) struct JwksServer {
    port: u16,
    doc: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    pub(crate) async fn start(doc: Value, delay: Duration) -> JwksServer {
        JwksServer::start_on(0, doc, delay).await
    }

    /// [`start`](Self::start) on the loopback port `port` (0 for any).
    pub(crate) async fn start_on(port: u16, doc: Value, delay: Duration) -> JwksServer {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let doc = Arc::new(Mutex::new(doc.to_string()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let most_at_once = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(AtomicUsize::new(0));
        let (d, f, m) = (doc.clone(), fetches.clone(), most_at_once.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (d, f, m, now) = (d.clone(), f.clone(), m.clone(), now.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    f.fetch_add(1, Ordering::SeqCst);
                    m.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    // The document as it is when the fetch arrives, answered late.
                    let body = d.lock().unwrap().clone();
                    tokio::time::sleep(delay).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body.as_bytes()).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        JwksServer {
            port,
            doc,
            fetches,
            most_at_once,
            task,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/.well-known/jwks.json", self.port)
    }

    pub(crate) fn serve(&self, doc: Value) {
        *self.doc.lock().unwrap() = doc.to_string();
    }

    /// The fetches that have arrived.
    pub(crate) fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// The most fetches that were going on at once.
    pub(crate) fn most_at_once(&self) -> usize {
        self.most_at_once.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the slow endpoint takes to answer.
const FETCH: Duration = Duration::from_millis(1500);

/// The gateway verifying tokens against `server`, with its admin listener.
async fn gateway(
    up: &Upstream,
    dir: &std::path::Path,
    server: &JwksServer,
    extra: &[&str],
) -> Gateway {
    let url = server.url();
    let mut args = vec![
        "--tenant-from",
        "jwt",
        "--jwt-jwks-url",
        url.as_str(),
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Gateway::start(&up.url(), dir, &args).await
}

/// `token` sent as a charge by a task of its own: its answer, and when it came after
/// `since`.
fn send(
    http: &Http,
    gw: &Gateway,
    token: String,
    since: Instant,
) -> tokio::task::JoinHandle<(Answer, Duration)> {
    let (http, url) = (http.clone(), gw.url("/v1/charges"));
    tokio::spawn(async move {
        let bearer = format!("Bearer {token}");
        let answer = http
            .post(
                &url,
                &new_key(),
                r#"{"amount":100}"#,
                &[("authorization", bearer.as_str())],
            )
            .await;
        (answer, since.elapsed())
    })
}

/// Tokens naming `n` kids the issuer never had, as a client minting them would send.
fn strangers(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| Signer::ed25519(&format!("random-{i}-{}", new_key())).sign(&claims("cus_1", "x")))
        .collect()
}

fn assert_refused(answer: &Answer) {
    assert_eq!(answer.status, 401, "{answer:?}");
    assert_eq!(
        answer.problem_type(),
        "https://idem.dev/problems/invalid-credential"
    );
}

/// The gateway's own fault: the token could not be checked, and may verify on a retry.
fn assert_unavailable(answer: &Answer) {
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(
        answer.problem_type(),
        "https://idem.dev/problems/credential-unavailable"
    );
    assert_eq!(answer.header("retry-after"), Some("1"), "{answer:?}");
}

/// Issue 61 item 2: tokens with random `kid`s against a slow JWKS endpoint share one
/// fetch, all answered 401 when it ends (on main each fetched in turn behind one lock:
/// answers at 1.5, 3.0, 4.5 … s and a fetch each); a kid still unknown right after is
/// refused at once, with no fetch. The fetches are counted in the metrics.
#[tokio::test]
async fn tokens_naming_unknown_kids_share_one_fetch_of_a_slow_jwks() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = Signer::ed25519("old");
    let server = JwksServer::start(jwks(&[&old]), FETCH).await;
    let gw = gateway(&up, dir.path(), &server, &[]).await;
    assert_eq!(server.fetches(), 1, "fetched once at start");
    let http = Http::new();

    let began = Instant::now();
    let sent: Vec<_> = strangers(6)
        .into_iter()
        .map(|t| send(&http, &gw, t, began))
        .collect();
    for task in sent {
        let (answer, after) = task.await.unwrap();
        assert_refused(&answer);
        assert!(
            after < 2 * FETCH,
            "answered after {after:?}: all are answered before a second fetch could have ended"
        );
    }
    assert_eq!(server.fetches(), 2, "one fetch for all six");
    assert_eq!(server.most_at_once(), 1);

    // Right after a fresh fetch, a kid it did not have is refused without another.
    let again = Instant::now();
    let answer = charge(&http, &gw, &new_key(), &strangers(1)[0]).await;
    assert_refused(&answer);
    assert!(
        again.elapsed() < FETCH,
        "refused at once: {:?}",
        again.elapsed()
    );
    assert_eq!(server.fetches(), 2);
    assert_eq!(up.total(), 0);

    let m = metrics(&http, &gw).await;
    assert_eq!(
        metric(&m, "idem_jwks_fetches_total{cause=\"start\"}"),
        Some(1)
    );
    assert_eq!(
        metric(&m, "idem_jwks_fetches_total{cause=\"unknown_kid\"}"),
        Some(1)
    );
    assert_eq!(
        metric(&m, "idem_jwks_fetch_failures_total{cause=\"unknown_kid\"}"),
        Some(0)
    );
    assert_eq!(metric(&m, "idem_jwks_wait_timeouts_total"), Some(0));
}

/// Issue 61 item 2: after a real rotation, a token with the new `kid` that arrives
/// while strangers' tokens wait for a fetch joins that fetch, and is answered when it
/// ends, not behind a queue of fetches (on main it waited for one fetch per stranger
/// ahead of it).
#[tokio::test]
async fn a_newly_published_kid_is_not_stuck_behind_strangers() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = Signer::ed25519("old");
    let server = JwksServer::start(jwks(&[&old]), FETCH).await;
    let gw = gateway(&up, dir.path(), &server, &[]).await;
    let http = Http::new();
    let new = Signer::es256("2026-12");
    server.serve(jwks(&[&old, &new]));

    let began = Instant::now();
    let sent: Vec<_> = strangers(5)
        .into_iter()
        .map(|t| send(&http, &gw, t, began))
        .collect();
    eventually("the strangers' fetch began", WAIT, async || {
        server.fetches() == 2
    })
    .await;
    let rotated = Instant::now();
    let (answer, after) = send(&http, &gw, new.sign(&claims("cus_1", "n")), rotated)
        .await
        .unwrap();
    assert_eq!(answer.status, 201, "{answer:?}\n{}", gw.logs());
    assert!(after < 2 * FETCH, "the new kid waited {after:?}");
    for task in sent {
        assert_refused(&task.await.unwrap().0);
    }
    assert_eq!(
        server.fetches(),
        2,
        "the new kid shared the strangers' fetch"
    );
    assert_eq!(up.total(), 1);
}

/// Issue 61 item 2: a request waits for keys at most `--jwt-jwks-wait`, and is then
/// answered 503 `credential-unavailable` with `Retry-After`, saying why (the keys are
/// late, not the token bad: a 401 would make the client give up on a good token); the
/// fetch goes on, and the same token verifies once it has ended, with no fetch of its
/// own.
#[tokio::test]
async fn a_request_waits_for_a_slow_jwks_at_most_jwt_jwks_wait() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = Signer::ed25519("old");
    let server = JwksServer::start(jwks(&[&old]), FETCH).await;
    let gw = gateway(&up, dir.path(), &server, &["--jwt-jwks-wait", "200ms"]).await;
    let http = Http::new();
    let new = Signer::es256("2026-12");
    server.serve(jwks(&[&old, &new]));
    let token = new.sign(&claims("cus_1", "n"));

    let began = Instant::now();
    let late = charge(&http, &gw, &new_key(), &token).await;
    assert!(began.elapsed() < FETCH, "waited {:?}", began.elapsed());
    assert_unavailable(&late);
    let body = String::from_utf8_lossy(&late.body).into_owned();
    assert!(body.contains("did not load within 200ms"), "{body}");

    eventually("the fetch ended", WAIT, async || {
        let m = metrics(&http, &gw).await;
        metric(&m, "idem_jwks_fetches_total{cause=\"unknown_kid\"}") == Some(1)
    })
    .await;
    let ok = charge(&http, &gw, &new_key(), &token).await;
    assert_eq!(ok.status, 201, "{ok:?}");
    assert_eq!(server.fetches(), 2);
    let m = metrics(&http, &gw).await;
    assert_eq!(metric(&m, "idem_jwks_wait_timeouts_total"), Some(1));
}

/// A JWKS endpoint that is down: a token naming a kid the held set lacks cannot be
/// checked, which is the gateway's fault, not the client's: 503
/// `credential-unavailable` with `Retry-After` (it was a 401, and the client gave up
/// on a good token), at once again right after the failed fetch. A token the held set
/// can check and refuses is still 401. Once the endpoint is back, the same token
/// verifies; nothing was forwarded before.
#[tokio::test]
async fn a_jwks_that_cannot_be_fetched_is_503_and_a_bad_token_still_401() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = Signer::ed25519("old");
    let server = JwksServer::start(jwks(&[&old]), Duration::ZERO).await;
    let port = server.port;
    let gw = gateway(&up, dir.path(), &server, &[]).await;
    let http = Http::new();
    drop(server);
    eventually("the JWKS endpoint is down", WAIT, async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
    })
    .await;

    let new = Signer::es256("2026-12");
    let token = new.sign(&claims("cus_1", "n"));
    let down = charge(&http, &gw, &new_key(), &token).await;
    assert_unavailable(&down);
    let body = String::from_utf8_lossy(&down.body).into_owned();
    assert!(body.contains("could not be loaded"), "{body}");
    assert!(!body.contains(&port.to_string()), "no address told: {body}");
    assert_unavailable(&charge(&http, &gw, &new_key(), &token).await);
    // Another key under the held kid: checked, and refused.
    let forged = Signer::ed25519("old").sign(&claims("cus_1", "f"));
    assert_refused(&charge(&http, &gw, &new_key(), &forged).await);
    assert_eq!(up.total(), 0);

    let _back = JwksServer::start_on(port, jwks(&[&old, &new]), Duration::ZERO).await;
    let key = new_key();
    eventually(
        "the token verifies once the JWKS is back",
        WAIT,
        async || {
            let answer = charge(&http, &gw, &key, &token).await;
            if answer.status != 201 {
                assert_unavailable(&answer);
            }
            answer.status == 201
        },
    )
    .await;
    assert_eq!(up.total(), 1);
    let m = metrics(&http, &gw).await;
    let failed = metric(&m, "idem_jwks_fetch_failures_total{cause=\"unknown_kid\"}");
    assert!(failed >= Some(1), "{m}");
}

/// An RSA public key as a JWK for `alg`: the gateway skips it without reading it.
fn rsa_jwk(kid: &str, alg: &str) -> Value {
    // 256 bytes of 0xc5, in base64url.
    let n = format!("{}xQ", "xcXF".repeat(85));
    json!({"kty": "RSA", "use": "sig", "kid": kid, "alg": alg, "n": n, "e": "AQAB"})
}

/// A JWKS of `keys` as they are.
fn set_of(keys: &[Value]) -> Value {
    json!({ "keys": keys })
}

/// Issue 61 item 7: a key for `PS256` or `RS512` in the JWKS is skipped with a warning
/// naming its kid and alg, and the rest of the set used: at start (on main the gateway
/// would not start) and on a refresh (on main the whole new set was refused, so a
/// rotation published with such a key was never picked up). A set of such keys alone
/// stops the start, naming them.
#[tokio::test]
async fn keys_of_algorithms_the_gateway_does_not_verify_are_skipped() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = Http::new();
    let ed = Signer::ed25519("ed-1");
    std::fs::write(
        dir.path().join("jwks.json"),
        set_of(&[rsa_jwk("ps-1", "PS256"), ed.jwk()]).to_string(),
    )
    .unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--tenant-from", "jwt", "--jwt-jwks-file", "jwks.json"],
    )
    .await;
    let ok = charge(&http, &gw, &new_key(), &ed.sign(&claims("cus_1", "a"))).await;
    assert_eq!(ok.status, 201, "{ok:?}");
    let logs = gw.logs();
    let warning = logs
        .lines()
        .find(|l| l.contains("skipping a JWKS key"))
        .unwrap_or_else(|| panic!("no warning:\n{logs}"));
    assert!(
        warning.contains("ps-1") && warning.contains("PS256"),
        "{warning}"
    );
    drop(gw);

    // Such keys alone: nothing to verify with, said with their names.
    std::fs::write(
        dir.path().join("ps.json"),
        set_of(&[rsa_jwk("ps-1", "PS256")]).to_string(),
    )
    .unwrap();
    let out = idem_in(
        dir.path(),
        &[
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory://",
            "--tenant-from",
            "jwt",
            "--jwt-jwks-file",
            "ps.json",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no RS256, ES256 or EdDSA signing key") && err.contains("\"ps-1\" (PS256)"),
        "{err}"
    );

    // A rotation published together with an RS512 key, from a URL.
    let server = JwksServer::start(jwks(&[&ed]), Duration::ZERO).await;
    let gw = gateway(&up, dir.path(), &server, &[]).await;
    let new = Signer::es256("2026-12");
    server.serve(set_of(&[ed.jwk(), rsa_jwk("rs-512", "RS512"), new.jwk()]));
    let rotated = charge(&http, &gw, &new_key(), &new.sign(&claims("cus_1", "b"))).await;
    assert_eq!(rotated.status, 201, "{rotated:?}\n{}", gw.logs());
    let logs = gw.logs();
    assert!(
        logs.lines().any(|l| l.contains("skipping a JWKS key")
            && l.contains("rs-512")
            && l.contains("RS512")),
        "{logs}"
    );
}

/// Issue 61 item 6: with `--jwt-claims sub,org`, the number `1` and the string `"1"`
/// are two tenants (on main they shared records), and `1.0` is the number `1`. A string
/// claim's tenant is the one it always was: the record of `{"sub": "1"}` is under the
/// tenant the principal `sub = "1"`, `org = "acme"` has always had, so no live record
/// is orphaned on upgrade.
#[tokio::test]
async fn a_number_claim_and_the_same_digits_as_a_string_are_two_tenants() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = [b'k'; 40];
    std::fs::write(dir.path().join("secret"), secret).unwrap();
    let tenant_secret = "0123456789abcdef0123456789abcdef-jwks";
    let gw = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &[
            "--tenant-from",
            "jwt",
            "--jwt-hs256-secret-file",
            "secret",
            "--jwt-claims",
            "sub,org",
            "--admin",
            "127.0.0.1:0",
            // The record listing shows every tenant's records: open only on purpose.
            "--admin-open",
        ],
        &[("IDEM_TENANT_SECRET", tenant_secret)],
    )
    .await;
    let http = Http::new();
    let hs = Signer::hs256("any", &secret);
    let token = |sub: Value| {
        let mut c = claims("", "t");
        c["sub"] = sub;
        c["org"] = json!("acme");
        hs.sign(&c)
    };
    let key = new_key();
    let string = charge(&http, &gw, &key, &token(json!("1"))).await;
    assert_eq!(string.status, 201, "{string:?}");
    let number = charge(&http, &gw, &key, &token(json!(1))).await;
    assert_eq!(number.status, 201, "{number:?}");
    assert!(
        !number.replayed(),
        "the number is another tenant: {number:?}"
    );
    assert_eq!(up.started(&key), 2);
    let float = charge(&http, &gw, &key, &token(json!(1.0))).await;
    assert!(float.replayed(), "1.0 is the number 1: {float:?}");
    assert_eq!(up.started(&key), 2);

    // The string's tenant, as the principal of its claims always named it.
    let tenant_key = idem_core::TenantKey::new(tenant_secret.as_bytes()).unwrap();
    let expected =
        idem_tower::Principal::new(Some(ISSUER.to_owned()), [("sub", "1"), ("org", "acme")])
            .tenant(&tenant_key);
    let listing = http.send("GET", &gw.admin_url("/keys"), &[], "").await;
    assert_eq!(listing.status, 200, "{listing:?}");
    let tenants: Vec<String> = String::from_utf8_lossy(&listing.body)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["key"] == key.as_str())
        .map(|r| r["tenant"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tenants.len(), 2, "{tenants:?}");
    assert!(
        tenants.iter().any(|t| t == expected.as_str()),
        "the string's tenant is unchanged: {tenants:?}, expected {}",
        expected.as_str()
    );
}
