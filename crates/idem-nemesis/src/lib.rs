//! A nemesis harness for the `idem` gateway, and a checker that judges what it
//! recorded, in the spirit of the published analyses of distributed databases.
//!
//! The harness ([`run()`]) makes hosts out of Linux network namespaces ([`net`]), one
//! per gateway, each behind a veth link; it starts a private store ([`stores`]), a
//! recording upstream ([`upstream`]), userspace links that carry faults ([`link`]),
//! and an `idem serve` in each host ([`gateway`]). Clients ([`client`]) send every key
//! several times over random gateways, hang up on some answers and retry, while a
//! nemesis ([`nemesis`]) partitions a gateway from its store (both ways, one way, by a
//! blackholed route), cuts it from everything (its veth down), slows its link, pauses
//! it past its lease, kills it, or fails the store over. Every request, answer and
//! execution is recorded with its time ([`history`]); the checker ([`checker`]) then
//! judges: no silent double execution, answers never change, nothing acknowledged is
//! lost, every key finishes once the faults heal.
//!
//! ```no_run
//! # async fn demo() {
//! use idem_nemesis::{Config, StoreKind, run};
//!
//! let config = Config::small("target/debug/idem".into(), StoreKind::Postgres, 1, "/tmp/logs".into());
//! for phase in run(&config).await.expect("namespaces here") {
//!     let phase = phase.expect("the nemesis struck");
//!     println!("{}", phase.report.row(config.store.name(), phase.nemesis.name()));
//! }
//! # }
//! ```

pub mod checker;
pub mod client;
pub mod gateway;
pub mod history;
pub mod link;
pub mod nemesis;
pub mod net;
pub mod rng;
pub mod run;
pub mod stores;
pub mod upstream;
pub mod world;

pub use checker::{Finding, Report, Violation, check};
pub use history::{Execution, History, Listed, Outcome, Recorder, Request};
pub use nemesis::Nemesis;
pub use run::{Config, Phase, run};
pub use stores::StoreKind;
pub use world::{Unavailable, World};
