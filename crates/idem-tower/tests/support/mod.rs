//! A real axum server on 127.0.0.1 behind `IdempotencyLayer`, a client, and the stores
//! every HTTP test runs against.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{Fingerprint, FingerprintOptions, ManualClock, ReserveRequest, Store, Tenant};
use idem_sqlite::SqliteStore;
use idem_test_support::scope;
use idem_tower::{Disposition, IdempotencyContext, IdempotencyLayer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The store a test runs against.
#[derive(Debug, Clone, Copy)]
pub enum StoreKind {
    Memory,
    Sqlite,
}

/// A store plus what must live as long as it (the SQLite file's directory).
pub struct TestStore {
    pub store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

pub async fn make_store(kind: StoreKind, clock: &ManualClock) -> TestStore {
    match kind {
        StoreKind::Memory => TestStore {
            store: Arc::new(idem_core::MemoryStore::with_clock(Arc::new(clock.clone()))),
            _dir: None,
        },
        StoreKind::Sqlite => {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("idem.db");
            let store = SqliteStore::builder()
                .clock(Arc::new(clock.clone()))
                .connect(path.to_str().expect("utf-8 path"))
                .await
                .expect("open sqlite store");
            TestStore {
                store: Arc::new(store),
                _dir: Some(dir),
            }
        }
    }
}

/// How many times each handler really ran.
#[derive(Default, Debug)]
pub struct Counters {
    pub orders: AtomicUsize,
    pub captures: AtomicUsize,
    pub statuses: AtomicUsize,
    pub slow_started: AtomicUsize,
    pub slow_finished: AtomicUsize,
    pub panics: AtomicUsize,
    pub reads: AtomicUsize,
    /// `POST /reports` executions, and `GET /reports?id=N` renderings.
    pub reports: AtomicUsize,
    pub report_reads: AtomicUsize,
    /// Requests whose response future was dropped before it finished (the client went
    /// away), seen by a probe outside the idempotency layer.
    pub cancelled: AtomicUsize,
}

impl Counters {
    pub fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

struct Handlers {
    counters: Arc<Counters>,
    /// `/slow` waits for a permit here.
    gate: Arc<Semaphore>,
}

/// A running server and a client for it.
pub struct App {
    pub addr: SocketAddr,
    pub clock: ManualClock,
    pub store: Arc<dyn Store>,
    pub counters: Arc<Counters>,
    pub gate: Arc<Semaphore>,
    pub in_flight: idem_tower::InFlight,
    client: Client<HttpConnector, Full<Bytes>>,
    server: tokio::task::JoinHandle<()>,
    _store: TestStore,
}

impl Drop for App {
    fn drop(&mut self) {
        self.server.abort();
    }
}

pub type Layer = IdempotencyLayer<Arc<dyn Store>>;

impl App {
    /// Starts the test API on a free 127.0.0.1 port with the default layer.
    pub async fn start(kind: StoreKind) -> App {
        App::start_with(kind, |layer| layer).await
    }

    /// Starts the test API with a layer adjusted by `configure`.
    pub async fn start_with(kind: StoreKind, configure: impl FnOnce(Layer) -> Layer) -> App {
        let clock = ManualClock::starting_now();
        let test_store = make_store(kind, &clock).await;
        let layer = configure(IdempotencyLayer::new(test_store.store.clone()));
        App::serve(clock, test_store, layer).await
    }

    /// Starts the test API with the layer around the whole router (as
    /// `layer.layer(router)`, not `Router::layer`), so that a `GET` it makes is routed
    /// by its path: what [`IdempotencyLayer::render_references`] needs.
    pub async fn start_around_router(
        kind: StoreKind,
        configure: impl FnOnce(Layer) -> Layer,
    ) -> App {
        let clock = ManualClock::starting_now();
        let test_store = make_store(kind, &clock).await;
        let layer = configure(IdempotencyLayer::new(test_store.store.clone()));
        App::serve_as(clock, test_store, layer, true).await
    }

    /// Starts the test API with a layer over a store of the test's own, which reads
    /// time from `clock`.
    pub async fn start_on(
        clock: ManualClock,
        store: Arc<dyn Store>,
        configure: impl FnOnce(Layer) -> Layer,
    ) -> App {
        let test_store = TestStore {
            store: store.clone(),
            _dir: None,
        };
        let layer = configure(IdempotencyLayer::new(store));
        App::serve(clock, test_store, layer).await
    }

    async fn serve(clock: ManualClock, test_store: TestStore, layer: Layer) -> App {
        App::serve_as(clock, test_store, layer, false).await
    }

    async fn serve_as(
        clock: ManualClock,
        test_store: TestStore,
        layer: Layer,
        around_router: bool,
    ) -> App {
        let counters = Arc::new(Counters::default());
        let gate = Arc::new(Semaphore::new(0));
        let handlers = Arc::new(Handlers {
            counters: counters.clone(),
            gate: gate.clone(),
        });
        let in_flight = layer.in_flight();
        let probe_counters = counters.clone();
        let routes = Router::new()
            .route("/orders", post(create_order).get(read_orders))
            .route("/orders/{id}/capture", post(capture_order))
            .route("/status", post(answer_status))
            .route("/slow", post(slow))
            .route("/panic", post(panic_handler))
            .route("/reports", post(create_report).get(read_report))
            .with_state(handlers);
        let routes = if around_router {
            Router::new().fallback_service(tower::Layer::layer(&layer, routes))
        } else {
            routes.layer(layer)
        };
        let router = routes.layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let counters = probe_counters.clone();
                async move {
                    let mut probe = CancelProbe {
                        counters,
                        finished: false,
                    };
                    let response = next.run(req).await;
                    probe.finished = true;
                    response
                }
            },
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        App {
            addr,
            clock,
            store: test_store.store.clone(),
            counters,
            gate,
            in_flight,
            client,
            server,
            _store: test_store,
        }
    }

    pub fn post(&self, path: &str) -> Call<'_> {
        self.call(http::Method::POST, path)
    }

    pub fn call(&self, method: http::Method, path: &str) -> Call<'_> {
        Call {
            app: self,
            builder: http::Request::builder()
                .method(method)
                .uri(format!("http://{}{path}", self.addr)),
            body: Bytes::new(),
        }
    }

    /// Whether the store holds a record for an anonymous `POST` to `template` with
    /// `key`; a request that reserved nothing, or released its key, leaves none.
    pub async fn has_record(&self, template: &str, key: &str) -> bool {
        self.store
            .get(&scope(Tenant::anonymous(), template, key))
            .await
            .unwrap()
            .is_some()
    }

    /// Sends raw bytes on a new connection and returns everything the server wrote
    /// back before closing (the request should say `Connection: close`).
    pub async fn raw(&self, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(self.addr).await.expect("connect");
        stream.write_all(request).await.expect("write");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
            .await
            .expect("raw answer within 10 s")
            .expect("read");
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Opens the gate of `/slow` for `n` requests.
    pub fn open_gate(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

struct CancelProbe {
    counters: Arc<Counters>,
    finished: bool,
}

impl Drop for CancelProbe {
    fn drop(&mut self) {
        if !self.finished {
            self.counters.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// One request being built.
pub struct Call<'a> {
    app: &'a App,
    builder: http::request::Builder,
    body: Bytes,
}

impl Call<'_> {
    pub fn key(self, key: &str) -> Self {
        self.header("idempotency-key", key)
    }

    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let value = HeaderValue::from_bytes(value.as_ref()).expect("valid header value");
        self.builder = self.builder.header(name, value);
        self
    }

    pub fn json(mut self, body: &str) -> Self {
        self.builder = self
            .builder
            .header(header::CONTENT_TYPE, "application/json");
        self.body = Bytes::copy_from_slice(body.as_bytes());
        self
    }

    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    pub async fn send(self) -> Reply {
        let request = self.builder.body(Full::new(self.body)).expect("request");
        let response =
            tokio::time::timeout(Duration::from_secs(30), self.app.client.request(request))
                .await
                .expect("answer within 30 s")
                .expect("request succeeds");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        }
    }
}

/// A response as the client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header"))
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    pub fn is_replay(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Asserts an RFC 9457 problem of `status` whose type ends in `slug`.
    pub fn assert_problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(self.status, status, "status of {self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "content type of {self:?}"
        );
        let body = self.json();
        assert_eq!(body["type"], format!("https://idem.dev/problems/{slug}"));
        assert_eq!(body["status"], status);
        assert!(body["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
        body
    }
}

/// The fingerprint the layer computes for a JSON POST to `path`.
pub fn json_fingerprint(path: &str, body: &str) -> Fingerprint {
    Fingerprint::compute(
        "POST",
        &format!("POST {path}"),
        Some("application/json"),
        body.as_bytes(),
        &FingerprintOptions::default(),
    )
}

/// A reserve request as the layer makes it for a JSON POST to `path`.
pub fn reserve_request(path: &str, key: &str, body: &str, lease: Duration) -> ReserveRequest {
    ReserveRequest::new(
        scope(Tenant::anonymous(), path, key),
        json_fingerprint(path, body),
    )
    .lease(lease)
}

async fn create_order(State(h): State<Arc<Handlers>>, request: Request) -> Response {
    let n = h.counters.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let ctx = request.extensions().get::<IdempotencyContext>().cloned();
    let body = axum::body::to_bytes(request.into_body(), usize::MAX)
        .await
        .expect("body");
    let echo: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let answer = json!({
        "order": n,
        "request": echo,
        "attempt": ctx.as_ref().map(|c| c.attempt),
        "recovered": ctx.as_ref().map(|c| c.recovered),
        "charge_key": ctx.as_ref().map(|c| c.derive("charge").to_string()),
    });
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, format!("/orders/{n}")),
            (header::SET_COOKIE, "session=s3cret".to_owned()),
            (
                header::HeaderName::from_static("x-request-id"),
                format!("req-{n}"),
            ),
            (
                header::HeaderName::from_static("x-order-version"),
                format!("v{n}"),
            ),
        ],
        axum::Json(answer),
    )
        .into_response()
}

