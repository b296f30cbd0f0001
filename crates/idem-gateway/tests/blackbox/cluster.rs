//! Gateways on a Redis Cluster (`--store redis+cluster://…`): duplicates split between
//! two gateways execute once, and `wait` refuses, with 503 and nothing forwarded, a
//! reservation too few replicas hold.

use crate::common::{Gateway, Http, Proto, Upstream, new_key};
use crate::shared::{duplicates_split_between_two_gateways_execute_once, on_shared, reachable};

/// The Redis Cluster the tests of this process share (started on first use, or
/// `IDEM_TEST_REDIS_CLUSTER_URL`) when it answers; `None`, said loudly, when it could
/// not start (a panic under `IDEM_REQUIRE_SERVICES=1`).
pub async fn redis_cluster() -> Option<String> {
    let started = tokio::task::spawn_blocking(idem_test_support::redis_cluster_url)
        .await
        .unwrap();
    match started {
        Ok(url) => reachable("Redis Cluster", &url).await.then_some(url),
        Err(e) => idem_test_support::service_unavailable("Redis Cluster", "127.0.0.1", &e),
    }
}

/// `url` with one more query parameter.
pub fn with(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_a_redis_cluster_execute_each_key_once() {
    let Some(url) = redis_cluster().await else {
        return;
    };
    duplicates_split_between_two_gateways_execute_once(&url, Proto::Http1).await;
}

/// Each master of the shared cluster has one replica: `wait=1` answers, `wait=2`
/// refuses every keyed request with 503 `store-unavailable`, forwards nothing and
/// leaves no record, so the same key executes at once through a gateway without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_answer_503_and_forward_nothing() {
    let Some(url) = redis_cluster().await else {
        return;
    };
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = Http::new();
    let one = with(&url, "wait=1&wait_timeout=2s");
    let gw = Gateway::start(&up.url(), dir.path(), &on_shared(&one, &[])).await;
    let key = new_key();
    let a = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(up.started(&key), 1);
    gw.terminate().await;

    let two = with(&url, "wait=2&wait_timeout=100ms");
    let gw = Gateway::start(&up.url(), dir.path(), &on_shared(&two, &[])).await;
    let before = up.total();
    let keys: Vec<String> = (0..8).map(|_| new_key()).collect();
    for key in &keys {
        let a = http.post(&gw.url("/v1/charges"), key, "{}", &[]).await;
        assert_eq!(a.status, 503, "{a:?}");
        assert_eq!(
            a.problem_type(),
            "https://idem.dev/problems/store-unavailable"
        );
        assert_eq!(up.started(key), 0, "nothing forwarded");
    }
    assert_eq!(up.total(), before, "nothing forwarded");
    gw.terminate().await;

    // The refused reservations were released: the keys are free, and execute now.
    let gw = Gateway::start(&up.url(), dir.path(), &on_shared(&url, &[])).await;
    for key in &keys {
        let a = http.post(&gw.url("/v1/charges"), key, "{}", &[]).await;
        assert_eq!((a.status, a.replayed()), (201, false), "{a:?}");
        assert_eq!(up.started(key), 1);
    }
    gw.terminate().await;
}
