//! The recording upstream: answers every request `201` with a body unique to the
//! execution, after the delay its `x-nemesis-delay-ms` header asks, and records each
//! keyed request as an [`Execution`] when it arrives.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::history::{Execution, Recorder};

/// The upstream, serving on 127.0.0.1 until dropped.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Starts it, recording into `recorder`.
    pub async fn start(recorder: Recorder) -> std::io::Result<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seq = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (recorder, seq) = (recorder.clone(), seq.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        answer(req, recorder.clone(), seq.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Upstream { addr, task })
    }

    /// Its address on 127.0.0.1.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    recorder: Recorder,
    seq: Arc<AtomicU64>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let n = seq.fetch_add(1, Ordering::SeqCst) + 1;
    let key = header("idempotency-key");
    let attempt = header("idempotency-attempt").and_then(|a| a.parse().ok());
    let body =
        Bytes::from(serde_json::json!({ "n": n, "key": key, "attempt": attempt }).to_string());
    if let Some(key) = key {
        recorder.execution(Execution {
            key,
            attempt,
            started: recorder.now(),
            body: body.clone(),
        });
    }
    if let Some(ms) = header("x-nemesis-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = hyper::StatusCode::CREATED;
    res.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(res)
}
