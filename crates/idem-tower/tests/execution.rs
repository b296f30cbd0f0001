//! The execution of a keyed request, driven without a server: what happens when the
//! response future is dropped, and when the inner service panics before its future
//! exists (SPEC S7); and what becomes of a request, keyed or not, whose inner service,
//! a proxy, fails to forward it ([`ForwardError`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, Full};
use idem_core::{Ambiguity, MemoryStore, RecordState, Reservation, ReserveRequest, Store, Tenant};
use idem_test_support::{HookedStore, StoreHooks, scope};
use idem_tower::{
    ForwardError, Handled, IdempotencyBody, IdempotencyLayer, Observer, Outcome, ProblemKind,
    Profile, UpstreamFailure,
};
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

/// What the layer reported of a proxy's failures.
#[derive(Default)]
struct Seen {
    failures: Mutex<Vec<UpstreamFailure>>,
    ambiguous: Mutex<Vec<Ambiguity>>,
}

impl Observer for Seen {
    fn upstream_failed(&self, failure: UpstreamFailure) {
        self.failures.lock().unwrap().push(failure);
    }

    fn ambiguous_outcome(&self, reason: Ambiguity, _: &str) {
        self.ambiguous.lock().unwrap().push(reason);
    }
}

/// A layer in `profile` around a proxy that fails every request with `error`,
/// counting its calls in `calls`; what the layer reports goes to `seen`.
fn failing(
    error: ForwardError,
    profile: Profile,
    calls: Arc<AtomicUsize>,
    seen: Arc<Seen>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<IdempotencyBody<Full<Bytes>>>,
    Error = ForwardError,
> + Clone {
    let proxy = tower::service_fn(move |_: Request<IdempotencyBody<Full<Bytes>>>| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Err::<Response<Full<Bytes>>, _>(error.clone()))
    });
    IdempotencyLayer::new(MemoryStore::new())
        .profile(profile)
        .observer(seen)
        .layer(proxy)
}

fn post(key: Option<&'static str>, content_type: &'static str) -> Request<Full<Bytes>> {
    let mut req = Request::post("/v1/charges")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    req.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(key) = key {
        req.headers_mut()
            .insert("idempotency-key", HeaderValue::from_static(key));
    }
    req
}

async fn json(res: Response<IdempotencyBody<Full<Bytes>>>) -> serde_json::Value {
    let body = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn a_keyed_requests_unreachable_upstream_is_answered_once_in_the_routes_dialect() {
    let (calls, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(Seen::default()));
    let unreachable = ForwardError::Upstream(UpstreamFailure::Unreachable);
    let svc = failing(unreachable, Profile::Stripe, calls.clone(), seen.clone());
    let res = svc
        .clone()
        .oneshot(post(Some("k-1"), "application/json"))
        .await;
    let res = res.expect("answered by the layer");
    assert_eq!(res.status(), 502);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "application/json");
    assert_eq!(
        res.extensions().get::<ProblemKind>(),
        Some(&ProblemKind::UpstreamUnreachable),
        "released, so still marked as the gateway's own answer"
    );
    let body = json(res).await;
    assert_eq!(body["error"]["type"], "api_error");
    assert_eq!(
        body["error"]["doc_url"],
        "https://idem.dev/problems/upstream-unreachable"
    );
    // Released: the retry is forwarded again.
    let retry = svc.oneshot(post(Some("k-1"), "application/json")).await;
    assert_eq!(retry.expect("answered").status(), 502);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        *seen.failures.lock().unwrap(),
        [UpstreamFailure::Unreachable, UpstreamFailure::Unreachable]
    );
    assert!(seen.ambiguous.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_keyed_requests_upstream_timeout_keeps_the_key_and_its_ambiguity() {
    let (calls, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(Seen::default()));
    let timeout = ForwardError::Upstream(UpstreamFailure::Timeout);
    let svc = failing(timeout, Profile::Ietf, calls.clone(), seen.clone());
    let res = svc
        .clone()
        .oneshot(post(Some("k-1"), "application/json"))
        .await;
    let res = res.expect("answered by the layer");
    assert_eq!(res.status(), 504);
    assert_eq!(
        json(res).await["type"],
        "https://idem.dev/problems/upstream-timeout"
    );
    let retry = svc.oneshot(post(Some("k-1"), "application/json")).await;
    assert_eq!(retry.expect("answered").status(), 409, "kept in progress");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(*seen.failures.lock().unwrap(), [UpstreamFailure::Timeout]);
    assert_eq!(
        *seen.ambiguous.lock().unwrap(),
        [Ambiguity::UpstreamTimeout]
    );
}

#[tokio::test]
async fn an_unkeyed_requests_failure_is_answered_in_the_layers_dialect() {
    let (calls, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(Seen::default()));
    let tls = ForwardError::UpstreamTls("invalid peer certificate: UnknownIssuer".into());
    let svc = failing(tls, Profile::Acp, calls.clone(), seen.clone());
    let res = svc.clone().oneshot(post(None, "application/json")).await;
    let res = res.expect("answered by the layer");
    assert_eq!(res.status(), 502);
    let handled = res.extensions().get::<Handled>().expect("marked");
    assert_eq!(handled.outcome, Outcome::PassedThrough);
    let body = json(res).await;
    assert_eq!(body["code"], "upstream_unreachable");
    assert!(body["message"].as_str().unwrap().contains("UnknownIssuer"));
    // A gRPC call gets a gRPC error.
    let res = svc.oneshot(post(None, "application/grpc")).await;
    let res = res.expect("answered by the layer");
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "14", "UNAVAILABLE");
    assert_eq!(
        *seen.failures.lock().unwrap(),
        [UpstreamFailure::Tls, UpstreamFailure::Tls]
    );
}

