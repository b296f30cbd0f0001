//! Tests of `execute.rs`.

use std::convert::Infallible;
use std::sync::Mutex;
use std::time::Instant;

use http::HeaderValue;
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{Full, StreamBody};
use idem_core::MemoryStore;
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::{IdempotencyLayer, Observer};

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
) -> impl Service<Request<Full<Bytes>>, Response = Response<IdempotencyBody<Answer>>, Error = Infallible>
+ Clone
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
