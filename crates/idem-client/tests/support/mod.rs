//! A payments API behind the real layer for the client's tests, on 127.0.0.1 with
//! port 0. The scripted server that answers each request with the next fault of its
//! script is `idem_test_support::upstream::Upstream::scripted`; the proxy that breaks
//! chosen connections is `idem_test_support::Relay`.

#![allow(dead_code)] // Each test binary uses its own part of this module.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::watch;

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
