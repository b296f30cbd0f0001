//! A recording upstream (feature `upstream`): an HTTP server on 127.0.0.1 that keeps
//! every request it received and counts executions per `Idempotency-Key`, for the
//! tests of whatever stands in front of it (the gateway, the client).
//!
//! How it answers is its one option: [`Upstream::start`] answers as each request's
//! `x-test-*` headers ask; [`Upstream::scripted`] answers request n with the n-th
//! [`Reply`] of a script, then with a default one. What it records is the same either
//! way.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

/// The fixed, old `Date` every header-driven answer carries, so a test can tell
/// whether a header was stored or written afresh.
pub const OLD_DATE: &str = "Sat, 01 Jan 2000 00:00:00 GMT";

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method, as sent.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The headers, as received.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// When it arrived.
    pub at: Instant,
}

/// One request the upstream answered: its sequence number (`n` in a header-driven
/// answer) and the `Idempotency-Attempt` it carried (`"none"` without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The request's number, from 1, in arrival order.
    pub n: u64,
    /// Its `Idempotency-Attempt` header, or `"none"`.
    pub attempt: String,
}

/// One answer of a scripted upstream.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status, headers and body.
    Status(u16, Vec<(&'static str, String)>, String),
    /// Never answer (the caller's timeout must end the request).
    Hang,
}

impl Reply {
    /// `code`, no header, no body.
    pub fn status(code: u16) -> Reply {
        Reply::Status(code, Vec::new(), String::new())
    }

    /// `code` with one header.
    pub fn with_header(code: u16, name: &'static str, value: impl Into<String>) -> Reply {
        Reply::Status(code, vec![(name, value.into())], String::new())
    }

    /// An RFC 9457 problem as idem's server writes it.
    pub fn problem(code: u16, slug: &str, detail: &str) -> Reply {
        Reply::Status(
            code,
            vec![("content-type", "application/problem+json".into())],
            serde_json::json!({
                "type": format!("https://idem.dev/problems/{slug}"),
                "title": slug,
                "status": code,
                "detail": detail,
            })
            .to_string(),
        )
    }
}

/// How the upstream answers.
enum Answers {
    /// As the request's `x-test-*` headers ask.
    Headers,
    /// The script's next reply, then the default.
    Script {
        script: Mutex<VecDeque<Reply>>,
        default: Mutex<Reply>,
    },
}

struct UpstreamState {
    answers: Answers,
    seq: AtomicU64,
    started: Mutex<HashMap<String, u64>>,
    finished: Mutex<HashMap<String, u64>>,
    executions: Mutex<HashMap<String, Vec<Execution>>>,
    seen: Mutex<Vec<Seen>>,
}

impl UpstreamState {
    fn new(answers: Answers) -> Arc<UpstreamState> {
        Arc::new(UpstreamState {
            answers,
            seq: AtomicU64::new(0),
            started: Mutex::default(),
            finished: Mutex::default(),
            executions: Mutex::default(),
            seen: Mutex::default(),
        })
    }
}

/// A recording upstream on 127.0.0.1, stopped on drop. Executions are counted per
/// `Idempotency-Key` header value, as sent.
///
/// Started with [`Upstream::start`], it answers as the request's headers ask:
///
/// - `x-test-status: N` answers with status N (default 201);
/// - `x-test-delay-ms: N` waits N ms before answering (the execution has started);
/// - `x-test-disposition: V` adds `Idempotency-Disposition: V`;
/// - `x-test-resource: P` adds `Idempotency-Resource: P`;
/// - `x-test-body-bytes: N` answers with N bytes of `x` instead of JSON;
/// - `origin: O` is answered with CORS headers allowing O, unless `x-test-no-cors` is
///   sent too;
/// - `x-test-content-encoding: V` says the body is encoded with V (it is not: the bytes
///   stand for an encoded body, which a proxy must pass on as they are).
///
/// Every such answer carries `Location`, `Set-Cookie`, `X-Request-Id`, `X-Order-Id`
/// and [`OLD_DATE`], so tests can check which headers are stored.
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// An upstream answering as each request's `x-test-*` headers ask.
    pub async fn start() -> Upstream {
        Upstream::start_on(|listener, app| async move {
            axum::serve(listener, app).await.unwrap();
        })
        .await
    }

    /// The header-driven upstream served by `serve` on a listener bound to
    /// 127.0.0.1: another transport than axum's HTTP/1.1 (HTTP/2 only, TLS).
    pub async fn start_on<F, Fut>(serve: F) -> Upstream
    where
        F: FnOnce(tokio::net::TcpListener, Router) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Upstream::launch(UpstreamState::new(Answers::Headers), serve).await
    }

    /// An upstream answering request n with the n-th reply of `script`, then with
    /// 200 `ok` (see [`Upstream::set_default`]).
    pub async fn scripted(script: impl IntoIterator<Item = Reply>) -> Upstream {
        let answers = Answers::Script {
            script: Mutex::new(script.into_iter().collect()),
            default: Mutex::new(Reply::Status(200, Vec::new(), "ok".into())),
        };
        Upstream::launch(UpstreamState::new(answers), |listener, app| async move {
            axum::serve(listener, app).await.unwrap();
        })
        .await
    }

    async fn launch<F, Fut>(state: Arc<UpstreamState>, serve: F) -> Upstream
    where
        F: FnOnce(tokio::net::TcpListener, Router) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(serve(listener, app));
        Upstream { addr, state, task }
    }

    /// Answers every request after the script with `reply` (scripted upstreams only).
    pub fn set_default(&self, reply: Reply) {
        match &self.state.answers {
            Answers::Script { default, .. } => *default.lock().unwrap() = reply,
            Answers::Headers => panic!("set_default on an upstream that answers by headers"),
        }
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR` followed by `path`.
    pub fn url_for(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Executions started for a key header value.
    pub fn started(&self, key: &str) -> u64 {
        *self.state.started.lock().unwrap().get(key).unwrap_or(&0)
    }

    /// Executions that finished (answered) for a key header value.
    pub fn finished(&self, key: &str) -> u64 {
        *self.state.finished.lock().unwrap().get(key).unwrap_or(&0)
    }

    /// The executions that finished for a key header value, in the order they did.
    pub fn executions(&self, key: &str) -> Vec<Execution> {
        self.state
            .executions
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Every request seen, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Requests seen in total.
    pub fn total(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    /// The `Idempotency-Key` of every request seen, in arrival order.
    pub fn keys(&self) -> Vec<Option<String>> {
        self.state
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| key_of(&s.headers))
            .collect()
    }

    /// Waits (bounded) until `finished(key)` reaches `n`.
    pub async fn wait_finished(&self, key: &str, n: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if self.finished(key) >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.finished(key) >= n
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("idempotency-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

fn header_u64(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.to_str().ok()?.parse().ok()
}

async fn handle(State(state): State<Arc<UpstreamState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let key = key_of(&parts.headers);
    if let Some(k) = &key {
        *state.started.lock().unwrap().entry(k.clone()).or_default() += 1;
    }
    state.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        headers: parts.headers.clone(),
        body: body.clone(),
        at: Instant::now(),
    });
    let n = state.seq.fetch_add(1, Ordering::SeqCst) + 1;
    let attempt = parts
        .headers
        .get("idempotency-attempt")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned();
    let res = match &state.answers {
        Answers::Headers => by_headers(&parts, n, &attempt, body.len()).await,
        Answers::Script { script, default } => {
            let reply = script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| default.lock().unwrap().clone());
            match reply {
                Reply::Status(code, headers, body) => {
                    let mut b = Response::builder().status(code);
                    for (name, value) in headers {
                        b = b.header(name, value);
                    }
                    b.body(Body::from(body)).unwrap()
                }
                Reply::Hang => std::future::pending().await,
            }
        }
    };
    if let Some(k) = key {
        *state.finished.lock().unwrap().entry(k.clone()).or_default() += 1;
        state
            .executions
            .lock()
            .unwrap()
            .entry(k)
            .or_default()
            .push(Execution { n, attempt });
    }
    res
}

/// The answer the request's `x-test-*` headers ask for (see [`Upstream`]).
async fn by_headers(
    parts: &axum::http::request::Parts,
    n: u64,
    attempt: &str,
    body_len: usize,
) -> Response {
    if let Some(ms) = header_u64(&parts.headers, "x-test-delay-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let status = header_u64(&parts.headers, "x-test-status")
        .and_then(|s| StatusCode::from_u16(s as u16).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut res = match header_u64(&parts.headers, "x-test-body-bytes") {
        Some(len) => (status, vec![b'x'; len as usize]).into_response(),
        None => (
            status,
            [("content-type", "application/json")],
            serde_json::json!({
                "n": n,
                "method": parts.method.as_str(),
                "path": parts.uri.path(),
                "attempt": attempt,
                "body_len": body_len,
            })
            .to_string(),
        )
            .into_response(),
    };
    let h = res.headers_mut();
    h.insert(
        "location",
        HeaderValue::from_str(&format!("/v1/things/{n}")).unwrap(),
    );
    h.insert(
        "set-cookie",
        HeaderValue::from_static("session=abc; HttpOnly"),
    );
    h.insert(
        "x-request-id",
        HeaderValue::from_str(&format!("req-{n}")).unwrap(),
    );
    h.insert(
        "x-order-id",
        HeaderValue::from_str(&format!("ord-{n}")).unwrap(),
    );
    h.insert("date", HeaderValue::from_static(OLD_DATE));
    if let Some(e) = parts.headers.get("x-test-content-encoding") {
        h.insert(axum::http::header::CONTENT_ENCODING, e.clone());
    }
    // As an API that browsers call across origins answers.
    if let Some(origin) = parts
        .headers
        .get("origin")
        .filter(|_| !parts.headers.contains_key("x-test-no-cors"))
    {
        h.insert("access-control-allow-origin", origin.clone());
        h.insert(
            "access-control-allow-credentials",
            HeaderValue::from_static("true"),
        );
        h.insert(
            "access-control-expose-headers",
            HeaderValue::from_static("location, idempotent-replayed"),
        );
    }
    if let Some(r) = parts.headers.get("x-test-resource") {
        h.insert(HeaderName::from_static("idempotency-resource"), r.clone());
    }
    if let Some(d) = parts.headers.get("x-test-disposition") {
        h.insert(
            HeaderName::from_static("idempotency-disposition"),
            d.clone(),
        );
    }
    res
}
