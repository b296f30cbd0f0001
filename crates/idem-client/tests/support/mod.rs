//! Servers for the client's tests, all on 127.0.0.1 with port 0: a scripted HTTP
//! server that answers each request with the next fault of its script, and a payments
//! API behind the real layer. The proxy that breaks chosen connections is
//! `idem_test_support::Relay`.

#![allow(dead_code)] // Each test binary uses its own part of this module.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status, headers and body.
    Status(u16, Vec<(&'static str, String)>, String),
    /// Never answer (the client's attempt timeout must end it).
    Hang,
}

impl Reply {
    pub fn status(code: u16) -> Reply {
        Reply::Status(code, Vec::new(), String::new())
    }

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

/// A server that answers request n with the n-th reply of its script, then with the
/// default reply.
pub struct FaultServer {
    pub addr: SocketAddr,
    state: Arc<ServerState>,
    _task: AbortOnDrop,
}

struct ServerState {
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Reply>,
    hits: AtomicUsize,
    keys: Mutex<Vec<Option<String>>>,
}

impl FaultServer {
    pub async fn start(script: impl IntoIterator<Item = Reply>) -> FaultServer {
        let state = Arc::new(ServerState {
            script: Mutex::new(script.into_iter().collect()),
            default: Mutex::new(Reply::Status(200, Vec::new(), "ok".into())),
            hits: AtomicUsize::new(0),
            keys: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FaultServer {
            addr,
            state,
            _task: AbortOnDrop(task),
        }
    }

    /// Answers every request after the script with `reply`.
    pub fn set_default(&self, reply: Reply) {
        *self.state.default.lock().unwrap() = reply;
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests received.
    pub fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    /// The `Idempotency-Key` of every request received, in order.
    pub fn keys(&self) -> Vec<Option<String>> {
        self.state.keys.lock().unwrap().clone()
    }
}

async fn answer(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    let key = request
        .headers()
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned());
    state.keys.lock().unwrap().push(key);
    state.hits.fetch_add(1, Ordering::SeqCst);
    let reply = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| state.default.lock().unwrap().clone());
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

/// Aborts a task when dropped, so servers stop with their test.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A payments-like API behind the real `IdempotencyLayer` over a `MemoryStore`:
/// `POST /v1/charges` counts its executions and answers 201 with the execution's
/// number. Gated, each execution waits for a permit before answering.
pub struct ChargeApp {
    pub addr: SocketAddr,
    runs: Arc<AtomicUsize>,
    started: watch::Receiver<usize>,
    gate: Arc<tokio::sync::Semaphore>,
    _task: AbortOnDrop,
}

#[derive(Clone)]
struct ChargeState {
    runs: Arc<AtomicUsize>,
    started: Arc<watch::Sender<usize>>,
    gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl ChargeApp {
    /// An app whose store reads `store_clock` and whose leases last `lease`.
    pub async fn start(
        gated: bool,
        store_clock: idem_core::SharedClock,
        lease: Duration,
    ) -> ChargeApp {
        let runs = Arc::new(AtomicUsize::new(0));
        let (started_tx, started) = watch::channel(0usize);
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let state = ChargeState {
            runs: runs.clone(),
            started: Arc::new(started_tx),
            gate: gated.then(|| gate.clone()),
        };
        let store = idem_core::MemoryStore::with_clock(store_clock);
        let app = axum::Router::new()
            .route("/v1/charges", axum::routing::post(charge))
            .with_state(state)
            .layer(idem_tower::IdempotencyLayer::new(store).lease(lease));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        ChargeApp {
            addr,
            runs,
            started,
            gate,
            _task: AbortOnDrop(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/v1/charges", self.addr)
    }

    /// How many times the handler has run.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Waits until the handler has started `n` executions.
    pub async fn wait_started(&self, n: usize) {
        let mut rx = self.started.clone();
        tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|c| *c >= n))
            .await
            .expect("the handler never started")
            .unwrap();
    }

    /// Lets one gated execution finish.
    pub fn open_gate(&self) {
        self.gate.add_permits(1);
    }

    pub fn gate(&self) -> Arc<tokio::sync::Semaphore> {
        self.gate.clone()
    }
}

async fn charge(State(state): State<ChargeState>, body: axum::body::Bytes) -> Response {
    let n = state.runs.fetch_add(1, Ordering::SeqCst) + 1;
    state.started.send_modify(|c| *c += 1);
    if let Some(gate) = &state.gate {
        gate.acquire().await.unwrap().forget();
    }
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    Response::builder()
        .status(201)
        .header("content-type", "application/json")
        .body(Body::from(
            serde_json::json!({"execution": n, "amount": request["amount"]}).to_string(),
        ))
        .unwrap()
}
