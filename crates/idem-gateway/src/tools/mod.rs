//! The `idem` commands other than `serve`: `check-config`, `keys`, `migrate`, `demo`,
//! `demo-upstream`, `completions` and `man`.
//!
//! They are built on the server's modules (the store, the settings, the records as
//! operators see them in [`crate::inspect`]); no server module uses them, so that
//! changing a command never changes what the gateway serves.

pub(crate) mod check_config;
pub(crate) mod completions;
pub mod demo;
pub(crate) mod demo_run;
pub(crate) mod keys;
pub(crate) mod man;
pub(crate) mod migrate;
