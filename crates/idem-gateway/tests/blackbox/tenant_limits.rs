//! Limits per tenant (issue 39 §2): `--tenant-max-in-flight` keeps one tenant from
//! holding every lease and the upstream's capacity; the excess is a 429 that reserved
//! nothing, other tenants are not held up, and the refused key runs on retry.
//! `--tenant-key-rate` bounds a tenant's new keys, per instance on memory and shared by
//! every instance on PostgreSQL, MySQL and Redis.

use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, metrics, new_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_over_its_cap_gets_429_and_others_are_not_held_up() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--tenant-max-in-flight", "2"]).await;
    let http = Http::new();
    let url = gw.url("/v1/charges");
    let alice = ("authorization", "Bearer sk_alice");
    let bob = ("authorization", "Bearer sk_bob");

    // Two of alice's charges held in the upstream.
    let slow = |key: String| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            http.post(&url, &key, "{}", &[alice, ("x-test-delay-ms", "1500")])
                .await
        })
    };
    let held = [slow(new_key()), slow(new_key())];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while up.total() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.total(), 2);

    let third = new_key();
    let refused = http.post(&url, &third, "{}", &[alice]).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idem.dev/problems/too-many-in-flight"
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(up.started(&third), 0, "nothing was forwarded");
    // Another tenant is not held up by alice's cap.
    let other = http.post(&url, &new_key(), "{}", &[bob]).await;
    assert_eq!(other.status, 201, "{other:?}");
    // An unkeyed request is not counted.
    let read = http.send("GET", &url, &[alice], "").await;
    assert_eq!(read.status, 201);

    for h in held {
        assert_eq!(h.await.unwrap().status, 201);
    }
    // Once alice's requests have their answers, the refused key runs: it was never
    // reserved.
    let retry = http.post(&url, &third, "{}", &[alice]).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(up.started(&third), 1);
}

/// `--tenant-key-rate`: a tenant's new keys beyond its bucket are 429
/// `key-rate-exceeded` with `Retry-After`, released and never forwarded; replays of its
/// keys take no token; another tenant has its own bucket; `/metrics` counts the busiest
/// tenants' requests and refusals by a digest prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_beyond_a_tenants_rate_get_429_and_replays_are_free() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--tenant-key-rate", "2/min,2", "--admin", "127.0.0.1:0"],
    )
    .await;
    let http = Http::new();
    let url = gw.url("/v1/charges");
    let alice = ("authorization", "Bearer sk_alice_rate");
    let bob = ("authorization", "Bearer sk_bob_rate");
    let (k1, k2, k3) = (new_key(), new_key(), new_key());
    for k in [&k1, &k2] {
        assert_eq!(http.post(&url, k, "{}", &[alice]).await.status, 201);
    }
    let refused = http.post(&url, &k3, "{}", &[alice]).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idem.dev/problems/key-rate-exceeded"
    );
    assert_eq!(
        refused.header("retry-after"),
        Some("30"),
        "one token in 30 s at 2/min"
    );
    assert_eq!(up.started(&k3), 0, "nothing was forwarded");
    for _ in 0..3 {
        let replay = http.post(&url, &k1, "{}", &[alice]).await;
        assert!(replay.replayed(), "a replay takes no token: {replay:?}");
    }
    assert_eq!(http.post(&url, &new_key(), "{}", &[bob]).await.status, 201);
    // The refused key was released: nothing holds it (a conflict would be 409).
    let again = http.post(&url, &k3, "{}", &[alice]).await;
    assert_eq!(
        again.status, 429,
        "still over the rate, not in progress: {again:?}"
    );

    let text = metrics(&http, &gw).await;
    let limited: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("idem_tenant_limited_requests_total{") && l.contains("key_rate"))
        .collect();
    assert!(
        limited.iter().any(|l| l.ends_with(" 2")),
        "alice's two refusals: {text}"
    );
    let keyed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("idem_tenant_keyed_requests_total{tenant=\"hmac-sha256:"))
        .collect();
    assert_eq!(keyed.len(), 2, "alice and bob: {text}");
    assert!(
        keyed[0].ends_with(" 7"),
        "alice's seven keyed requests first: {text}"
    );
}

/// On a PostgreSQL, MySQL or Redis store, one tenant's rate is shared by every gateway on the
/// store: a tenant flooding two gateways with new keys gets the bucket's burst
/// executed in all, and the rest refused, whichever gateway they reached.
async fn the_rate_is_shared_by_every_gateway_on(store: Option<String>) {
    let Some(url) = store else { return };
    let args = crate::shared::on_shared(&url, &["--tenant-key-rate", "5/min,5"]);
    the_rate_is_shared_by_gateways_with(&args).await;
}

