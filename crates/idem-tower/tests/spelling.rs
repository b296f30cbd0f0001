//! SPEC S14 in the layer: what upstream stacks read besides the method line and the
//! header names as spelt cannot sidestep the key. A method-override header decides the
//! method a request is keyed as; a key or tenant header spelt with `_` for `-` is
//! refused. A counting service stands for the upstream.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderName, Method};
use http_body_util::{BodyExt, Full};
use idem_core::{MemoryStore, Store};
use idem_tower::{IdempotencyBody, IdempotencyLayer};
use tower::ServiceExt;
use tower::util::BoxCloneService;

type Echo = BoxCloneService<
    http::Request<Full<Bytes>>,
    http::Response<IdempotencyBody<Full<Bytes>>>,
    Infallible,
>;

/// A service answering `201` with the method it was called with and the override
/// header it saw, behind a layer `configure` adjusts; and how often it ran.
fn echo(
    configure: impl FnOnce(IdempotencyLayer<Arc<dyn Store>>) -> IdempotencyLayer<Arc<dyn Store>>,
) -> (Echo, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = tower::service_fn(move |req: http::Request<IdempotencyBody<_>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        let over = req
            .headers()
            .get("x-http-method-override")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        async move {
            let body = format!("{} {over} #{n}", req.method());
            Ok::<_, Infallible>(
                http::Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from(body)))
                    .unwrap(),
            )
        }
    });
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let layer = configure(IdempotencyLayer::new(store));
    (
        BoxCloneService::new(tower::Layer::layer(&layer, handler)),
        runs,
    )
}

struct Answer {
    status: u16,
    replayed: bool,
    body: String,
}

impl Answer {
    fn problem_type(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        v["type"].as_str().unwrap().to_owned()
    }
}

