//! A tiny orders API with Idempotency-Key handling: axum, `idem-tower`, and SQLite for
//! the idempotency records.
//!
//! `POST` routes require a key. Creating an order "charges" a made-up payment provider
//! with a key derived from the client's, so an attempt that takes over from a crashed
//! one finds the charge it already made instead of charging twice. See README.md for
//! curl commands.
//!
//! Environment: `ORDERS_API_ADDR` (default `127.0.0.1:3000`), `ORDERS_API_DB` (default
//! `orders-api.db` in the system's temporary directory).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idem_core::{Store, Sweeper, SweeperConfig};
use idem_sqlite::SqliteStore;
use idem_tower::{IdempotencyContext, IdempotencyLayer, InFlight};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// What a client sends to create an order.
#[derive(Debug, Deserialize)]
struct NewOrder {
    sku: String,
    qty: u32,
    amount_cents: u64,
}

/// An order as stored and returned.
#[derive(Debug, Clone, Serialize)]
struct Order {
    id: u64,
    sku: String,
    qty: u32,
    amount_cents: u64,
    status: &'static str,
    /// The key the payment provider saw: derived from the client's key, so it is the
    /// same on every attempt of one operation.
    payment_key: String,
}

/// The business data. A real service keeps it in a database with a unique constraint
/// on `payment_key`, the business-level guard that outlives the idempotency record.
#[derive(Debug, Default)]
struct Orders {
    by_id: Mutex<BTreeMap<u64, Order>>,
}

/// Payments over this amount are declined: a 402 that is recorded and replayed.
const DECLINE_OVER_CENTS: u64 = 100_000;

/// The API with idempotency on every route; returns the in-flight handle for shutdown.
fn app(store: Arc<dyn Store>) -> (Router, InFlight) {
    let layer = IdempotencyLayer::new(store).require_key_if(|parts| parts.method == Method::POST);
    let in_flight = layer.in_flight();
    let router = Router::new()
        .route("/v1/orders", post(create_order))
        .route("/v1/orders/{id}", get(get_order))
        .route("/v1/orders/{id}/capture", post(capture_order))
        .with_state(Arc::new(Orders::default()))
        .layer(layer);
    (router, in_flight)
}

async fn create_order(
    State(orders): State<Arc<Orders>>,
    Extension(ctx): Extension<IdempotencyContext>,
    Json(new): Json<NewOrder>,
) -> Response {
    if new.qty == 0 {
        // 422 releases the key: the client may fix the body and retry with it.
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "qty must be at least 1");
    }
    let payment_key = ctx.derive("payment").to_string();
    let mut by_id = orders.by_id.lock().expect("orders lock");
    if ctx.recovered {
        // An earlier attempt died after it may have charged: look before acting again.
        if let Some(order) = by_id.values().find(|o| o.payment_key == payment_key) {
            return created(order.clone());
        }
    }
    if new.amount_cents > DECLINE_OVER_CENTS {
        // Recorded: the card stays declined on retry.
        return problem(StatusCode::PAYMENT_REQUIRED, "the card was declined");
    }
    let id = by_id.keys().next_back().map_or(1, |last| last + 1);
    let order = Order {
        id,
        sku: new.sku,
        qty: new.qty,
        amount_cents: new.amount_cents,
        status: "created",
        payment_key,
    };
    by_id.insert(id, order.clone());
    created(order)
}

async fn get_order(State(orders): State<Arc<Orders>>, Path(id): Path<u64>) -> Response {
    match orders.by_id.lock().expect("orders lock").get(&id) {
        Some(order) => Json(order.clone()).into_response(),
        None => problem(StatusCode::NOT_FOUND, "no such order"),
    }
}

async fn capture_order(State(orders): State<Arc<Orders>>, Path(id): Path<u64>) -> Response {
    match orders.by_id.lock().expect("orders lock").get_mut(&id) {
        Some(order) => {
            order.status = "captured";
            Json(order.clone()).into_response()
        }
        // 404 releases the key.
        None => problem(StatusCode::NOT_FOUND, "no such order"),
    }
}

fn created(order: Order) -> Response {
    let location = format!("/v1/orders/{}", order.id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(order),
    )
        .into_response()
}

fn problem(status: StatusCode, detail: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        json!({ "type": "about:blank", "title": status.canonical_reason(), "status": status.as_u16(), "detail": detail })
            .to_string(),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("ORDERS_API_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let db = std::env::var("ORDERS_API_DB").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join("orders-api.db");
        format!("sqlite://{}", path.display())
    });

    let store = Arc::new(SqliteStore::connect(&db).await?);
    let sweeper = Sweeper::spawn(store.clone(), SweeperConfig::default());
    let (router, in_flight) = app(store.clone());

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "orders-api listening on http://{} (records in {db})",
        listener.local_addr()?
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Connections are closed; let every started order finish and be recorded.
    in_flight.wait().await;
    sweeper.stop();
    // Writes what is queued and folds the WAL into the database file.
    store.close().await;
    println!("orders-api stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn order_request(key: Option<&str>, body: &str) -> Request<Body> {
        let mut builder = Request::post("/v1/orders").header("content-type", "application/json");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        builder.body(Body::from(body.to_owned())).unwrap()
    }

    async fn send(app: &Router, request: Request<Body>) -> (StatusCode, bool, serde_json::Value) {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, replayed, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn retried_order_is_created_once() {
        let (app, _) = app(Arc::new(idem_core::MemoryStore::new()));
        let body = r#"{"sku":"tea","qty":2,"amount_cents":1200}"#;
        let (status, replayed, first) = send(&app, order_request(Some("k1"), body)).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false));
        let (status, replayed, again) = send(&app, order_request(Some("k1"), body)).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true));
        assert_eq!(first, again);
        let (_, _, second) = send(&app, order_request(Some("k2"), body)).await;
        assert_eq!(second["id"], 2);
        assert_ne!(second["payment_key"], first["payment_key"]);
    }

    #[tokio::test]
    async fn missing_key_is_400_and_declined_card_stays_declined() {
        let (app, _) = app(Arc::new(idem_core::MemoryStore::new()));
        let body = r#"{"sku":"tea","qty":2,"amount_cents":1200}"#;
        let (status, _, problem) = send(&app, order_request(None, body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(problem["type"], "https://idem.dev/problems/missing-key");
        let big = r#"{"sku":"car","qty":1,"amount_cents":9999999}"#;
        let (status, _, _) = send(&app, order_request(Some("k3"), big)).await;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
        let (status, replayed, _) = send(&app, order_request(Some("k3"), big)).await;
        assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, true));
    }
}
