//! Sealed records through the layer (SPEC S17) and retry hints: driven without a
//! server, counting how many times the handler really ran.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::testing::sealing::{raw_answer, ring};
use idem_core::{
    Forward, MemoryStore, Reservation, ReserveRequest, Sealed, Store, StoreError, Tenant,
};
use idem_test_support::scope;
use idem_tower::{IdempotencyBody, IdempotencyLayer, RouteConfig};
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service, ServiceExt};

const CARD: &str = r#"{"charge":"ch_1","card":"4242424242424242"}"#;

fn charge(key: &str) -> Request<Full<Bytes>> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"amount":100}"#)))
        .expect("request")
}

type Handler = tower::util::BoxCloneSyncService<
    Request<IdempotencyBody<Full<Bytes>>>,
    Response<Full<Bytes>>,
    Infallible,
>;

/// A handler that answers `status` with [`CARD`] and counts its runs.
fn handler(status: StatusCode, runs: &Arc<AtomicUsize>) -> Handler {
    let runs = runs.clone();
    tower::util::BoxCloneSyncService::new(tower::service_fn(
        move |_: Request<IdempotencyBody<Full<Bytes>>>| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let mut response = Response::new(Full::new(Bytes::from_static(CARD.as_bytes())));
                *response.status_mut() = status;
                Ok::<_, Infallible>(response)
            }
        },
    ))
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

