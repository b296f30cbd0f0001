//! Helpers shared by the integration tests: service connections and the inbox cases
//! every SQL backend runs.

#![allow(dead_code)]

pub mod cases;

use std::time::Duration;

use idem_core::testing::{service_unavailable, service_url};

pub const PG_ENV: &str = "IDEM_TEST_POSTGRES_URL";
pub const PG_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const NATS_ENV: &str = "IDEM_TEST_NATS_URL";
pub const NATS_DEFAULT: &str = "nats://127.0.0.1:4222";
pub const REDIS_ENV: &str = "IDEM_TEST_REDIS_URL";
pub const REDIS_DEFAULT: &str = "redis://127.0.0.1:6379";

pub fn pg_url() -> String {
    service_url(PG_ENV, PG_DEFAULT)
}

pub fn nats_url() -> String {
    service_url(NATS_ENV, NATS_DEFAULT)
}

/// A PostgreSQL pool, or `None` (skipped loudly) when the server is unreachable.
pub async fn pg_pool(max_connections: u32) -> Option<sqlx::PgPool> {
    let url = pg_url();
    let connect = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => service_unavailable("PostgreSQL", &url, &e),
        Err(e) => service_unavailable("PostgreSQL", &url, &e),
    }
}

/// A NATS client and its JetStream context, or `None` (skipped loudly).
pub async fn nats() -> Option<(async_nats::Client, async_nats::jetstream::Context)> {
    let url = nats_url();
    let connect = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(client)) => {
            let js = async_nats::jetstream::new(client.clone());
            Some((client, js))
        }
        Ok(Err(e)) => service_unavailable("NATS", &url, &e),
        Err(e) => service_unavailable("NATS", &url, &e),
    }
}

/// A Redis connection, or `None` (skipped loudly).
pub async fn redis_conn() -> Option<redis::aio::MultiplexedConnection> {
    let url = service_url(REDIS_ENV, REDIS_DEFAULT);
    let client = match redis::Client::open(url.as_str()) {
        Ok(c) => c,
        Err(e) => return service_unavailable("Redis", &url, &e),
    };
    let connect = client.get_multiplexed_async_connection();
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(e)) => service_unavailable("Redis", &url, &e),
        Err(e) => service_unavailable("Redis", &url, &e),
    }
}

/// Polls `check` every 50 ms until it holds or `within` passes; returns whether it held.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
