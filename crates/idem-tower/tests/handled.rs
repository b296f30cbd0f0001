//! `Handled`: every answer of the layer says what the layer did, for an access log
//! outside it; called in process, so that the response's extensions can be read.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use idem_core::MemoryStore;
use idem_tower::{Handled, IdempotencyLayer, Outcome};
use tower::{Layer, ServiceExt};

fn request(method: &str, key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .method(method)
        .uri("/v1/charges")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk_test_alice");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn every_answer_says_its_outcome_attempt_and_scope() {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |_req: Request<_>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(StatusCode::CREATED)
                        .body(Full::new(Bytes::from_static(b"{\"id\":\"ch_1\"}")))
                        .unwrap(),
                )
            }
        })
    };
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(handler);
    let handled = |res: &Response<_>| res.extensions().get::<Handled>().cloned().expect("marked");

    let first = svc
        .clone()
        .oneshot(request("POST", Some("k-1"), "{\"amount\":1}"))
        .await
        .unwrap();
    let mark = handled(&first);
    assert_eq!(mark.outcome, Outcome::Executed);
    assert_eq!(mark.attempt, Some(1));
    let scope = mark.scope.expect("a keyed answer names its scope");
    assert_eq!(scope.key().as_str(), "k-1");

    let retry = svc
        .clone()
        .oneshot(request("POST", Some("k-1"), "{\"amount\":1}"))
        .await
        .unwrap();
    let mark = handled(&retry);
    assert_eq!((mark.outcome, mark.attempt), (Outcome::Replayed, None));
    assert_eq!(mark.scope.map(|s| s.digest()), Some(scope.digest()));

    let reused = svc
        .clone()
        .oneshot(request("POST", Some("k-1"), "{\"amount\":2}"))
        .await
        .unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(handled(&reused).outcome, Outcome::Mismatch);

    let empty = svc
        .clone()
        .oneshot(request("POST", Some(""), "{}"))
        .await
        .unwrap();
    assert_eq!(empty.status(), StatusCode::BAD_REQUEST);
    let mark = handled(&empty);
    assert_eq!(
        (mark.outcome, mark.scope.is_none()),
        (Outcome::Rejected, true)
    );

    let read = svc.clone().oneshot(request("GET", None, "")).await.unwrap();
    let mark = handled(&read);
    assert_eq!((mark.outcome, mark.attempt), (Outcome::PassedThrough, None));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the first POST and the GET ran"
    );
}
