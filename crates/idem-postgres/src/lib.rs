//! PostgreSQL store for idem, shared by many instances
//!
//! Work in progress.
