//! A retrying HTTP client that keeps one Idempotency-Key per operation
//!
//! Work in progress.
