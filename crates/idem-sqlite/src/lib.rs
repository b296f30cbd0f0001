//! SQLite store for idem: the embedded default
//!
//! Work in progress.