/// Two gateways started with `args` (one shared store): see
/// [`the_rate_is_shared_by_every_gateway_on`].
async fn the_rate_is_shared_by_gateways_with(args: &[&str]) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Gateway::start(&up.url(), dir.path(), args).await;
    let b = Gateway::start(&up.url(), dir.path(), args).await;
    let http = Http::new();
    // A tenant of this run only: buckets outlive a run by their refill time.
    let token = format!("Bearer sk_flood_{}", new_key());
    let flood: Vec<_> = (0..16)
        .map(|i| {
            let gw = if i % 2 == 0 { &a } else { &b };
            let (http, url, key) = (http.clone(), gw.url("/v1/charges"), new_key());
            let token = token.clone();
            tokio::spawn(async move {
                let answer = http
                    .post(&url, &key, "{}", &[("authorization", &token)])
                    .await;
                (key, answer)
            })
        })
        .collect();
    let (mut executed, mut refused) = (0, 0);
    for f in flood {
        let (key, answer) = f.await.unwrap();
        match answer.status {
            201 => {
                executed += 1;
                assert_eq!(up.started(&key), 1);
            }
            429 => {
                refused += 1;
                assert_eq!(up.started(&key), 0, "a refused key is never forwarded");
            }
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert_eq!(
        (executed, refused),
        (5, 11),
        "the burst of 5 across both gateways"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_is_shared_by_every_gateway_on_postgres() {
    the_rate_is_shared_by_every_gateway_on(crate::shared::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_is_shared_by_every_gateway_on_mysql() {
    let Some(url) = crate::shared::mysql().await else {
        return;
    };
    // A namespace of its own, whose table has the buckets' schema: other suites'
    // gateways on the shared one need not be of a build that has it.
    let args = [
        "--store",
        &url,
        "--store-namespace",
        "idem_blackbox_rate",
        "--ttl",
        "2m",
        "--tenant-key-rate",
        "5/min,5",
    ];
    the_rate_is_shared_by_gateways_with(&args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_is_shared_by_every_gateway_on_redis() {
    the_rate_is_shared_by_every_gateway_on(crate::shared::redis().await).await;
}

/// `--unverified-key-rate` (issue 61 §3): a client that makes up a tenant per request
/// with a tenant header is under every limit per tenant, but not under this one: the
/// new keys of every tenant named by headers (and of `anonymous`) share one bucket, and
/// beyond it each is 429 `key-rate-exceeded`, released and never forwarded. A tenant a
/// verified bearer token names is not counted; replays take no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_tenants_share_the_unverified_key_rate() {
    use idem_test_support::jwt::{Signer, epoch};
    use std::os::unix::fs::PermissionsExt;

    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("hs.secret");
    std::fs::write(&secret, [b'h'; 40]).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let args = [
        "--store",
        "memory://",
        "--tenant-from",
        "jwt,headers",
        "--tenant-header",
        "x-account",
        "--jwt-hs256-secret-file",
        "hs.secret",
        "--tenant-key-rate",
        "10/min,10",
        "--unverified-key-rate",
        "3/min,3",
    ];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let http = Http::new();
    let url = gw.url("/v1/charges");
    let minted = |i: usize| format!("acct_minted_{i}");
    let mut keys = Vec::new();
    for i in 0..3 {
        let key = new_key();
        let answer = http
            .post(&url, &key, "{}", &[("x-account", &minted(i))])
            .await;
        assert_eq!(answer.status, 201, "the shared burst: {answer:?}");
        keys.push(key);
    }
    for i in 3..6 {
        let key = new_key();
        let refused = http
            .post(&url, &key, "{}", &[("x-account", &minted(i))])
            .await;
        assert_eq!(refused.status, 429, "a fresh made-up tenant: {refused:?}");
        assert_eq!(
            refused.problem_type(),
            "https://idem.dev/problems/key-rate-exceeded"
        );
        assert_eq!(refused.header("retry-after"), Some("20"), "one in 20 s");
        assert!(
            refused.json()["detail"]
                .as_str()
                .unwrap()
                .contains("no verified source"),
            "{:?}",
            refused.json()
        );
        assert_eq!(up.started(&key), 0, "nothing was forwarded");
    }
    let anonymous = new_key();
    let refused = http.post(&url, &anonymous, "{}", &[]).await;
    assert_eq!(
        refused.status, 429,
        "anonymous is unverified too: {refused:?}"
    );
    assert_eq!(up.started(&anonymous), 0);
    // A replay of a made-up tenant's key is free.
    let replay = http
        .post(&url, &keys[0], "{}", &[("x-account", &minted(0))])
        .await;
    assert!(replay.replayed(), "{replay:?}");
    // A verified tenant has its own rate only.
    let claims = serde_json::json!({"sub": "cus_verified", "iat": epoch(0), "exp": epoch(300)});
    let token = format!("Bearer {}", Signer::hs256("k", &[b'h'; 40]).sign(&claims));
    for _ in 0..3 {
        let key = new_key();
        let answer = http
            .post(&url, &key, "{}", &[("authorization", &token)])
            .await;
        assert_eq!(
            answer.status, 201,
            "a verified tenant is not counted: {answer:?}"
        );
        assert_eq!(up.started(&key), 1);
    }
    assert_eq!(
        up.total(),
        6,
        "three made-up tenants' keys and three verified"
    );
}

/// Tenant headers that only the trusted proxies may set (`--trusted-headers`) name
/// verified tenants: the ingress vouches for them, so `--unverified-key-rate` does not
/// count them; a request without them is `anonymous`, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_an_ingress_asserts_are_not_counted_as_unverified() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--store",
        "memory://",
        "--trusted-proxies",
        "127.0.0.1",
        "--trusted-headers",
        "x-user-id",
        "--tenant-header",
        "x-user-id",
        "--unverified-key-rate",
        "1/min,1",
    ];
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let http = Http::new();
    let url = gw.url("/v1/charges");
    for i in 0..3 {
        let user = format!("user-{i}");
        let answer = http
            .post(&url, &new_key(), "{}", &[("x-user-id", &user)])
            .await;
        assert_eq!(answer.status, 201, "asserted by the ingress: {answer:?}");
    }
    assert_eq!(http.post(&url, &new_key(), "{}", &[]).await.status, 201);
    let refused = http.post(&url, &new_key(), "{}", &[]).await;
    assert_eq!(refused.status, 429, "anonymous is unverified: {refused:?}");
}
