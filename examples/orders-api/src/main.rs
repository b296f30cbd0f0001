//! `orders-api`: a tiny orders API with Idempotency-Key handling and a business unique
//! constraint behind it. See README.md for curl commands.
//!
//! Environment: `ORDERS_API_ADDR` (default `127.0.0.1:3000`), `ORDERS_API_DB` (default
//! `orders-api.db` in the system's temporary directory), `ORDERS_API_KEY_TTL` (how long
//! a key's record lives, default `24h`; e.g. `30s` to watch the order number answer a
//! retry after expiry).

use std::sync::Arc;

use idem_core::{Store, Sweeper, SweeperConfig};
use orders_api::{BoxError, DEFAULT_KEY_TTL, Settings};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = std::env::var("ORDERS_API_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let db = std::env::var("ORDERS_API_DB").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join("orders-api.db");
        format!("sqlite://{}", path.display())
    });
    let key_ttl = match std::env::var("ORDERS_API_KEY_TTL") {
        Ok(ttl) => humantime::parse_duration(&ttl)
            .map_err(|e| format!("ORDERS_API_KEY_TTL={ttl:?}: {e} (write e.g. 30s or 24h)"))?,
        Err(_) => DEFAULT_KEY_TTL,
    };
    if key_ttl.is_zero() {
        return Err("ORDERS_API_KEY_TTL must be longer than zero".into());
    }

    let store = orders_api::open(&db, orders_api::system_clock()).await?;
    let sweeper = Sweeper::spawn(Arc::new(store.clone()), SweeperConfig::default());
    let settings = Settings {
        key_ttl,
        ..Settings::default()
    };
    let (router, in_flight) = orders_api::app(store.clone(), settings);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "orders-api listening on http://{} (orders and keys in {db}, keys live {})",
        listener.local_addr()?,
        humantime::format_duration(key_ttl)
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
