//! Waiting duplicates (SPEC S15): a duplicate of an in-progress request that sends
//! `Prefer: wait=N` (or hits a route with `conflict_wait`) gets the first attempt's
//! exact answer instead of 409, on one gateway and across two gateways sharing a
//! PostgreSQL, Redis or MySQL store (`wait_mysql.rs`); a release wakes it and, since it kept only its body's
//! fingerprint, it answers 409 at once and its client's retry executes.

use std::time::{Duration, Instant};

use crate::common::{Answer, Gateway, Http, Upstream, new_key, send_and_hang_up};
use crate::shared::{mysql, on_shared, postgres, redis};

pub(crate) const BODY: &str = r#"{"amount":100}"#;

/// Sends the first attempt of `key` to `first` (the upstream takes `delay_ms`, and
/// answers `status`), waits until the upstream has it, then the duplicate to `second`
/// with `extra` headers; returns both answers.
pub(crate) async fn first_and_duplicate(
    up: &Upstream,
    first: String,
    second: String,
    key: &str,
    delay_ms: &str,
    status: &str,
    extra: &[(&str, &str)],
) -> (Answer, Answer) {
    let http = Http::new();
    let first = tokio::spawn({
        let (http, key, delay, status) = (
            http.clone(),
            key.to_owned(),
            delay_ms.to_owned(),
            status.to_owned(),
        );
        async move {
            http.post(
                &first,
                &key,
                BODY,
                &[("x-test-delay-ms", &delay), ("x-test-status", &status)],
            )
            .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.started(key) == 0 {
        assert!(Instant::now() < deadline, "the first attempt never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = http.post(&second, key, BODY, extra).await;
    (first.await.unwrap(), duplicate)
}

async fn duplicate_waits_for_the_first_answer(a: &Gateway, b: &Gateway, up: &Upstream) {
    let key = new_key();
    let (first, dup) = first_and_duplicate(
        up,
        a.url("/v1/charges"),
        b.url("/v1/charges"),
        &key,
        "700",
        "201",
        &[("prefer", "respond-async, wait=10")],
    )
    .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(dup.status, 201, "{dup:?}");
    assert!(dup.replayed(), "{dup:?}");
    assert_eq!(dup.body, first.body, "the first attempt's exact answer");
    assert_eq!(dup.header("location"), first.header("location"));
    assert_eq!(dup.header("preference-applied"), Some("wait=10"));
    assert_eq!(up.started(&key), 1, "the upstream ran once");
}

pub(crate) async fn release_wakes_the_waiter_whose_retry_executes(
    a: &Gateway,
    b: &Gateway,
    up: &Upstream,
) {
    let key = new_key();
    // 503 releases the key: the first attempt's answer is not recorded.
    let (first, dup) = first_and_duplicate(
        up,
        a.url("/v1/charges"),
        b.url("/v1/charges"),
        &key,
        "700",
        "503",
        &[("prefer", "wait=10")],
    )
    .await;
    assert_eq!(first.status, 503, "{first:?}");
    // The waiter kept its body's fingerprint, not its body: it cannot execute, and
    // answers as a wait that timed out, with nothing executed for it.
    assert_eq!(dup.status, 409, "{dup:?}");
    assert_eq!(
        dup.problem_type(),
        "https://idem.dev/problems/request-in-progress"
    );
    assert_eq!(dup.header("retry-after"), Some("1"));
    assert_eq!(dup.header("preference-applied"), None);
    assert_eq!(up.started(&key), 1, "nothing ran for the waiter");
    // The key was handed back released: the retry executes as a first attempt.
    let retry = Http::new()
        .post(&b.url("/v1/charges"), &key, BODY, &[])
        .await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed(), "{retry:?}");
    assert_eq!(up.started(&key), 2, "the retry ran as the next attempt");
    assert_eq!(
        up.executions(&key)[1].attempt,
        "1",
        "{:?}",
        up.executions(&key)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicate_gets_the_first_answer_on_one_gateway() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "127.0.0.1:0"],
    )
    .await;
    duplicate_waits_for_the_first_answer(&g, &g, &up).await;
    release_wakes_the_waiter_whose_retry_executes(&g, &g, &up).await;
    let m = Http::new()
        .send("GET", &g.admin_url("/metrics"), &[], "")
        .await;
    let text = String::from_utf8(m.body.to_vec()).unwrap();
    for line in [
        "idem_waiting_requests 0",
        "idem_waits_total{ended=\"replay\"} 1",
        "idem_waits_total{ended=\"retry\"} 1",
        "idem_waits_total{ended=\"timeout\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicate_gets_the_first_answer_on_sqlite() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("wait.db").display());
    let g = Gateway::start(&up.url(), dir.path(), &["--store", &store]).await;
    duplicate_waits_for_the_first_answer(&g, &g, &up).await;
    release_wakes_the_waiter_whose_retry_executes(&g, &g, &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicate_on_another_gateway_sharing_postgres_gets_the_first_answer() {
    let Some(url) = postgres().await else {
        return;
    };
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
    let b = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
    duplicate_waits_for_the_first_answer(&a, &b, &up).await;
    release_wakes_the_waiter_whose_retry_executes(&a, &b, &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicate_on_another_gateway_sharing_redis_gets_the_first_answer() {
    let Some(url) = redis().await else {
        return;
    };
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
    let b = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
    duplicate_waits_for_the_first_answer(&a, &b, &up).await;
    release_wakes_the_waiter_whose_retry_executes(&a, &b, &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_still_waiting_at_the_end_gets_409_with_retry_after() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let key = new_key();
    let started = Instant::now();
    let (first, dup) = first_and_duplicate(
        &up,
        g.url("/v1/charges"),
        g.url("/v1/charges"),
        &key,
        "2500",
        "201",
        &[("prefer", "wait=1")],
    )
    .await;
    assert_eq!(dup.status, 409, "{dup:?}");
    assert!(dup.header("retry-after").is_some(), "{dup:?}");
    assert_eq!(dup.header("preference-applied"), None);
    assert_eq!(first.status, 201);
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(up.started(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_beyond_max_waiters_and_max_wait_get_409_at_once() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    for args in [
        ["--store", "memory://", "--max-waiters", "0"],
        ["--store", "memory://", "--max-wait", "0s"],
    ] {
        let g = Gateway::start(&up.url(), dir.path(), &args).await;
        let key = new_key();
        let (first, dup) = first_and_duplicate(
            &up,
            g.url("/v1/charges"),
            g.url("/v1/charges"),
            &key,
            "1500",
            "201",
            &[("prefer", "wait=10")],
        )
        .await;
        assert_eq!(dup.status, 409, "{args:?}: {dup:?}");
        assert_eq!(
            dup.problem_type(),
            "https://idem.dev/problems/request-in-progress"
        );
        assert_eq!(first.status, 201);
        assert_eq!(up.started(&key), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_conflict_wait_applies_without_prefer() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("idem.toml");
    std::fs::write(
        &config,
        "[[route]]\npath = \"/v1/charges\"\nconflict_wait = \"10s\"\n",
    )
    .unwrap();
    let config = config.display().to_string();
    let g = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--config", &config],
    )
    .await;
    let key = new_key();
    let (first, dup) = first_and_duplicate(
        &up,
        g.url("/v1/charges"),
        g.url("/v1/charges"),
        &key,
        "700",
        "201",
        &[],
    )
    .await;
    assert!(dup.replayed(), "{dup:?}");
    assert_eq!(dup.body, first.body);
    assert_eq!(
        dup.header("preference-applied"),
        None,
        "nothing was asked for"
    );
    // `wait=0` says the client would rather not wait.
    let key = new_key();
    let (_, dup) = first_and_duplicate(
        &up,
        g.url("/v1/charges"),
        g.url("/v1/charges"),
        &key,
        "1000",
        "201",
        &[("prefer", "wait=0")],
    )
    .await;
    assert_eq!(dup.status, 409, "{dup:?}");
}

/// What waiting costs across two instances: `HELD` duplicates of each first attempt
/// wait on the other gateway, and each one's wake-up latency is the time from the first
/// attempt's answer to its own. Prints p50/p99 per store.
///
/// `cargo test -p idem-gateway --test blackbox -- --ignored wake_up_latency --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints figures; run by hand"]
async fn wake_up_latency_across_instances() {
    const ROUNDS: usize = 20;
    const HELD: usize = 50;
    let mut stores = Vec::new();
    if let Some(url) = postgres().await {
        stores.push(("PostgreSQL", url));
    }
    if let Some(url) = redis().await {
        stores.push(("Redis", url));
    }
    if let Some(url) = mysql().await {
        stores.push(("MySQL", url));
    }
    for (name, url) in stores {
        let up = Upstream::start().await;
        let dir = tempfile::tempdir().unwrap();
        let a = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
        let b = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
        let http = Http::new();
        let mut lat = Vec::with_capacity(ROUNDS * HELD);
        for _ in 0..ROUNDS {
            let key = new_key();
            let first = tokio::spawn({
                let (http, url, key) = (http.clone(), a.url("/v1/charges"), key.clone());
                async move {
                    let a = http
                        .post(&url, &key, BODY, &[("x-test-delay-ms", "300")])
                        .await;
                    (a, Instant::now())
                }
            });
            while up.started(&key) == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let waiters: Vec<_> = (0..HELD)
                .map(|_| {
                    let (http, url, key) = (http.clone(), b.url("/v1/charges"), key.clone());
                    tokio::spawn(async move {
                        let a = http.post(&url, &key, BODY, &[("prefer", "wait=10")]).await;
                        (a, Instant::now())
                    })
                })
                .collect();
            let (first, done) = first.await.unwrap();
            assert_eq!(first.status, 201);
            for w in waiters {
                let (answer, at) = w.await.unwrap();
                assert!(answer.replayed(), "{answer:?}");
                lat.push(at.saturating_duration_since(done));
            }
            assert_eq!(up.started(&key), 1);
        }
        lat.sort();
        let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
        eprintln!(
            "{name}: {ROUNDS} rounds x {HELD} waiting duplicates on the other gateway: \
             wake-up after the first answer p50 {:?}, p99 {:?}, max {:?}",
            pct(50),
            pct(99),
            lat[lat.len() - 1]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_client_hangs_up_frees_its_slot() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--max-waiters",
            "1",
            "--admin",
            "127.0.0.1:0",
        ],
    )
    .await;
    let key = new_key();
    let http = Http::new();
    let first = tokio::spawn({
        let (http, url, key) = (http.clone(), g.url("/v1/charges"), key.clone());
        async move {
            http.post(&url, &key, BODY, &[("x-test-delay-ms", "2000")])
                .await
        }
    });
    while up.started(&key) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The only slot, taken by a client that goes away while it waits.
    let raw = format!(
        "POST /v1/charges HTTP/1.1\r\nhost: {}\r\nidempotency-key: {key}\r\n\
         content-type: application/json\r\nprefer: wait=10\r\ncontent-length: {}\r\n\r\n{BODY}",
        g.addr,
        BODY.len()
    );
    send_and_hang_up(g.addr, &raw, Duration::from_millis(300)).await;
    // The gateway learns of the hang-up from its socket, not at once: the duplicate goes
    // once the abandoned wait is counted, so that it finds the slot free however busy
    // the machine is.
    let metrics = g.admin_url("/metrics");
    idem_test_support::eventually(
        "the hung-up waiter is counted as abandoned",
        Duration::from_secs(10),
        async || {
            let m = http.send("GET", &metrics, &[], "").await;
            String::from_utf8_lossy(&m.body).contains("idem_waits_total{ended=\"abandoned\"} 1")
        },
    )
    .await;
    let dup = http
        .post(&g.url("/v1/charges"), &key, BODY, &[("prefer", "wait=10")])
        .await;
    let first = first.await.unwrap();
    assert!(dup.replayed(), "the slot was freed: {dup:?}");
    assert_eq!(dup.body, first.body);
    assert_eq!(up.started(&key), 1);
    let m = http.send("GET", &g.admin_url("/metrics"), &[], "").await;
    let text = String::from_utf8(m.body.to_vec()).unwrap();
    for line in [
        "idem_waiting_requests 0",
        "idem_waits_total{ended=\"abandoned\"} 1",
        "idem_waits_total{ended=\"replay\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

/// A waiter keeps its body's fingerprint, not its body: 40 duplicates of a 1 MiB body
/// waiting at once add less than half of their 40 MiB of bodies to the resident memory
/// of a gateway that has served 40 such requests at once before (they added over
/// 100 MiB when each kept its bytes), and each gets the first attempt's answer. The
/// usual figure is 2.5–4.2 MiB, but a busy CI machine once measured 11.2 MiB (resident
/// memory counts what the allocator has not yet handed back), so the bound sits at half
/// the bodies, which a waiter that kept its body would still exceed. The figures are
/// printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_waiters_with_1_mib_bodies_hold_less_than_half_their_bodies() {
    const WAITERS: usize = 40;
    const MIB: usize = 1 << 20;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The binary's allocator (mimalloc) is told to hand freed memory back to the
    // system at once rather than a second later, so that resident memory shows what
    // is held rather than what was freed a moment ago.
    let g = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--admin", "127.0.0.1:0"],
        &[("MIMALLOC_PURGE_DELAY", "0")],
    )
    .await;
    let http = Http::new();
    // A JSON body of exactly 1 MiB, the default body limit.
    let body = format!("{{\"memo\":\"{}\"}}", "x".repeat(MIB - 11));
    assert_eq!(body.len(), MIB);
    // First as many requests of the same size at once, and a wait: the figures then
    // compare waiting duplicates with a gateway that has read that many such bodies at
    // once already (its allocator keeps some of what reading and hashing them took,
    // waiting or not) and has the code for both in memory (a debug binary's pages are
    // megabytes). What is left is what waiting holds.
    let warm: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (http, url, body) = (http.clone(), g.url("/v1/charges"), body.clone());
            tokio::spawn(async move { http.post(&url, &new_key(), &body, &[]).await })
        })
        .collect();
    for w in warm {
        let warm = w.await.unwrap();
        assert_eq!(warm.status, 201, "{warm:?}");
    }
    let (_, warm) = first_and_duplicate(
        &up,
        g.url("/v1/charges"),
        g.url("/v1/charges"),
        &new_key(),
        "300",
        "201",
        &[("prefer", "wait=10")],
    )
    .await;
    assert!(warm.replayed(), "{warm:?}");
    let key = new_key();
    let first = tokio::spawn({
        let (http, url, key, body) = (
            http.clone(),
            g.url("/v1/charges"),
            key.clone(),
            body.clone(),
        );
        async move {
            http.post(&url, &key, &body, &[("x-test-delay-ms", "18000")])
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.started(&key) == 0 {
        assert!(Instant::now() < deadline, "the first attempt never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = g.rss_kib();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (http, url, key, body) = (
                http.clone(),
                g.url("/v1/charges"),
                key.clone(),
                body.clone(),
            );
            tokio::spawn(
                async move { http.post(&url, &key, &body, &[("prefer", "wait=30")]).await },
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        let text = crate::common::metrics(&http, &g).await;
        if crate::common::metric(&text, "idem_waiting_requests") == Some(WAITERS as u64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiters never all waited:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the allocator hand back what the requests' reading and hashing freed: the
    // binary's (mimalloc) returns freed memory to the system a second after it is freed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = g.rss_kib();
    let added = during.saturating_sub(before);
    eprintln!(
        "{WAITERS} waiters with 1 MiB bodies: RSS {before} KiB before, {during} KiB while \
         they wait, {added} KiB added ({} KiB each)",
        added / WAITERS as u64
    );
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "{first:?}");
    for w in waiters {
        let answer = w.await.unwrap();
        assert!(answer.replayed(), "{answer:?}");
        assert_eq!(answer.body, first.body);
    }
    assert_eq!(up.started(&key), 1, "the upstream ran once");
    let bodies_kib = (WAITERS * MIB / 1024) as u64;
    assert!(
        added < bodies_kib / 2,
        "{WAITERS} waiters added {added} KiB, over half of their {bodies_kib} KiB of bodies"
    );
}
