//! The idem gateway: a reverse proxy that gives any HTTP API Stripe-grade
//! `Idempotency-Key` handling, and the `idem` binary that runs it.
//!
//! The idempotency flow itself (SPEC S2–S10) is `idem_tower::IdempotencyLayer`; this
//! crate wraps it around a [`Proxy`](proxy::Proxy) to one upstream and adds what a
//! deployable gateway needs:
//!
//! - [`cli`] and [`config`]: flags, `IDEM_*` variables and the `--config` TOML file with
//!   per-route rules ([`route`]);
//! - [`store`]: the store a `--store` URL names (memory, SQLite, PostgreSQL, Redis);
//! - [`proxy`]: forwarding, hop-by-hop stripping, `Forwarded` headers,
//!   `Idempotency-Attempt`, `Idempotency-Disposition`, and what went wrong, by the side
//!   it went wrong on ([`error`]); what each failure means for the key is the layer's;
//! - [`path`]: path normalisation before any rule sees a request (SPEC S14);
//! - [`cors`]: CORS headers on the gateway's own answers, for pages calling the API
//!   from another origin;
//! - [`admin`] and [`metrics`]: `/healthz`, `/readyz`, Prometheus `/metrics`, key
//!   inspection and purge;
//! - [`serve`]: the gateway's start, the sweeper and graceful shutdown; [`listener`]:
//!   accepting connections, their cap and the client timeout; [`keys`]: `idem keys`;
//!   [`demo`]: `idem demo-upstream`, a naive API to try the gateway on; [`demo_run`]:
//!   `idem demo`, that API straight and behind the gateway under faults, charges counted;
//! - [`completions`] and [`man`]: `idem completions SHELL` and `idem man`, the shell
//!   completions and manual pages an installation needs;
//! - `idem check URL`, probes of any API's `Idempotency-Key` support, is the
//!   `idem-check` crate's, run by the binary;
//! - [`trusted`]: `--trusted-proxies`, whose `X-Forwarded-For` names the client.
//!
//! # Examples
//!
//! Run the gateway in-process in front of an upstream, with an in-memory store, until a
//! shutdown future resolves (the `idem serve` command does the same with the flags
//! resolved from the command line):
//!
//! ```no_run
//! use idem_gateway::cli::ServeArgs;
//! use idem_gateway::config::GatewayConfig;
//! use idem_gateway::serve::{Gateway, Mode};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let args = ServeArgs {
//!     upstream: Some("http://127.0.0.1:3000".into()),
//!     listen: Some("127.0.0.1:8080".into()),
//!     store: Some("memory://".into()),
//!     ..ServeArgs::default()
//! };
//! let config = GatewayConfig::resolve(&args)?;
//! let gateway = Gateway::bind(&config, Mode::Idempotent).await?;
//! println!("listening on {}", gateway.local_addr());
//! gateway.run(idem_gateway::serve::shutdown_signal()).await;
//! # Ok(())
//! # }
//! ```

pub mod access;
pub mod admin;
pub(crate) mod budget;
pub mod cli;
pub mod completions;
pub mod config;
pub mod cors;
pub mod demo;
pub mod demo_run;
pub mod error;
pub mod exit;
pub mod forwarded;
mod inspect;
pub mod jwks;
pub mod keys;
pub mod listener;
pub mod listing;
pub mod logging;
pub mod man;
pub mod metrics;
pub mod migrate;
pub mod path;
pub mod proxy;
pub mod route;
pub mod serve;
pub mod store;
pub mod telemetry;
mod tenant_source;
mod tls_client;
pub mod trusted;
