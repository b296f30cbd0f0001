//! Limits per tenant (issue 39 §2, in part): `--tenant-max-in-flight` keeps one tenant
//! from holding every lease and the upstream's capacity; the excess is a 429 that
//! reserved nothing, other tenants are not held up, and the refused key runs on retry.

use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, new_key};

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
