//! Unary gRPC calls through the layer (SPEC S18), driven without a server: a handler
//! that answers as a gRPC server does (a message, then `grpc-status` in the trailers,
//! or a trailers-only answer), its answer recorded with its trailers and replayed with
//! them, the key released by gRPC status, and the layer's own answers as gRPC errors.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use idem_core::{MemoryStore, Reservation, ReserveRequest, StoreError};
use idem_test_support::{HookedStore, StoreHooks};
use idem_tower::{BoxError, GrpcReleaseCodes, IdempotencyBody, IdempotencyLayer, RouteConfig};
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};

type Answer = BoxBody<Bytes, BoxError>;

/// One gRPC length-prefixed message.
fn message(payload: &[u8]) -> Bytes {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    Bytes::from(framed)
}

fn call(key: Option<&str>, body: Bytes) -> Request<Full<Bytes>> {
    let mut req = Request::post("/shop.Orders/Create")
        .version(http::Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(body))
        .unwrap();
    if let Some(key) = key {
        req.headers_mut()
            .insert("idempotency-key", HeaderValue::from_str(key).unwrap());
    }
    req
}

fn order(key: &str) -> Request<Full<Bytes>> {
    call(Some(key), message(b"tea x2"))
}

/// How the test handler answers.
#[derive(Clone, Copy)]
enum Shape {
    /// A message `order <n>`, then the status in the trailers.
    Trailers,
    /// No message: the status in the headers (trailers-only).
    TrailersOnly,
    /// It panics.
    Panics,
}

/// A gRPC handler answering as `shape` says with the status in `status`; `runs` counts
/// its runs, and each waits for a permit of `gate` when one is given.
#[derive(Clone)]
struct Handler {
    runs: Arc<AtomicUsize>,
    status: Arc<AtomicU32>,
    shape: Shape,
    gate: Option<Arc<Semaphore>>,
}

