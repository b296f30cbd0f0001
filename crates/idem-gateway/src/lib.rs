//! The idem gateway: a reverse proxy that gives any HTTP API Stripe-grade
//! `Idempotency-Key` handling, and the `idem` binary that runs it.
//!
//! The idempotency flow itself (SPEC S2–S10) is `idem_tower::IdempotencyLayer`; this
//! crate wraps it around a proxy to one upstream and adds what a deployable gateway
//! needs: listeners, path normalisation, routes, tenants, the admin listener, metrics,
//! traces, `idem keys`, `idem demo` and `idem check` (the `idem-check` crate's).
//!
//! The `idem` binary is [`main`] on a Tokio runtime. What a program that embeds the
//! gateway, or a test or bench of it, uses:
//!
//! - [`config`]: the settings as `idem serve` takes them ([`ServeArgs`](config::ServeArgs):
//!   flags, `IDEM_*` variables, the `--config` TOML file) and their resolved
//!   [`GatewayConfig`](config::GatewayConfig);
//! - [`serve`]: [`Gateway`](serve::Gateway), bound and run until a shutdown future
//!   resolves, and the idempotency layer it wraps around the proxy;
//! - [`store`]: the record store a URL names, opened as the gateway opens it;
//! - [`metrics`]: what the gateway counts, as `/metrics` serves it;
//! - [`telemetry`]: the trace the gateway gives each keyed request;
//! - [`demo`]: the naive payments API of `idem demo-upstream`, to try the gateway on.
//!
//! The rest (listeners, the proxy, routes, tenants, the admin listener, the commands
//! other than `serve`) is the crate's own.
//!
//! # Examples
//!
//! Run the gateway in-process in front of an upstream, with an in-memory store, until a
//! shutdown future resolves (the `idem serve` command does the same with the flags
//! resolved from the command line):
//!
//! ```no_run
//! use idem_gateway::config::{GatewayConfig, ServeArgs};
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

mod access;
mod admin;
mod budget;
mod cli;
mod command;
pub mod config;
mod cors;
mod document;
mod exit;
mod forwarded;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inspect;
mod jwks;
mod listener;
mod logging;
pub mod metrics;
// "Did you mean": one measure for misspelt config keys and store URL schemes.
mod nearest;
mod path;
mod proxy;
mod route;
pub mod serve;
pub mod store;
pub mod telemetry;
mod tenant_source;
mod tls_client;
mod tools;
mod trusted;

pub use command::main;
pub use tools::demo;