async fn call(svc: &Echo, method: Method, headers: &[(&str, &str)]) -> Answer {
    let mut req = http::Request::builder()
        .method(method)
        .uri("/v1/charges")
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from_static(br#"{"amount":100}"#)))
        .unwrap();
    let res = svc.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        replayed,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

const KEY: &str = "idempotency-key";
const OVERRIDE: &str = "x-http-method-override";

/// A `GET` that a framework runs as a `POST` because of its override header is keyed
/// as that `POST`: sent twice under one key it runs once, and the service gets it as
/// sent (a `GET` with its override).
#[tokio::test]
async fn get_overridden_to_post_is_keyed_as_post() {
    let (svc, runs) = echo(|l| l);
    let headers = [(KEY, "k-get-post"), (OVERRIDE, "POST")];
    let first = call(&svc, Method::GET, &headers).await;
    assert_eq!((first.status, first.replayed), (201, false));
    assert_eq!(first.body, "GET POST #1", "forwarded as sent");
    let again = call(&svc, Method::GET, &headers).await;
    assert_eq!((again.status, again.replayed), (201, true));
    assert_eq!(again.body, first.body);
    // Each override header, in any case, is the same POST under the same key.
    for name in ["x-http-method", "x-method-override"] {
        let again = call(&svc, Method::GET, &[(KEY, "k-get-post"), (name, "post")]).await;
        assert_eq!((again.status, again.replayed), (201, true), "{name}");
    }
    // And it is the scope of a plain POST of the same body.
    let post = call(&svc, Method::POST, &[(KEY, "k-get-post")]).await;
    assert_eq!((post.status, post.replayed), (201, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A required key holds for a `GET` overridden to `POST`.
#[tokio::test]
async fn required_key_holds_for_a_get_overridden_to_post() {
    let (svc, runs) = echo(|l| l.require_key(true));
    let answer = call(&svc, Method::GET, &[(OVERRIDE, "POST")]).await;
    assert_eq!(answer.status, 400);
    assert_eq!(
        answer.problem_type(),
        "https://idem.dev/problems/missing-key"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // A GET without an override still passes through.
    assert_eq!(call(&svc, Method::GET, &[]).await.status, 201);
}

/// The route hook and a key-requiring predicate are given the method the request is
/// decided on, beside the head as sent: a route rule for `POST` applies to a `GET`
/// overridden to `POST`, so an override cannot pick another route's rules (here, the
/// rule that requires a key), and the request still reaches the service as sent.
#[tokio::test]
async fn hooks_see_the_decided_method_and_the_head_as_sent() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (svc, runs) = echo({
        let seen = seen.clone();
        move |l| {
            l.route_config(move |method, parts| {
                seen.lock()
                    .unwrap()
                    .push(format!("{method} {}", parts.method));
                (method == Method::POST).then(|| idem_tower::RouteConfig::new().require_key(true))
            })
            .require_key_if(|method, parts| method == Method::PATCH && parts.method == Method::POST)
        }
    });
    let answer = call(&svc, Method::GET, &[(OVERRIDE, "POST")]).await;
    assert_eq!(answer.status, 400, "the POST route's rule applies");
    assert_eq!(
        answer.problem_type(),
        "https://idem.dev/problems/missing-key"
    );
    // A POST overridden to PATCH: no route rule, the predicate sees PATCH over POST.
    let answer = call(&svc, Method::POST, &[(OVERRIDE, "PATCH")]).await;
    assert_eq!(answer.status, 400, "the predicate held");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let keyed = call(&svc, Method::GET, &[(KEY, "k-hooks"), (OVERRIDE, "POST")]).await;
    assert_eq!((keyed.status, keyed.body.as_str()), (201, "GET POST #1"));
    assert_eq!(
        *seen.lock().unwrap(),
        ["POST GET", "PATCH POST", "POST GET"],
        "the decided method, then the method as sent"
    );
}

/// A `POST` overridden to `PATCH` is scoped and fingerprinted as the `PATCH` the
/// upstream runs: a plain `PATCH` under its key replays it.
#[tokio::test]
async fn post_overridden_to_patch_is_scoped_as_patch() {
    let (svc, runs) = echo(|l| l);
    let first = call(&svc, Method::POST, &[(KEY, "k-patch"), (OVERRIDE, "PATCH")]).await;
    assert_eq!((first.status, first.replayed), (201, false));
    let patch = call(&svc, Method::PATCH, &[(KEY, "k-patch")]).await;
    assert_eq!((patch.status, patch.replayed), (201, true));
    // A plain POST is another endpoint: it executes under the same key.
    let post = call(&svc, Method::POST, &[(KEY, "k-patch")]).await;
    assert_eq!((post.status, post.replayed), (201, false));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A `POST` overridden to `GET` stays keyed as a `POST`, for an upstream that ignores
/// the override and runs it as one.
#[tokio::test]
async fn post_overridden_to_get_stays_keyed_as_post() {
    let (svc, runs) = echo(|l| l.require_key(true));
    let missing = call(&svc, Method::POST, &[(OVERRIDE, "GET")]).await;
    assert_eq!(missing.status, 400, "{}", missing.body);
    let headers = [(KEY, "k-post-get"), (OVERRIDE, "GET")];
    assert!(!call(&svc, Method::POST, &headers).await.replayed);
    assert!(call(&svc, Method::POST, &headers).await.replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Override headers that name two methods, or no method, are a 400 that reaches
/// nobody: the upstream might run the request as either.
#[tokio::test]
async fn conflicting_method_overrides_are_400() {
    let (svc, runs) = echo(|l| l);
    let cases: [&[(&str, &str)]; 4] = [
        &[(OVERRIDE, "POST"), ("x-http-method", "PATCH")],
        &[(OVERRIDE, "POST, DELETE")],
        &[("x-method-override", "")],
        &[(KEY, "k-bad"), (OVERRIDE, "PO ST")],
    ];
    for headers in cases {
        for method in [Method::GET, Method::POST] {
            let answer = call(&svc, method.clone(), headers).await;
            assert_eq!(answer.status, 400, "{method} {headers:?}");
            assert_eq!(
                answer.problem_type(),
                "https://idem.dev/problems/invalid-method-override",
                "{method} {headers:?}"
            );
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// With no override headers configured the method line alone decides: a `GET` with an
/// override passes through, every time.
#[tokio::test]
async fn without_override_headers_the_method_line_decides() {
    let (svc, runs) = echo(|l| l.method_override_headers(std::iter::empty()));
    let headers = [(KEY, "k-off"), (OVERRIDE, "POST")];
    for _ in 0..2 {
        let answer = call(&svc, Method::GET, &headers).await;
        assert_eq!((answer.status, answer.replayed), (201, false));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// `Idempotency_Key` is `Idempotency-Key` to CGI and WSGI servers: a keyed request
/// carrying it, with or without the real header, is refused before anything runs, as
/// is a tenant header so spelt. Unkeyed requests pass through untouched.
#[tokio::test]
async fn underscore_spellings_of_key_and_tenant_headers_are_400() {
    let (svc, runs) = echo(|l| {
        l.tenant_headers([
            HeaderName::from_static("authorization"),
            HeaderName::from_static("x-api-key"),
        ])
    });
    let cases: [&[(&str, &str)]; 4] = [
        &[("idempotency_key", "k-under")],
        &[(KEY, "k-under"), ("Idempotency_Key", "k-other")],
        &[(KEY, "k-under"), ("x_api_key", "tenant-b")],
        &[(KEY, "k-under"), ("x-api_key", "tenant-b")],
    ];
    for headers in cases {
        let answer = call(&svc, Method::POST, headers).await;
        assert_eq!(answer.status, 400, "{headers:?}: {}", answer.body);
        assert_eq!(
            answer.problem_type(),
            "https://idem.dev/problems/ambiguous-header",
            "{headers:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let get = call(&svc, Method::GET, &[("idempotency_key", "k-under")]).await;
    assert_eq!(get.status, 201);
    let other = call(&svc, Method::POST, &[(KEY, "k-under"), ("x_trace", "1")]).await;
    assert_eq!(other.status, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
