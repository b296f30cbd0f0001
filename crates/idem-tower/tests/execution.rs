//! The execution of a keyed request, driven without a server: what happens when the
//! response future is dropped, and when the inner service panics before its future
//! exists (SPEC S7).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idem_core::{MemoryStore, RecordState, Reservation, ReserveRequest, Store, Tenant};
use idem_test_support::{HookedStore, StoreHooks, scope};
use idem_tower::{IdempotencyBody, IdempotencyLayer};
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service, ServiceExt};

fn charge(key: &str) -> Request<Full<Bytes>> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"amount":100}"#)))
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_response_future_still_records() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Notify::new());
    let gate = Arc::new(Semaphore::new(0));
    let handler = tower::service_fn({
        let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
        move |_: Request<IdempotencyBody<Full<Bytes>>>| {
            let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                started.notify_one();
                gate.acquire().await.expect("gate").forget();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("charge {n}")))))
            }
        }
    });
    let layer = IdempotencyLayer::from_arc(store.clone());
    let in_flight = layer.in_flight();
    let mut service = layer.layer(handler);

    let response = service.ready().await.unwrap().call(charge("k-dropped"));
    // Drive the response future until the handler runs, then drop it, as a server does
    // when its client goes away.
    tokio::select! {
        _ = response => panic!("the handler is held at its gate"),
        () = started.notified() => {}
    }
    assert_eq!(
        in_flight.count(),
        1,
        "the execution goes on without its response future"
    );
    let record = store
        .get(&scope(Tenant::anonymous(), "/charges", "k-dropped"))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(record.state, RecordState::InProgress { .. }));

    gate.add_permits(1);
    in_flight.wait().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = store
        .get(&scope(Tenant::anonymous(), "/charges", "k-dropped"))
        .await
        .unwrap()
        .unwrap();
    let RecordState::Completed { response, .. } = record.state else {
        panic!("the answer was not recorded: {record:?}")
    };
    assert_eq!(
        (response.status, &response.body[..]),
        (200, &b"charge 1"[..])
    );

    let retry = service
        .ready()
        .await
        .unwrap()
        .call(charge("k-dropped"))
        .await
        .unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "charge 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// A service that panics in `call` itself, before it returns a future.
#[derive(Clone)]
struct PanicsInCall(Arc<AtomicUsize>);

impl Service<Request<IdempotencyBody<Full<Bytes>>>> for PanicsInCall {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<IdempotencyBody<Full<Bytes>>>) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("the service blew up after charging the card");
    }
}

#[tokio::test]
async fn panic_in_call_is_recorded_as_500() {
    let store = Arc::new(MemoryStore::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyLayer::from_arc(store.clone()).layer(PanicsInCall(calls.clone()));

    let first = service.clone().oneshot(charge("k-boom")).await.unwrap();
    assert_eq!(first.status(), 500);
    let record = store
        .get(&scope(Tenant::anonymous(), "/charges", "k-boom"))
        .await
        .unwrap()
        .unwrap();
    assert!(record.is_completed(), "the failure is recorded: {record:?}");

    let retry = service.oneshot(charge("k-boom")).await.unwrap();
    assert_eq!(retry.status(), 500);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A store with a bug: `reserve` panics.
struct PanicsOnReserve;

#[async_trait]
impl StoreHooks<MemoryStore> for PanicsOnReserve {
    async fn reserve(&self, _: &MemoryStore, _: &ReserveRequest) -> idem_core::Result<Reservation> {
        panic!("the store has a bug");
    }
}

#[tokio::test]
async fn store_panic_is_500_and_ends_the_execution() {
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = tower::service_fn({
        let calls = calls.clone();
        move |_: Request<IdempotencyBody<Full<Bytes>>>| {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))))
        }
    });
    let layer = IdempotencyLayer::new(HookedStore::new(MemoryStore::new(), PanicsOnReserve));
    let in_flight = layer.in_flight();
    let response = layer.layer(handler).oneshot(charge("k-bug")).await.unwrap();
    assert_eq!(response.status(), 500);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "https://idem.dev/problems/handler-failed");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the handler was not called"
    );
    assert_eq!(in_flight.count(), 0, "the execution is no longer counted");
}
