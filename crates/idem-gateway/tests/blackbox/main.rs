//! Black-box tests: the real `idem` binary between a client and a counting upstream.
//! `chaos` kills it again and again under load; `crash` one kill at a time.
//!
//! Run with `cargo test -p idem-gateway --test blackbox`. The PostgreSQL and Redis cases
//! read `IDEM_TEST_POSTGRES_URL` and `IDEM_TEST_REDIS_URL` and skip loudly when the
//! service is unreachable (fail under `IDEM_REQUIRE_SERVICES=1`); the Redis Cluster
//! cases start one (or use `IDEM_TEST_REDIS_CLUSTER_URL`), and `failover` starts its
//! own to break.

mod access_log;
mod admin_access;
mod ambiguous;
mod chaos;
mod check;
mod cluster;
mod common;
mod crash;
mod demo;
mod edge;
mod failover;
mod grpc;
mod http2;
mod inspection;
mod jwks;
mod jwt;
mod key_lines;
mod key_sources;
mod late_reply;
mod log_pipes;
mod mcp;
mod mcp_check;
mod mcp_sdk;
mod migration;
mod mtls;
mod nginx;
mod packaging;
mod policies;
mod profiles;
mod protocol;
mod proxying;
mod publishing;
mod reload;
mod sealing;
mod shared;
mod smuggling;
mod spelling;
mod store_tls;
mod telemetry;
mod tenant_limits;
mod tenants;
mod tls;
mod tombstones;
mod unreadable_json;
mod upstreams;
mod wait;
mod wait_mysql;
mod walkthrough;
mod window;
