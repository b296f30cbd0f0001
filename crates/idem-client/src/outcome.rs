//! The final answer to an operation, with what the retries did to get it.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use idem_core::Key;

/// The response header a server sets on an answer replayed from its record (SPEC S5).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The answer an operation ended with: status, headers and the whole body, plus the key
/// it was sent with, how many attempts it took and whether the server replayed it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub(crate) key: Key,
    pub(crate) attempts: u32,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Outcome {
    /// The `Idempotency-Key` every attempt carried.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// How many attempts this send made (1 when the first one was answered).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the server answered from its record of an earlier execution
    /// (`Idempotent-Replayed: true`) rather than executing now. A replay after a lost
    /// answer is the normal way a retried operation learns its result.
    pub fn replayed(&self) -> bool {
        self.headers
            .get(IDEMPOTENT_REPLAYED)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                let v = v.trim();
                // `true` is what Stripe-style servers send; `?1` is the Structured
                // Field boolean.
                v.eq_ignore_ascii_case("true") || v == "?1"
            })
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body as text, with invalid UTF-8 replaced.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.body)
    }
}