#[tokio::test]
async fn a_clients_broken_body_is_its_400_and_no_upstream_failure() {
    let (calls, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(Seen::default()));
    let svc = failing(ForwardError::ClientBody, Profile::Ietf, calls, seen.clone());
    let res = svc.oneshot(post(None, "application/json")).await;
    let res = res.expect("answered by the layer");
    assert_eq!(res.status(), 400);
    assert_eq!(
        json(res).await["type"],
        "https://idem.dev/problems/body-unreadable"
    );
    assert!(seen.failures.lock().unwrap().is_empty());
}

#[tokio::test]
async fn another_error_of_an_unkeyed_request_is_the_callers() {
    let failing = tower::service_fn(|_: Request<IdempotencyBody<Full<Bytes>>>| {
        std::future::ready(Err::<Response<Full<Bytes>>, idem_tower::BoxError>(
            "refused".into(),
        ))
    });
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(failing);
    let e = svc
        .oneshot(post(None, "application/json"))
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "refused");
}

/// An answer recorded as a reference that cannot be rendered again is the layer's 503,
/// written in its profile as its other answers are.
#[tokio::test]
async fn a_reference_that_cannot_be_rendered_is_answered_in_the_layers_profile() {
    let handler = tower::service_fn(|_: Request<IdempotencyBody<Full<Bytes>>>| async {
        let mut res = Response::new(Full::new(Bytes::from_static(b"made")));
        *res.status_mut() = http::StatusCode::CREATED;
        let reference = idem_tower::ResourceReference::new("/v1/reports/42").unwrap();
        res.extensions_mut().insert(reference);
        Ok::<_, Infallible>(res)
    });
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .profile(Profile::Stripe)
        .render_references_with(|_: Request<()>| async {
            Err::<Response<Bytes>, _>("the report store is down")
        })
        .layer(handler);
    let first = svc
        .clone()
        .oneshot(post(Some("k-1"), "application/json"))
        .await;
    assert_eq!(first.expect("answered").status(), 201);
    let retry = svc.oneshot(post(Some("k-1"), "application/json")).await;
    let retry = retry.expect("answered");
    assert_eq!(retry.status(), 503);
    assert!(retry.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(retry.headers()[header::CONTENT_TYPE], "application/json");
    let body = json(retry).await;
    assert_eq!(body["error"]["type"], "api_error");
    assert_eq!(
        body["error"]["doc_url"],
        "https://idem.dev/problems/replay-unavailable"
    );
}

/// A proxy's answers, read whole by the layer by their deadline: what goes wrong reading
/// them is the upstream's failure.
mod proxied_answers {
    use std::time::{Duration, Instant};

    use http_body::Frame;
    use http_body_util::StreamBody;
    use http_body_util::combinators::BoxBody;
    use idem_tower::{BoxError, Proxied};

    use super::*;

    type Answer = BoxBody<Bytes, BoxError>;

    /// What a test of a proxied answer looks at: the handler's runs, and the failures
    /// the layer reported.
    #[derive(Default)]
    struct Seen {
        runs: std::sync::atomic::AtomicUsize,
        failures: Mutex<Vec<UpstreamFailure>>,
    }

    impl Seen {
        fn runs(&self) -> usize {
            self.runs.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn failures(&self) -> Vec<UpstreamFailure> {
            self.failures.lock().unwrap().clone()
        }
    }

    impl Observer for Seen {
        fn upstream_failed(&self, failure: UpstreamFailure) {
            self.failures.lock().unwrap().push(failure);
        }
    }

    /// A layer whose inner service answers as a proxy does, a `201` marked
    /// [`Proxied`] with a deadline 100 ms away and the body `body` makes; its runs and
    /// the failures the layer reports go to `seen`.
    fn proxied<F>(
        limit: usize,
        body: F,
        seen: Arc<Seen>,
    ) -> impl Service<
        Request<Full<Bytes>>,
        Response = Response<IdempotencyBody<Answer>>,
        Error = Infallible,
    > + Clone
    where
        F: Fn() -> Answer + Clone + Send + Sync + 'static,
    {
        let counted = seen.clone();
        let handler = tower::service_fn(move |_: Request<IdempotencyBody<Full<Bytes>>>| {
            counted
                .runs
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = body.clone();
            async move {
                let mut res = Response::new(body());
                *res.status_mut() = http::StatusCode::CREATED;
                res.extensions_mut()
                    .insert(Proxied::by(Instant::now() + Duration::from_millis(100)));
                Ok::<_, Infallible>(res)
            }
        });
        let layer = IdempotencyLayer::new(MemoryStore::new())
            .response_limit(limit)
            .observer(seen);
        layer.layer(handler)
    }

    fn keyed() -> Request<Full<Bytes>> {
        let mut req = Request::post("/v1/charges")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        req.headers_mut()
            .insert("idempotency-key", HeaderValue::from_static("k-1"));
        req
    }

    async fn problem_type(res: Response<IdempotencyBody<Answer>>) -> String {
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["type"].as_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn a_proxied_answer_that_stalls_is_504_and_keeps_the_key_in_progress() {
        let stalled = || {
            let frames = futures_util::stream::pending::<Result<Frame<Bytes>, BoxError>>();
            StreamBody::new(frames).boxed()
        };
        let seen = Arc::new(Seen::default());
        let svc = proxied(1024, stalled, seen.clone());
        let res = svc.clone().oneshot(keyed()).await.unwrap();
        assert_eq!(res.status(), 504);
        // Not recorded, so still marked as no answer of the upstream's.
        assert_eq!(
            res.extensions().get::<ProblemKind>(),
            Some(&ProblemKind::UpstreamTimeout)
        );
        assert_eq!(
            problem_type(res).await,
            "https://idem.dev/problems/upstream-timeout"
        );
        let retry = svc.oneshot(keyed()).await.unwrap();
        assert_eq!(retry.status(), 409, "kept in progress");
        assert_eq!(seen.runs(), 1);
        assert_eq!(seen.failures(), [UpstreamFailure::Timeout]);
    }

    #[tokio::test]
    async fn a_proxied_answer_that_breaks_off_is_504_and_keeps_the_key_in_progress() {
        let broken = || {
            let frames = futures_util::stream::iter([
                Ok(Frame::data(Bytes::from_static(b"{\"id\":"))),
                Err::<Frame<Bytes>, BoxError>("connection reset".into()),
            ]);
            StreamBody::new(frames).boxed()
        };
        let seen = Arc::new(Seen::default());
        let svc = proxied(1024, broken, seen.clone());
        let res = svc.clone().oneshot(keyed()).await.unwrap();
        assert_eq!(res.status(), 504);
        assert_eq!(
            problem_type(res).await,
            "https://idem.dev/problems/upstream-connection-lost"
        );
        let retry = svc.oneshot(keyed()).await.unwrap();
        assert_eq!(retry.status(), 409, "kept in progress");
        assert_eq!(seen.runs(), 1);
        assert_eq!(seen.failures(), [UpstreamFailure::ConnectionLost]);
    }

    #[tokio::test]
    async fn a_proxied_answer_over_the_limit_is_a_recorded_502() {
        let big = || {
            Full::new(Bytes::from(vec![b'x'; 100]))
                .map_err(|never| match never {})
                .boxed()
        };
        let seen = Arc::new(Seen::default());
        let svc = proxied(64, big, seen.clone());
        let res = svc.clone().oneshot(keyed()).await.unwrap();
        assert_eq!(res.status(), 502);
        // Recorded: it looks as its replays do.
        assert!(res.extensions().get::<ProblemKind>().is_none());
        let first = problem_type(res).await;
        assert_eq!(first, "https://idem.dev/problems/upstream-answer-too-large");
        let retry = svc.oneshot(keyed()).await.unwrap();
        assert_eq!(retry.status(), 502);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(problem_type(retry).await, first);
        assert_eq!(seen.runs(), 1);
        assert_eq!(seen.failures(), [UpstreamFailure::AnswerTooLarge]);
    }
}
