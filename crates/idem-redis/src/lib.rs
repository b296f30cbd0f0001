//! A Redis [`Store`](idem_core::Store) for idem, shared by every instance that reaches
//! the same server (SPEC S10).
//!
//! [`RedisStore`] keeps one hash per record and does every operation as one Lua script
//! (or one command) touching only that record's key, so it is atomic on a single server
//! and safe on Redis Cluster. Reserve is the atomic insert-if-absent that decides who
//! executes (S5); complete, renew and release are fenced by the attempt's token (S7);
//! records expire through native TTLs (S8). Time is read from the injected clock and
//! passed to the scripts, so a `ManualClock` controls leases and expiry in tests.
//!
//! A server that cannot be reached makes every operation fail with
//! [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) within about
//! [`DEFAULT_TIMEOUT`]; the middleware answers 503 and never executes. Operations work
//! again once the server is back.
//!
//! # Examples
//!
//! ```no_run
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! use idem_core::*;
//! use idem_redis::RedisStore;
//!
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .key_prefix("payments:idem:")
//!     .connect()
//!     .await?;
//!
//! let scope = Scope::new(ScopeMode::Public, Tenant::from_credential(b"Bearer sk_1"),
//!     Endpoint::new("POST", "/v1/charges"), Key::new("8e03978e-40d5-43e8").unwrap());
//! let fp = Fingerprint::compute("POST", "POST /v1/charges", Some("application/json"),
//!     br#"{"amount":100}"#, &FingerprintOptions::default());
//! let request = ReserveRequest::new(scope, fp);
//!
//! match store.reserve(&request).await? {
//!     Reservation::Acquired(lease) => {
//!         // ... charge the card, then record the answer:
//!         store.complete(&lease, &StoredResponse::new(201, "charged")).await?;
//!     }
//!     Reservation::Replay(response) => println!("replay {}", response.status),
//!     Reservation::InProgress { retry_after } => println!("409, retry in {retry_after:?}"),
//!     Reservation::Mismatch => println!("422"),
//! }
//! # Ok(())
//! # }
//! ```

mod error;
mod record;
mod store;

pub use store::{
    DEFAULT_KEY_PREFIX, DEFAULT_TIMEOUT, DEFAULT_TTL_GRACE, RedisStore, RedisStoreBuilder,
};

/// The README's example, compiled as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
