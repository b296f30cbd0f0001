//! The services tests run against, and what to do when one cannot be reached.
//!
//! Tests needing PostgreSQL, Redis, NATS, RabbitMQ or MySQL read its URL from
//! `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_REDIS_URL`, `IDEM_TEST_NATS_URL`,
//! `IDEM_TEST_RABBITMQ_URL` or `IDEM_TEST_MYSQL_URL`, else use the local server. When the
//! server cannot be reached they skip with a loud notice, unless
//! `IDEM_REQUIRE_SERVICES=1` (set in CI), where unreachable is a failure: see
//! [`service_unavailable`].

/// The variable naming the PostgreSQL server's URL.
pub const POSTGRES_ENV: &str = "IDEM_TEST_POSTGRES_URL";
/// The PostgreSQL server used when [`POSTGRES_ENV`] is unset.
pub const POSTGRES_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The variable naming the Redis server's URL.
pub const REDIS_ENV: &str = "IDEM_TEST_REDIS_URL";
/// The Redis server used when [`REDIS_ENV`] is unset.
pub const REDIS_DEFAULT: &str = "redis://127.0.0.1:6379";
/// The variable naming the NATS server's URL.
pub const NATS_ENV: &str = "IDEM_TEST_NATS_URL";
/// The NATS server used when [`NATS_ENV`] is unset.
pub const NATS_DEFAULT: &str = "nats://127.0.0.1:4222";

/// The variable naming the MySQL or MariaDB server's URL.
pub const MYSQL_ENV: &str = "IDEM_TEST_MYSQL_URL";
/// The MySQL or MariaDB server used when [`MYSQL_ENV`] is unset.
pub const MYSQL_DEFAULT: &str = "mysql://root@127.0.0.1:3306/test";

/// The variable naming the RabbitMQ server's URL.
pub const RABBITMQ_ENV: &str = "IDEM_TEST_RABBITMQ_URL";
/// The RabbitMQ server used when [`RABBITMQ_ENV`] is unset.
pub const RABBITMQ_DEFAULT: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The PostgreSQL server's URL: [`POSTGRES_ENV`], else the local server.
pub fn postgres_url() -> String {
    service_url(POSTGRES_ENV, POSTGRES_DEFAULT)
}

/// The Redis server's URL: [`REDIS_ENV`], else the local server.
pub fn redis_url() -> String {
    service_url(REDIS_ENV, REDIS_DEFAULT)
}

/// The NATS server's URL: [`NATS_ENV`], else the local server.
pub fn nats_url() -> String {
    service_url(NATS_ENV, NATS_DEFAULT)
}

/// The MySQL or MariaDB server's URL: [`MYSQL_ENV`], else the local server.
pub fn mysql_url() -> String {
    service_url(MYSQL_ENV, MYSQL_DEFAULT)
}

/// The RabbitMQ server's URL: [`RABBITMQ_ENV`], else the local server.
pub fn rabbitmq_url() -> String {
    service_url(RABBITMQ_ENV, RABBITMQ_DEFAULT)
}

/// Whether CI demands that every service be reachable (`IDEM_REQUIRE_SERVICES=1`).
pub fn services_required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// The URL of a test service: the environment variable's value, else `default`.
pub fn service_url(env_var: &str, default: &str) -> String {
    std::env::var(env_var).unwrap_or_else(|_| default.to_owned())
}

/// Reports an unreachable service: panics under `IDEM_REQUIRE_SERVICES=1`, otherwise
/// prints a loud notice to stderr so the skip is seen. Returns `None` for a factory to
/// pass on.
pub fn service_unavailable<T>(
    service: &str,
    url: &str,
    error: &dyn std::fmt::Display,
) -> Option<T> {
    assert!(
        !services_required(),
        "{service} at {url} is unreachable and IDEM_REQUIRE_SERVICES=1: {error}"
    );
    eprintln!(
        "\n*** SKIPPED: {service} at {url} is unreachable ({error}); \
         set IDEM_REQUIRE_SERVICES=1 to make this a failure ***\n"
    );
    None
}
