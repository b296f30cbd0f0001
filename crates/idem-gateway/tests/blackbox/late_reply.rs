//! A reservation PostgreSQL confirms after its lease lapsed (SPEC S7): the real binary
//! reaches the store through a relay that holds the reserve's reply back, as a one-way
//! partition does, longer than the lease (and shorter than the store's operation
//! timeout, so the store call itself succeeds). Meanwhile the client's retry takes the
//! key over and executes. The late reply must not execute a second time: 503
//! `reservation-late`, the takeover's record kept, one execution in all.

use std::time::Duration;

use idem_test_support::{Relay, service_addr, url_via};

use crate::common::{Gateway, Http, Upstream, metric, metrics, new_key};
use crate::shared::{on_shared, postgres};

/// The gateway's lease.
const LEASE: &str = "2s";
/// How long the relay holds the reserve's reply: past the lease, within the store's
/// 5 s operation timeout.
const HELD: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_reply_held_past_the_lease_is_503_and_the_takeover_runs_once() {
    let Some(pg) = postgres().await else {
        return;
    };
    let relay = Relay::start(service_addr(&pg, 5432).await).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = url_via(&pg, relay.addr());
    let args = on_shared(&store, &["--lease", LEASE, "--admin", "127.0.0.1:0"]);
    let gw = Gateway::start(&up.url(), dir.path(), &args).await;
    let http = Http::new();
    let url = gw.url("/v1/charges");
    // The store answers through the relay before the fault.
    assert_eq!(http.post(&url, &new_key(), "{}", &[]).await.status, 201);

    let key = new_key();
    relay.delay_reply_to(key.as_bytes(), HELD);
    let late = tokio::spawn({
        let (http, url, key) = (http.clone(), url.clone(), key.clone());
        async move { http.post(&url, &key, "{}", &[]).await }
    });
    // The client's retry, once the first attempt's lease has lapsed: it takes over.
    let taken_over = http.post_once_the_lease_lapses(&url, &key).await;
    assert_eq!(taken_over.status, 201, "{taken_over:?}\n{}", gw.logs());
    assert!(!taken_over.replayed());
    assert_eq!(up.started(&key), 1);

    let late = late.await.unwrap();
    assert_eq!(relay.replies_delayed(), 1, "the reserve's reply was held");
    assert_eq!(late.status, 503, "{late:?}\n{}", gw.logs());
    assert_eq!(
        late.problem_type(),
        "https://idem.dev/problems/reservation-late"
    );
    assert!(late.header("retry-after").is_some(), "{late:?}");
    assert_eq!(up.started(&key), 1, "the late reservation did not execute");

    let retry = http.post(&url, &key, "{}", &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, taken_over.body);
    assert_eq!(up.started(&key), 1);

    let m = metrics(&http, &gw).await;
    assert_eq!(
        metric(&m, "idem_requests_total{outcome=\"reservation_late\"}"),
        Some(1)
    );
    assert!(
        gw.logs()
            .contains("the store confirmed the reservation too late"),
        "{}",
        gw.logs()
    );
}
