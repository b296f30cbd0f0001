//! `orders-api`: a tiny orders API with Idempotency-Key handling and a business unique
//! constraint behind it. See README.md for curl commands.
//!
//! Environment: `ORDERS_API_ADDR` (default `127.0.0.1:3000`), `ORDERS_API_DB` (default
//! `orders-api.db` in the system's temporary directory), `ORDERS_API_KEY_TTL` (how long
//! a key's record lives, default `24h`), `ORDERS_API_LEASE` (how long a dead attempt's
//! key stays in progress, default `60s`). To watch the order number answer a retry after
//! the key expired, set the TTL to e.g. `10s`.
//! `ORDERS_API_CRASH_BEFORE_COMMIT=1` makes the process exit before it commits its
//! first new order (a demonstration of SPEC S9, never for service).

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Store, Sweeper, SweeperConfig};
use orders_api::{BoxError, DEFAULT_KEY_TTL, DEFAULT_LEASE, Settings};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = std::env::var("ORDERS_API_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let db = std::env::var("ORDERS_API_DB").unwrap_or_else(|_| {
        let path = std::env::temp_dir().join("orders-api.db");
        format!("sqlite://{}", path.display())
    });
    let key_ttl = duration_var("ORDERS_API_KEY_TTL", DEFAULT_KEY_TTL)?;
    let lease = duration_var("ORDERS_API_LEASE", DEFAULT_LEASE)?;

    let store = orders_api::open(&db, orders_api::system_clock()).await?;
    let sweeper = Sweeper::spawn(Arc::new(store.clone()), SweeperConfig::default());
    let settings = Settings {
        key_ttl,
        lease,
        // SPEC S9 made visible: see the README's "A crash before the commit".
        crash_before_commit: std::env::var_os("ORDERS_API_CRASH_BEFORE_COMMIT")
            .is_some_and(|v| v == "1"),
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

/// The duration in the environment variable `name` (`30s`, `24h`), else `default`.
fn duration_var(name: &str, default: Duration) -> Result<Duration, BoxError> {
    let Ok(value) = std::env::var(name) else {
        return Ok(default);
    };
    let duration = humantime::parse_duration(&value)
        .map_err(|e| format!("{name}={value:?}: {e} (write e.g. 30s or 24h)"))?;
    if duration.is_zero() {
        return Err(format!("{name} must be longer than zero").into());
    }
    Ok(duration)
}
