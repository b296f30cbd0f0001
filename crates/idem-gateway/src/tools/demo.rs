//! `idem demo-upstream`: a deliberately naive payments API with no idempotency of its
//! own, for trying the gateway out (the README's walk-through runs it on port 3000).
//!
//! `POST /v1/charges` creates a charge every time it is called (that is the point: put
//! the gateway in front and retries stop creating charges) and answers 201 with the
//! charge, a `Location` and a `Set-Cookie`. `?delay_ms=N` makes it think for N ms first,
//! long enough to send a duplicate and see a 409; a charge once begun is made even when
//! the client hangs up meanwhile, as a payment processor's would be. A `metadata` value in
//! the request is kept on the charge (`idem demo` tags each operation with it).
//! `GET /v1/charges` lists the charges.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Default)]
struct Charges(Mutex<Vec<Value>>);

#[derive(Deserialize)]
struct Delay {
    delay_ms: Option<u64>,
}

/// The demo API's router.
pub fn router() -> Router {
    Router::new()
        .route("/v1/charges", post(create).get(list))
        .with_state(Arc::new(Charges::default()))
}

async fn create(
    State(charges): State<Arc<Charges>>,
    Query(delay): Query<Delay>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let attempt = headers
        .get("idempotency-attempt")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // The server drops this handler when the client hangs up; the charge, once begun,
    // runs in a task of its own so that it is made all the same.
    let charging = tokio::spawn(async move {
        if let Some(ms) = delay.delay_ms {
            tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
        }
        let mut all = charges.0.lock().expect("demo lock");
        let mut charge = json!({
            "id": format!("ch_{}", all.len() + 1),
            "amount": request.get("amount"),
            "currency": request.get("currency"),
            "attempt": attempt,
        });
        if let Some(metadata) = request.get("metadata") {
            charge["metadata"] = metadata.clone();
        }
        all.push(charge.clone());
        charge
    });
    let Ok(charge) = charging.await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let location = format!("/v1/charges/{}", charge["id"].as_str().unwrap_or_default());
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, location),
            (header::SET_COOKIE, "demo_session=1; HttpOnly".to_owned()),
        ],
        axum::Json(charge),
    )
        .into_response()
}

async fn list(State(charges): State<Arc<Charges>>) -> Response {
    let all = charges.0.lock().expect("demo lock").clone();
    axum::Json(json!({ "count": all.len(), "charges": all })).into_response()
}

/// Serves the demo API on `addr` until SIGINT/SIGTERM.
pub(crate) async fn run(addr: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "demo upstream (no idempotency of its own) on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, router())
        .with_graceful_shutdown(crate::serve::shutdown_signal())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_post_creates_a_charge() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router()).await });
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<Bytes>>();
        for _ in 0..2 {
            let req = http::Request::post(format!("http://{addr}/v1/charges"))
                .header("content-type", "application/json")
                .header("idempotency-key", "same")
                .body(http_body_util::Full::new(Bytes::from_static(
                    b"{\"amount\":5}",
                )))
                .unwrap();
            assert_eq!(client.request(req).await.unwrap().status(), 201);
        }
        let res = client
            .request(
                http::Request::get(format!("http://{addr}/v1/charges"))
                    .body(http_body_util::Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap();
        use http_body_util::BodyExt;
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["count"], 2, "naive on purpose: the key is ignored");
    }

    async fn start() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router()).await });
        addr
    }

    async fn list(addr: std::net::SocketAddr) -> Value {
        use http_body_util::BodyExt;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<Bytes>>();
        let res = client
            .request(
                http::Request::get(format!("http://{addr}/v1/charges"))
                    .body(http_body_util::Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    #[tokio::test]
    async fn a_charge_keeps_the_metadata_it_was_sent_with() {
        let addr = start().await;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<Bytes>>();
        for body in [
            r#"{"amount":5,"metadata":{"operation":7}}"#,
            r#"{"amount":6}"#,
        ] {
            let req = http::Request::post(format!("http://{addr}/v1/charges"))
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(Bytes::from(body)))
                .unwrap();
            assert_eq!(client.request(req).await.unwrap().status(), 201);
        }
        let v = list(addr).await;
        assert_eq!(v["charges"][0]["metadata"], json!({"operation": 7}));
        // Without metadata, none is shown: the charge looks as it always did.
        assert!(v["charges"][1].get("metadata").is_none(), "{v}");
    }

    #[tokio::test]
    async fn a_slow_charge_is_made_when_the_client_hangs_up() {
        let addr = start().await;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Full<Bytes>>();
        // The charge takes far longer than the client waits, however late a loaded
        // machine runs the client's timer.
        let req = http::Request::post(format!("http://{addr}/v1/charges?delay_ms=2000"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from_static(
                b"{\"amount\":5}",
            )))
            .unwrap();
        // The client gives up long before the answer, and drops its connection.
        let gave_up = tokio::time::timeout(Duration::from_millis(30), client.request(req)).await;
        assert!(gave_up.is_err(), "answered before the delay");
        drop(client);
        // As a payment processor would, the API goes on with a charge it has begun.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if list(addr).await["count"] == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the charge was dropped with the connection"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
