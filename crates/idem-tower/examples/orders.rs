//! The smallest idempotent service: an axum route behind `IdempotencyLayer`, records in
//! a SQLite file. Run it with `cargo run -p idem-tower --example orders`, then send the
//! same `POST` twice with one key (the user guide's tower page shows the curl lines):
//! the handler runs once, and the second answer is its replay.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::{Json, Router, http::StatusCode, routing::post};
use idem_sqlite::SqliteStore;
use idem_tower::IdempotencyLayer;
use serde_json::{Value, json};

/// Orders created so far: the side effect the layer keeps from happening twice.
static ORDERS: AtomicU64 = AtomicU64::new(0);

async fn create_order() -> (StatusCode, Json<Value>) {
    let id = ORDERS.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, Json(json!({ "id": id })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Created if missing; records survive a restart.
    let store = SqliteStore::connect("sqlite://orders-example.db").await?;
    let app = Router::new()
        .route("/v1/orders", post(create_order))
        .layer(IdempotencyLayer::new(store).require_key(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
