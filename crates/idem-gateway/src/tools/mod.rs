//! The `idem` commands other than `serve`: `check-config`, `keys`, `migrate`, `demo`,
//! `demo-upstream`, `completions` and `man`.
//!
//! They are built on the server's modules (the store, the settings, the records as
//! operators see them in [`crate::inspect`]); no server module uses them, so that
//! changing a command never changes what the gateway serves.

pub mod check_config;
pub mod completions;
pub mod demo;
pub mod demo_run;
pub mod keys;
pub mod man;
pub mod migrate;
