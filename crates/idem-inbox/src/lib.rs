//! Message de-duplication for at-least-once consumers, with a NATS JetStream adapter
//!
//! Work in progress.