/// Creates report N: answers 201 with `size` bytes of CSV (the JSON body's `size`,
/// default 100), recorded as a reference to `GET /reports?id=N` unless the body says
/// `"by_value": true`.
async fn create_report(State(h): State<Arc<Handlers>>, body: Bytes) -> Response {
    let n = h.counters.reports.fetch_add(1, Ordering::SeqCst) + 1;
    let ask: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let size = ask["size"].as_u64().unwrap_or(100) as usize;
    let mut response = (
        StatusCode::CREATED,
        [
            (header::LOCATION, format!("/reports/{n}")),
            (header::CONTENT_TYPE, "text/csv".to_owned()),
        ],
        "r".repeat(size),
    )
        .into_response();
    if !ask["by_value"].as_bool().unwrap_or(false) {
        let reference = idem_tower::ResourceReference::new(&format!("/reports?id={n}")).unwrap();
        response.extensions_mut().insert(reference);
    }
    response
}

/// Renders report N as it is now: `report N, read R` (R counts renderings), or 404 for
/// `id=404` and any report not created.
async fn read_report(State(h): State<Arc<Handlers>>, request: Request) -> Response {
    let id: usize = request
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("id="))
        .and_then(|id| id.parse().ok())
        .unwrap_or(0);
    if id == 0 || id > h.counters.reports.load(Ordering::SeqCst) {
        return (StatusCode::NOT_FOUND, "no such report").into_response();
    }
    let r = h.counters.report_reads.fetch_add(1, Ordering::SeqCst) + 1;
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::ETAG, "\"v2\""),
        ],
        format!(r#"{{"report":{id},"read":{r}}}"#),
    )
        .into_response()
}

