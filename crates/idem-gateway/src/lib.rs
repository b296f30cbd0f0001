//! The idem gateway: a reverse proxy that gives any HTTP API Stripe-grade
//! `Idempotency-Key` handling, and the `idem` binary that runs it.
//!
//! The idempotency flow itself (SPEC S2–S10) is `idem_tower::IdempotencyLayer`; this
//! crate wraps it around a proxy to one upstream and adds what a deployable gateway
//! needs: listeners, path normalisation, routes, tenants, the admin listener, metrics,
//! traces, `idem keys`, `idem demo` and `idem check` (the `idem-check` crate's).
//!
//! What a program that embeds the gateway uses:
//!
//! - [`cli::ServeArgs`] and [`config`]: the settings as `idem serve` takes them (flags,
//!   `IDEM_*` variables, the `--config` TOML file) and their resolved
//!   [`GatewayConfig`](config::GatewayConfig);
//! - [`serve`]: [`Gateway`](serve::Gateway), bound and run until a shutdown future
//!   resolves;
//! - [`metrics`]: what the gateway counts, as `/metrics` serves it.
//!
//! The other modules are the `idem` binary's and its tests'; they are hidden from these
//! docs and may change in any release.
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

#[doc(hidden)]
pub mod access;
#[doc(hidden)]
pub mod admin;
pub(crate) mod budget;
pub mod cli;
mod command;
pub mod config;
#[doc(hidden)]
pub mod cors;
#[doc(hidden)]
pub use tools::demo;
#[doc(hidden)]
pub mod exit;
#[doc(hidden)]
pub mod forwarded;
mod inspect;
#[doc(hidden)]
pub mod jwks;
#[doc(hidden)]
pub mod listener;
#[doc(hidden)]
pub mod logging;
pub mod metrics;
// "Did you mean": one measure for misspelt config keys and store URL schemes.
mod nearest;
#[doc(hidden)]
pub mod path;
#[doc(hidden)]
pub mod proxy;
#[doc(hidden)]
pub mod route;
pub mod serve;
#[doc(hidden)]
pub mod store;
#[doc(hidden)]
pub mod telemetry;
mod tenant_source;
mod tls_client;
#[doc(hidden)]
pub mod tools;
#[doc(hidden)]
pub mod trusted;

pub use command::main;
