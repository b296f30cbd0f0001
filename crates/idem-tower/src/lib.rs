//! Idempotency-Key middleware for tower and axum
//!
//! Work in progress.
