//! What idem's own tests share, in one place: a fault proxy ([`Relay`]) to put
//! between a client and a server, the test services' URLs with the loud-skip rule
//! ([`services`]), a bounded wait ([`eventually`]), a store whose calls a test can
//! intercept ([`HookedStore`]), a SQL store's table of its own, dropped when the test
//! ends ([`TempTable`], [`on_temp_table`]), a process's CPU time ([`cpu_time`]) for
//! benches, and a
//! real Redis Cluster on 127.0.0.1 ([`RedisCluster`], [`redis_cluster_url`]), and
//! TLS-only PostgreSQL and Redis servers with certificates made at run time
//! ([`tls`]), and (feature `upstream`) a recording HTTP upstream (`upstream`).
//!
//! The store contract suite stays in `idem-core` (feature `testing`), beside the
//! `Store` trait it checks, so a store crate needs only that feature to run it. This
//! crate is never published; the crates whose tests need it take it as a
//! dev-dependency. `idem-core` itself does not: this crate depends on it, and
//! `idem-core`'s own unit tests would meet a second copy of its types here.
//!
//! ```no_run
//! # async fn demo() {
//! use idem_test_support::{Relay, RelayMode, services};
//!
//! let url = services::redis_url();
//! let relay = Relay::start(idem_test_support::service_addr(&url, 6379).await).await;
//! let through = idem_test_support::url_via(&url, relay.addr());
//! // ... point a store at `through`, then make the server vanish:
//! relay.set_mode(RelayMode::Refuse);
//! # let _ = through;
//! # }
//! ```

pub mod cluster;
mod cpu;
mod eventually;
pub mod jwt;
mod mariadb;
mod pg;
mod process;
mod relay;
pub mod services;
mod store;
mod table;
pub mod tls;
#[cfg(feature = "upstream")]
pub mod upstream;

pub use cluster::{REDIS_CLUSTER_ENV, RedisCluster, redis_cluster_url};
pub use cpu::cpu_time;
pub use eventually::{WAIT, eventually};
pub use mariadb::{MYSQL_TLS_DATABASE, MYSQL_TLS_PASSWORD, MYSQL_TLS_USER, MariaDbServer};
pub use pg::PgServer;
pub use relay::{Fault, Relay, RelayMode, service_addr, url_via};
pub use services::{service_unavailable, service_url, services_required};
pub use store::{HookedStore, StoreHooks, figure};
pub use table::{
    DROP_CONNECT_TIMEOUT, DropFuture, DropTable, TempStore, TempTable, agreed_secret,
    assert_pool_figures, on_temp_table,
};
pub use tls::{CERT_USER, CertFiles, RedisTlsServer, TestPki};

/// The public scope of `key` on `POST endpoint` for `tenant`, as a layer or a store
/// names a record: the one helper every test builds a scope with. It lives in
/// `idem-core` (feature `testing`) because the contract suite and `idem-core`'s own
/// tests use it too.
pub use idem_core::testing::scope_of as scope;
