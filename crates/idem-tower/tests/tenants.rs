//! Whose key is it (SPEC S3), at the layer: the tenant is keyed by the store's secret
//! unless the layer is given one, layers on one store agree, a keyed request without
//! a tenant can be refused, and no secret means nothing is scoped.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, Request, Response};
use http_body_util::{BodyExt, Full};
use idem_core::{MemoryStore, Store, StoreError, TENANT_PREFIX, Tenant, TenantKey};
use idem_test_support::scope;
use idem_test_support::{HookedStore, StoreHooks};
use idem_tower::{IdempotencyBody, IdempotencyLayer};
use tower::{Layer, Service, ServiceExt};

fn charge(key: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut req = Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::from_static(br#"{"amount":100}"#)))
        .expect("request")
}

type Handler = tower::util::BoxCloneService<
    Request<IdempotencyBody<Full<Bytes>>>,
    Response<Full<Bytes>>,
    Infallible,
>;

/// A handler that counts its calls and answers `charge N`.
fn counting(runs: &Arc<AtomicUsize>) -> Handler {
    let runs = runs.clone();
    tower::util::BoxCloneService::new(tower::service_fn(
        move |_: Request<IdempotencyBody<Full<Bytes>>>| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from(format!("charge {n}"))))
                        .unwrap(),
                )
            }
        },
    ))
}

async fn send<S>(service: &mut S, req: Request<Full<Bytes>>) -> (u16, http::HeaderMap, Bytes)
where
    S: Service<Request<Full<Bytes>>, Response = Response<IdempotencyBody<Full<Bytes>>>>,
    S::Error: std::fmt::Debug,
{
    let res = tokio::time::timeout(
        Duration::from_secs(10),
        service.ready().await.unwrap().call(req),
    )
    .await
    .expect("an answer")
    .unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body)
}

/// By default the layer hashes `Authorization` under the secret the store keeps
/// (generated on the store's first use): the stored tenant is that HMAC, and a second
/// layer on the same store (another instance) replays the first one's answer.
#[tokio::test]
async fn default_tenant_is_keyed_by_the_stores_secret_and_layers_agree() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let auth = [("authorization", "Basic alice:hunter2")];
    let mut first = IdempotencyLayer::from_arc(store.clone()).layer(counting(&runs));
    let (status, _, body) = send(&mut first, charge("k-1", &auth)).await;
    assert_eq!((status, &body[..]), (201, &b"charge 1"[..]));

    let tenants = TenantKey::from_store(&*store).await.unwrap();
    let tenant = tenants.credential("authorization", b"basic alice:hunter2");
    assert!(tenant.as_str().starts_with(TENANT_PREFIX), "{tenant}");
    assert!(
        store
            .get(&scope(tenant, "/charges", "k-1"))
            .await
            .unwrap()
            .is_some(),
        "the record is under the HMAC of the scheme-folded credential"
    );

    let mut second = IdempotencyLayer::from_arc(store.clone()).layer(counting(&runs));
    let (status, headers, replayed) = send(&mut second, charge("k-1", &auth)).await;
    assert_eq!(status, 201);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replayed, body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A key given to the layer is the one used; another key names another tenant.