async fn read_orders(State(h): State<Arc<Handlers>>) -> String {
    let n = h.counters.reads.fetch_add(1, Ordering::SeqCst) + 1;
    format!("read {n}")
}

async fn capture_order(State(h): State<Arc<Handlers>>, Path(id): Path<u64>) -> Response {
    let n = h.counters.captures.fetch_add(1, Ordering::SeqCst) + 1;
    axum::Json(json!({ "captured": id, "capture": n })).into_response()
}

/// Answers the status the JSON body asks for, with the disposition it asks for, and
/// says in `x-context-releases` whether the request's context expects that status to
/// release the key.
async fn answer_status(
    State(h): State<Arc<Handlers>>,
    context: Option<axum::Extension<IdempotencyContext>>,
    body: Bytes,
) -> Response {
    let n = h.counters.statuses.fetch_add(1, Ordering::SeqCst) + 1;
    let ask: Value = serde_json::from_slice(&body).expect("JSON body");
    let status = StatusCode::from_u16(ask["status"].as_u64().expect("status") as u16).unwrap();
    let mut response = (
        status,
        format!("handler answered {} (call {n})", status.as_u16()),
    )
        .into_response();
    let disposition = match ask["disposition"].as_str() {
        Some("record") => Some(Disposition::Record),
        Some("release") => Some(Disposition::Release),
        Some("keep") => Some(Disposition::KeepInProgress),
        _ => None,
    };
    if let Some(d) = disposition {
        response.extensions_mut().insert(d);
    }
    if let Some(axum::Extension(ctx)) = context {
        let releases = if ctx.releases(status) {
            "true"
        } else {
            "false"
        };
        response
            .headers_mut()
            .insert("x-context-releases", HeaderValue::from_static(releases));
    }
    response
}

async fn slow(State(h): State<Arc<Handlers>>) -> Response {
    let n = h.counters.slow_started.fetch_add(1, Ordering::SeqCst) + 1;
    h.gate.acquire().await.expect("gate").forget();
    h.counters.slow_finished.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, format!("slow {n} done")).into_response()
}

async fn panic_handler(State(h): State<Arc<Handlers>>) -> Body {
    h.counters.panics.fetch_add(1, Ordering::SeqCst);
    panic!("the handler blew up after charging the card");
}