impl Handler {
    fn new(shape: Shape, status: u32) -> Handler {
        Handler {
            runs: Arc::default(),
            status: Arc::new(AtomicU32::new(status)),
            shape,
            gate: None,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// `this` as a service.
fn serve(
    this: Handler,
) -> impl Service<
    Request<IdempotencyBody<Full<Bytes>>>,
    Response = Response<Answer>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send {
    tower::service_fn(move |_: Request<IdempotencyBody<Full<Bytes>>>| {
        let this = this.clone();
        async move {
            let n = this.runs.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(gate) = &this.gate {
                gate.acquire().await.unwrap().forget();
            }
            let status = this.status.load(Ordering::SeqCst);
            let mut status_fields = HeaderMap::new();
            status_fields.insert("grpc-status", HeaderValue::from(status));
            status_fields.insert("grpc-message", HeaderValue::from_static("as%20told"));
            status_fields.insert(
                "grpc-status-details-bin",
                HeaderValue::from_static("CAUSGg"),
            );
            let mut response = match this.shape {
                Shape::Panics => panic!("the handler has a bug"),
                Shape::Trailers => {
                    let frames = vec![
                        Ok(Frame::data(message(format!("order {n}").as_bytes()))),
                        Ok(Frame::trailers(status_fields)),
                    ];
                    let body = StreamBody::new(futures_util::stream::iter(frames));
                    Response::new(BoxBody::new(body))
                }
                Shape::TrailersOnly => {
                    let empty = Full::new(Bytes::new()).map_err(|never| match never {});
                    let mut response = Response::new(BoxBody::new(empty));
                    response.headers_mut().extend(status_fields);
                    response
                }
            };
            response
                .headers_mut()
                .insert("content-type", HeaderValue::from_static("application/grpc"));
            Ok::<_, Infallible>(response)
        }
    })
}

/// An answer read whole: head, message bytes, trailers.
struct Read {
    head: http::response::Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl Read {
    fn status(&self) -> Option<&str> {
        let from = self.trailers.as_ref().unwrap_or(&self.head.headers);
        from.get("grpc-status").map(|v| v.to_str().unwrap())
    }

    fn replayed(&self) -> bool {
        self.head
            .headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

async fn read<B>(response: Response<IdempotencyBody<B>>) -> Read
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (head, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    Read {
        head,
        body: collected.to_bytes(),
        trailers,
    }
}

#[tokio::test]
async fn a_unary_call_is_recorded_with_its_trailers_and_replayed_with_them() {
    let handler = Handler::new(Shape::Trailers, 0);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
    let first = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    assert_eq!(first.head.status, 200);
    assert_eq!(first.body, message(b"order 1"));
    assert_eq!(first.status(), Some("0"));
    assert!(!first.replayed());

    let retry = read(svc.oneshot(order("k-1")).await.unwrap()).await;
    assert_eq!(handler.runs(), 1, "the handler ran once");
    assert!(
        retry.replayed(),
        "idempotent-replayed in the initial metadata"
    );
    assert_eq!(retry.head.status, 200);
    assert_eq!(retry.head.headers["content-type"], "application/grpc");
    assert_eq!(retry.body, message(b"order 1"));
    let trailers = retry.trailers.expect("the status comes as trailers again");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "as%20told");
    assert_eq!(trailers["grpc-status-details-bin"], "CAUSGg");
    assert!(
        retry.head.headers.get("grpc-status").is_none(),
        "not in the headers"
    );
}

#[tokio::test]
async fn a_status_that_says_the_call_ran_is_recorded() {
    for status in [9, 13, 5, 2] {
        let handler = Handler::new(Shape::Trailers, status);
        let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
        let first = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
        let retry = read(svc.oneshot(order("k-1")).await.unwrap()).await;
        assert_eq!(handler.runs(), 1, "status {status} is recorded");
        assert!(retry.replayed());
        assert_eq!(retry.status(), first.status());
        assert_eq!(retry.body, first.body);
    }
}

#[tokio::test]
async fn a_release_status_in_the_trailers_releases_the_key() {
    for status in [3, 7, 8, 10, 14, 16] {
        let handler = Handler::new(Shape::Trailers, status);
        let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
        let first = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
        assert_eq!(first.status(), Some(status.to_string().as_str()));
        assert!(
            first.trailers.is_some(),
            "the first caller gets the trailers"
        );
        handler.status.store(0, Ordering::SeqCst);
        let retry = read(svc.oneshot(order("k-1")).await.unwrap()).await;
        assert_eq!(handler.runs(), 2, "status {status} released the key");
        assert!(!retry.replayed());
        assert_eq!(retry.status(), Some("0"));
        assert_eq!(retry.body, message(b"order 2"));
    }
}

#[tokio::test]
async fn a_trailers_only_answer_is_decided_by_its_header_status_and_replayed_as_one() {
    let handler = Handler::new(Shape::TrailersOnly, 16);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
    let first = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    assert_eq!(first.head.headers["grpc-status"], "16");
    handler.status.store(6, Ordering::SeqCst);
    let second = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    assert_eq!(handler.runs(), 2, "UNAUTHENTICATED released the key");
    assert_eq!(second.head.headers["grpc-status"], "6");

    let replay = read(svc.oneshot(order("k-1")).await.unwrap()).await;
    assert_eq!(handler.runs(), 2, "ALREADY_EXISTS was recorded");
    assert!(replay.replayed());
    assert_eq!(replay.head.headers["grpc-status"], "6");
    assert_eq!(replay.head.headers["grpc-message"], "as%20told");
    assert_eq!(replay.head.headers["grpc-status-details-bin"], "CAUSGg");
    assert!(replay.body.is_empty());
    assert!(replay.trailers.is_none(), "trailers-only, as first sent");
}

#[tokio::test]
async fn configured_release_codes_replace_the_defaults_and_a_route_may_replace_them_again() {
    let handler = Handler::new(Shape::Trailers, 13);
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .grpc_release_codes(GrpcReleaseCodes::parse(["INTERNAL"]).unwrap())
        .route_config(|_method, parts| {
            (parts.uri.path() == "/shop.Orders/Cancel").then(|| {
                RouteConfig::new().grpc_release_codes(GrpcReleaseCodes::parse(["5"]).unwrap())
            })
        });
    let svc = layer.layer(serve(handler.clone()));
    read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    handler.status.store(14, Ordering::SeqCst);
    read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    assert_eq!(handler.runs(), 2, "INTERNAL releases");
    let replay = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    assert_eq!(handler.runs(), 2, "UNAVAILABLE is recorded once not listed");
    assert_eq!(replay.status(), Some("14"));

    let cancel = || {
        let mut req = order("k-2");
        *req.uri_mut() = "/shop.Orders/Cancel".parse().unwrap();
        req
    };
    handler.status.store(13, Ordering::SeqCst);
    read(svc.clone().oneshot(cancel()).await.unwrap()).await;
    read(svc.oneshot(cancel()).await.unwrap()).await;
    assert_eq!(handler.runs(), 3, "the route records INTERNAL");
}

/// A gRPC error's status, message and pushback, from a trailers-only answer.
fn grpc_error(read: &Read) -> (&str, &str, Option<&str>) {
    assert_eq!(read.head.status, 200, "a gRPC error is an HTTP 200");
    assert_eq!(read.head.headers["content-type"], "application/grpc");
    assert!(
        read.body.is_empty() && read.trailers.is_none(),
        "trailers-only"
    );
    let h = &read.head.headers;
    (
        h["grpc-status"].to_str().unwrap(),
        h["grpc-message"].to_str().unwrap(),
        h.get("grpc-retry-pushback-ms").map(|v| v.to_str().unwrap()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_progress_is_aborted_with_a_pushback() {
    let mut handler = Handler::new(Shape::Trailers, 0);
    let gate = Arc::new(Semaphore::new(0));
    handler.gate = Some(gate.clone());
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
    let first = tokio::spawn(svc.clone().oneshot(order("k-1")));
    idem_test_support::eventually("the first call runs", Duration::from_secs(10), async || {
        handler.runs() == 1
    })
    .await;
    let second = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    let (code, message, pushback) = grpc_error(&second);
    assert_eq!(code, "10", "ABORTED");
    assert!(message.contains("still being processed"), "{message}");
    assert_eq!(pushback, Some("1000"));
    gate.add_permits(1);
    let first = read(first.await.unwrap().unwrap()).await;
    assert_eq!(first.status(), Some("0"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn a_key_reused_with_another_message_is_failed_precondition() {
    let handler = Handler::new(Shape::Trailers, 0);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
    read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    let other = call(Some("k-1"), message(b"tea x3"));
    let reused = read(svc.oneshot(other).await.unwrap()).await;
    let (code, message, _) = grpc_error(&reused);
    assert_eq!(code, "9", "FAILED_PRECONDITION");
    assert!(
        message.contains("reused with a different payload"),
        "{message}"
    );
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn the_fingerprint_is_the_message_bytes_not_their_json_reading() {
    let handler = Handler::new(Shape::Trailers, 0);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
    let json = |text: &'static [u8]| {
        let mut req = call(Some("k-1"), message(text));
        req.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("application/grpc+json"),
        );
        req
    };
    read(
        svc.clone()
            .oneshot(json(br#"{"a":1,"b":2}"#))
            .await
            .unwrap(),
    )
    .await;
    let reordered = read(svc.oneshot(json(br#"{"b":2,"a":1}"#)).await.unwrap()).await;
    assert_eq!(
        grpc_error(&reordered).0,
        "9",
        "other bytes are another message"
    );
}

#[tokio::test]
async fn a_malformed_or_missing_key_is_invalid_argument_and_nothing_runs() {
    let handler = Handler::new(Shape::Trailers, 0);
    let layer = IdempotencyLayer::new(MemoryStore::new()).require_key(true);
    let svc = layer.layer(serve(handler.clone()));
    let bad = read(
        svc.clone()
            .oneshot({
                let mut twice = order("k-1");
                twice
                    .headers_mut()
                    .append("idempotency-key", HeaderValue::from_static("k-2"));
                twice
            })
            .await
            .unwrap(),
    )
    .await;
    let (code, _, _) = grpc_error(&bad);
    assert_eq!(code, "3", "INVALID_ARGUMENT");
    let missing = read(svc.oneshot(call(None, message(b"tea"))).await.unwrap()).await;
    let (code, message, _) = grpc_error(&missing);
    assert_eq!(code, "3", "INVALID_ARGUMENT");
    assert!(message.contains("requires an idempotency-key"), "{message}");
    assert_eq!(handler.runs(), 0);
}

#[tokio::test]
async fn a_call_without_a_key_passes_through_and_a_streaming_one_with_a_key_is_refused() {
    let handler = Handler::new(Shape::Trailers, 0);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
    let mut two = message(b"a").to_vec();
    two.extend_from_slice(&message(b"b"));
    let streaming = read(
        svc.clone()
            .oneshot(call(None, two.clone().into()))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(streaming.status(), Some("0"), "unkeyed: passed through");
    assert_eq!(handler.runs(), 1);
    let keyed = read(svc.oneshot(call(Some("k-1"), two.into())).await.unwrap()).await;
    let (code, message, _) = grpc_error(&keyed);
    assert_eq!(code, "3");
    assert!(message.contains("unary calls only"), "{message}");
    assert_eq!(handler.runs(), 1, "nothing was forwarded");
}

/// A store that cannot be reached.
struct Down;

#[async_trait]
impl StoreHooks<MemoryStore> for Down {
    async fn reserve(&self, _: &MemoryStore, _: &ReserveRequest) -> idem_core::Result<Reservation> {
        Err(StoreError::unavailable("connection refused"))
    }
}

#[tokio::test]
async fn a_store_outage_is_unavailable_with_a_pushback_and_nothing_runs() {
    let handler = Handler::new(Shape::Trailers, 0);
    let layer = IdempotencyLayer::new(HookedStore::new(MemoryStore::new(), Down))
        .tenant_key(idem_core::TenantKey::new(b"a test tenant key, 32 bytes long").unwrap());
    let svc = layer.layer(serve(handler.clone()));
    let down = read(svc.oneshot(order("k-1")).await.unwrap()).await;
    let (code, _, pushback) = grpc_error(&down);
    assert_eq!(code, "14", "UNAVAILABLE");
    assert_eq!(pushback, Some("1000"));
    assert_eq!(handler.runs(), 0);
}

#[tokio::test]
async fn a_handler_that_panics_is_a_recorded_internal() {
    let handler = Handler::new(Shape::Panics, 0);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(serve(handler.clone()));
    let first = read(svc.clone().oneshot(order("k-1")).await.unwrap()).await;
    let (code, message, _) = grpc_error(&first);
    assert_eq!(code, "13", "INTERNAL");
    assert!(message.contains("may have had effects"), "{message}");
    let retry = read(svc.oneshot(order("k-1")).await.unwrap()).await;
    assert!(retry.replayed());
    assert_eq!(retry.head.headers["grpc-status"], "13");
    assert_eq!(handler.runs(), 1);
}

/// A recorded answer that cannot be opened (sealed under a key the layer's ring lacks)
/// is `DATA_LOSS` without a pushback, not `UNAVAILABLE`, which gRPC clients retry as
/// safe: the call ran once, and does not run again.
#[tokio::test]
async fn an_answer_that_cannot_be_unsealed_is_data_loss_and_nothing_runs_again() {
    let ring = |id: &str, byte: u8| idem_core::RecordKeys::new([(id, [byte; 32])]).unwrap();
    let inner = Arc::new(MemoryStore::new());
    let handler = Handler::new(Shape::Trailers, 0);
    let sealing = IdempotencyLayer::new(idem_core::Sealed::new(inner.clone(), ring("k1", 1)));
    let first = read(
        sealing
            .layer(serve(handler.clone()))
            .oneshot(order("k-1"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(first.head.status, 200);
    let other = IdempotencyLayer::new(idem_core::Sealed::new(inner, ring("k2", 2)));
    let retry = read(
        other
            .layer(serve(handler.clone()))
            .oneshot(order("k-1"))
            .await
            .unwrap(),
    )
    .await;
    let (code, message, pushback) = grpc_error(&retry);
    assert_eq!(code, "15", "DATA_LOSS: {message}");
    assert_eq!(pushback, None);
    assert_eq!(handler.runs(), 1, "the call ran once");
}