#[tokio::test]
async fn a_given_tenant_key_names_the_tenant() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let key = TenantKey::new(&[5; 32]).unwrap();
    let auth = [("authorization", "Bearer sk_1")];
    let mut svc = IdempotencyLayer::from_arc(store.clone())
        .tenant_key(key.clone())
        .layer(counting(&runs));
    assert_eq!(send(&mut svc, charge("k-2", &auth)).await.0, 201);
    let expected = key.credential("authorization", b"bearer sk_1");
    assert!(
        store
            .get(&scope(expected, "/charges", "k-2"))
            .await
            .unwrap()
            .is_some()
    );

    let mut other = IdempotencyLayer::from_arc(store.clone())
        .tenant_key(TenantKey::new(&[6; 32]).unwrap())
        .layer(counting(&runs));
    let (_, headers, _) = send(&mut other, charge("k-2", &auth)).await;
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// `require_tenant`: a keyed request carrying none of the tenant headers is a 401
/// `missing-tenant` with a challenge, the handler is not called and nothing is
/// reserved; the same key with a tenant then executes, and an unkeyed request passes.
#[tokio::test]
async fn require_tenant_refuses_keyed_requests_without_one() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = IdempotencyLayer::from_arc(store.clone())
        .tenant_headers([
            http::header::AUTHORIZATION,
            HeaderName::from_static("stripe-account"),
        ])
        .require_tenant(true)
        .layer(counting(&runs));
    let (status, headers, body) = send(&mut svc, charge("k-3", &[])).await;
    assert_eq!(status, 401);
    assert_eq!(headers["www-authenticate"], "Bearer");
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "https://idem.dev/problems/missing-tenant");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("authorization, stripe-account"), "{detail}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(store.is_empty(), "nothing was reserved");

    let (status, _, _) = send(&mut svc, charge("k-3", &[("stripe-account", "acct_1")])).await;
    assert_eq!(status, 201);
    let unkeyed = Request::get("/charges")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(&mut svc, unkeyed).await.0, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // With a caller's extractor, an anonymous tenant is the missing one.
    let mut custom = IdempotencyLayer::from_arc(store.clone())
        .tenant_from(|_| Tenant::anonymous())
        .require_tenant(true)
        .layer(counting(&runs));
    assert_eq!(
        send(&mut custom, charge("k-4", &[("authorization", "x")]))
            .await
            .0,
        401
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A store that answers everything but the secret, which it cannot reach until told.
struct NoSecretYet {
    reachable: std::sync::atomic::AtomicBool,
    asked: AtomicUsize,
}

#[async_trait]
impl StoreHooks<MemoryStore> for NoSecretYet {
    async fn ping(&self, _: &MemoryStore) -> idem_core::Result<()> {
        Ok(())
    }
    async fn init_secret(
        &self,
        inner: &MemoryStore,
        name: &str,
        candidate: &[u8],
    ) -> idem_core::Result<Vec<u8>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if !self.reachable.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("not yet"));
        }
        inner.init_secret(name, candidate).await
    }
}

/// Without the secret no request is scoped: a 503 `store-unavailable`, the handler
/// not called, nothing reserved; once the store answers, the layer fetches it once
/// and serves.
#[tokio::test]
async fn no_secret_means_nothing_is_scoped_and_it_is_fetched_once() {
    let store = Arc::new(HookedStore::new(
        MemoryStore::new(),
        NoSecretYet {
            reachable: false.into(),
            asked: AtomicUsize::new(0),
        },
    ));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut svc = IdempotencyLayer::from_arc(store.clone()).layer(counting(&runs));
    let auth = [("authorization", "Bearer sk_1")];
    let (status, headers, _) = send(&mut svc, charge("k-5", &auth)).await;
    assert_eq!(status, 503);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(store.inner.is_empty());

    store.hooks.reachable.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(send(&mut svc, charge("k-5", &auth)).await.0, 201);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retries replay");
    assert_eq!(
        store.hooks.asked.load(Ordering::SeqCst),
        2,
        "fetched once it answered"
    );
}

/// A service that authenticates in its own middleware scopes by its own principal
/// (issue 39 §1): the middleware puts a `Principal` in the extensions, and the layer
/// names the tenant by it, before the headers. A client that refreshed its credential
/// keeps its tenant; another account with the same key gets its own execution; a
/// request the middleware did not authenticate is named by its headers.
#[tokio::test]
async fn a_principal_from_the_services_own_authentication_names_the_tenant() {
    use idem_tower::{Principal, TenantSources};
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .tenant_key(TenantKey::new(&[5; 32]).unwrap())
        .tenant_sources(TenantSources::new().principal().headers());
    // The service's authentication: `x-test-account` stands for whatever it checked.
    let authenticate = |mut req: Request<Full<Bytes>>| {
        if let Some(account) = req.headers().get("x-test-account") {
            let account = account.to_str().unwrap().to_owned();
            req.extensions_mut().insert(Principal::new(
                Some("my-auth".into()),
                [("account", account)],
            ));
        }
        req
    };
    let mut svc = tower::util::MapRequest::new(layer.layer(counting(&runs)), authenticate);
    let key = "k-principal";
    let as_acct = |acct: &'static str, token: &'static str| {
        charge(key, &[("x-test-account", acct), ("authorization", token)])
    };
    let (status, _, first) = send(&mut svc, as_acct("acct_1", "Bearer old")).await;
    assert_eq!(status, 201);
    let (_, headers, again) = send(&mut svc, as_acct("acct_1", "Bearer refreshed")).await;
    assert_eq!(again, first, "the same principal replays");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let (_, _, other) = send(&mut svc, as_acct("acct_2", "Bearer refreshed")).await;
    assert_ne!(other, first, "another principal executes");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Not authenticated by the middleware: named by the headers, a tenant of its own.
    let (_, _, by_headers) = send(&mut svc, charge(key, &[("authorization", "Bearer old")])).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "{by_headers:?}");
}