async fn send<St: Store>(layer: &IdempotencyLayer<St>, handler: Handler, key: &str) -> Answer {
    let response = layer.layer(handler).oneshot(charge(key)).await.unwrap();
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

fn problem_type(answer: &Answer) -> String {
    let v: serde_json::Value = serde_json::from_slice(&answer.body).expect("a problem body");
    assert_eq!(v["status"], answer.status.as_u16(), "{v}");
    v["type"].as_str().unwrap_or_default().to_owned()
}

fn hints(answer: &Answer) -> (Option<&str>, Option<&str>) {
    let get = |name: &str| answer.headers.get(name).map(|v| v.to_str().unwrap());
    (get("stripe-should-retry"), get("x-should-retry"))
}

#[tokio::test]
async fn a_sealed_answer_replays_and_one_that_cannot_be_opened_is_a_500_without_running() {
    let inner = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(Sealed::new(inner.clone(), ring("k1", 1)));
    let runs = Arc::new(AtomicUsize::new(0));
    let first = send(&layer, handler(StatusCode::CREATED, &runs), "seal-1").await;
    assert_eq!(
        (first.status, &first.body[..]),
        (StatusCode::CREATED, CARD.as_bytes())
    );
    let raw = raw_answer(&*inner, &scope(Tenant::anonymous(), "/charges", "seal-1")).await;
    assert!(
        !raw.body.windows(4).any(|w| w == b"4242"),
        "stored in plain text"
    );

    let retry = send(&layer, handler(StatusCode::CREATED, &runs), "seal-1").await;
    assert_eq!(
        (retry.status, &retry.body[..]),
        (StatusCode::CREATED, CARD.as_bytes())
    );
    assert_eq!(retry.headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // An instance whose key file lacks k1, and one with other bytes under k1.
    for keys in [ring("k2", 2), ring("k1", 9)] {
        let other = IdempotencyLayer::new(Sealed::new(inner.clone(), keys));
        let refused = send(&other, handler(StatusCode::CREATED, &runs), "seal-1").await;
        assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            problem_type(&refused),
            "https://idem.dev/problems/replay-unavailable"
        );
        assert!(refused.headers.get("retry-after").is_none());
        assert!(refused.headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never executed again");
}

#[tokio::test]
async fn a_tampered_sealed_answer_is_a_500_without_running() {
    let inner = Arc::new(MemoryStore::new());
    let sealed = Sealed::new(inner.clone(), ring("k1", 1));
    let layer = IdempotencyLayer::new(Sealed::new(inner.clone(), ring("k1", 1)));
    let runs = Arc::new(AtomicUsize::new(0));
    send(&layer, handler(StatusCode::CREATED, &runs), "seal-2").await;
    // Rewrite the record in the inner store with one bit of its ciphertext flipped.
    let mut raw = raw_answer(&*inner, &scope(Tenant::anonymous(), "/charges", "seal-2")).await;
    let mut body = raw.body.to_vec();
    *body.last_mut().unwrap() ^= 0x80;
    raw.body = Bytes::from(body);
    let record = inner
        .get(&scope(Tenant::anonymous(), "/charges", "seal-2"))
        .await
        .unwrap()
        .unwrap();
    inner
        .remove(&scope(Tenant::anonymous(), "/charges", "seal-2"))
        .await
        .unwrap();
    let request = ReserveRequest::new(
        scope(Tenant::anonymous(), "/charges", "seal-2"),
        record.fingerprint,
    );
    let Reservation::Acquired(lease) = inner.reserve(&request).await.unwrap() else {
        panic!("reserve")
    };
    inner.complete(&lease, &raw).await.unwrap();
    assert!(matches!(
        sealed.reserve(&request).await,
        Err(StoreError::Sealed(_))
    ));

    let retry = send(&layer, handler(StatusCode::CREATED, &runs), "seal-2").await;
    assert_eq!(retry.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        problem_type(&retry),
        "https://idem.dev/problems/replay-unavailable"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A store that cannot be reached.
struct Down;

impl Forward for Down {
    type Target = MemoryStore;
    fn target(&self) -> idem_core::Result<&MemoryStore> {
        Err(StoreError::unavailable("connection refused"))
    }
}

#[tokio::test]
async fn retry_hints_say_false_on_a_replayed_5xx_and_true_on_409_and_503() {
    let store = Arc::new(MemoryStore::new());
    let layer = IdempotencyLayer::from_arc(store.clone()).retry_hints(true);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = send(
        &layer,
        handler(StatusCode::INTERNAL_SERVER_ERROR, &runs),
        "h-500",
    )
    .await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        hints(&first),
        (None, None),
        "the first answer is the handler's own"
    );
    let replay = send(
        &layer,
        handler(StatusCode::INTERNAL_SERVER_ERROR, &runs),
        "h-500",
    )
    .await;
    assert_eq!(replay.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(hints(&replay), (Some("false"), Some("false")));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A replayed 2xx says nothing.
    send(&layer, handler(StatusCode::CREATED, &runs), "h-201").await;
    let ok = send(&layer, handler(StatusCode::CREATED, &runs), "h-201").await;
    assert_eq!(hints(&ok), (None, None));

    // A duplicate while the first attempt runs: 409, worth retrying.
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Semaphore::new(0)));
    let held = tower::service_fn({
        let (started, gate) = (started.clone(), gate.clone());
        move |_: Request<IdempotencyBody<Full<Bytes>>>| {
            let (started, gate) = (started.clone(), gate.clone());
            async move {
                started.notify_one();
                gate.acquire().await.expect("gate").forget();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        }
    });
    let mut service = layer.layer(held);
    let running = tokio::spawn(service.ready().await.unwrap().call(charge("h-409")));
    started.notified().await;
    let conflict = send(&layer, handler(StatusCode::CREATED, &runs), "h-409").await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    assert_eq!(hints(&conflict), (Some("true"), Some("true")));
    gate.add_permits(1);
    assert_eq!(running.await.unwrap().unwrap().status(), StatusCode::OK);

    let down = IdempotencyLayer::new(Down).retry_hints(true);
    let unavailable = send(&down, handler(StatusCode::CREATED, &runs), "h-503").await;
    assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        problem_type(&unavailable),
        "https://idem.dev/problems/store-unavailable"
    );
    assert_eq!(hints(&unavailable), (Some("true"), Some("true")));
}

#[tokio::test]
async fn retry_hints_are_off_by_default_and_a_route_may_turn_them_on() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let plain = IdempotencyLayer::from_arc(store.clone());
    send(&plain, handler(StatusCode::BAD_GATEWAY, &runs), "r-1").await;
    let replay = send(&plain, handler(StatusCode::BAD_GATEWAY, &runs), "r-1").await;
    assert_eq!(replay.status, StatusCode::BAD_GATEWAY);
    assert_eq!(hints(&replay), (None, None));
    let down = send(
        &IdempotencyLayer::new(Down),
        handler(StatusCode::OK, &runs),
        "r-2",
    )
    .await;
    assert_eq!(hints(&down), (None, None));

    let routed = IdempotencyLayer::from_arc(store).route_config(|_method, parts| {
        (parts.uri.path() == "/charges").then(|| RouteConfig::new().retry_hints(true))
    });
    let replay = send(&routed, handler(StatusCode::BAD_GATEWAY, &runs), "r-1").await;
    assert_eq!(hints(&replay), (Some("false"), Some("false")));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
