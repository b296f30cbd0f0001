//! The sending side of idempotency (SPEC S11): one `Idempotency-Key` per operation,
//! fixed before the first attempt and carried by every retry, so that a server that
//! records keys can answer a retry with the first attempt's result instead of
//! executing twice.
//!
//! * [`Client`] makes [`Operation`]s; each gets a random UUIDv4 key when it is made, or
//!   a key derived from a business value ([`KeyDeriver`], HMAC-SHA-256 under a secret).
//! * [`Operation::send`] retries with exponential backoff and full jitter
//!   ([`RetryPolicy`]), honours `Retry-After` on 409, 429 and 503, and stops at the
//!   maximum attempts, the deadline, or when the client's shared [`RetryBudget`] is
//!   spent. A 409 after the first attempt (another attempt holds the key) counts
//!   against neither the attempts nor the budget: it is waited out, within the
//!   deadline. 400 and 422 are never retried and come back as [`Error::InvalidKey`],
//!   [`Error::KeyReused`] or [`Error::Rejected`], and a 410 `key-expired` (the server's
//!   tombstone of a completed operation) as [`Error::KeyExpired`]. The [`Outcome`] says whether the
//!   answer was a replay, how many attempts it took, and the key.
//! * [`Journal`] (feature `journal`, on by default) persists an operation in SQLite
//!   before its first attempt; after a crash, [`Journal::pending`] gives the
//!   operations back with their keys to resume. [`Journal::persist_unique`] sends an
//!   operation at most once per [`BusinessId`] (a keyed hash of an order number, say),
//!   the guard for a provider that ignores `Idempotency-Key`.
//!
//! Time and randomness are injected ([`ClientBuilder::clock`],
//! [`ClientBuilder::sleeper`], [`ClientBuilder::seed`]) so tests assert the exact
//! waits instead of sleeping.
//!
//! # Features
//!
//! * `journal` (default): the SQLite [`Journal`] and the `idem-client-journal` tool.
//! * `rustls` (default): TLS for `https://` URLs, rustls on the ring provider,
//!   trusting the system's roots and those given to
//!   [`ClientBuilder::add_root_certificate_pem`]. Without it (`default-features =
//!   false`) an `https://` URL fails with [`Error::TlsDisabled`] before anything is
//!   sent.
//!
//! # Examples
//!
//! ```no_run
//! # async fn run() -> Result<(), idem_client::Error> {
//! use std::time::Duration;
//! use idem_client::{Client, Error, RetryPolicy};
//!
//! let client = Client::builder()
//!     .policy(RetryPolicy::default().max_attempts(4).deadline(Duration::from_secs(30)))
//!     .build()?;
//!
//! // The key is chosen here, once, for this charge.
//! let charge = client
//!     .post("http://127.0.0.1:8080/v1/charges")
//!     .json(&serde_json::json!({"amount": 1000, "currency": "eur"}));
//!
//! match charge.send().await {
//!     Ok(outcome) => println!(
//!         "{} after {} attempt(s){}",
//!         outcome.status(),
//!         outcome.attempts(),
//!         if outcome.replayed() { ", replayed" } else { "" }
//!     ),
//!     // Unknown outcome: the same operation, sent again later, carries the same key.
//!     Err(e @ Error::Exhausted { .. }) => eprintln!("{e}"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```

mod budget;
mod classify;
mod client;
mod error;
#[cfg(feature = "journal")]
mod journal;
mod key;
mod operation;
mod outcome;
mod policy;
mod sleep;
#[cfg(feature = "rustls")]
mod tls;

pub use budget::{BudgetStats, RetryBudget};
pub use classify::{Classify, DefaultClassifier, Retryable, http_date, retry_after};
pub use client::{Client, ClientBuilder};
pub use error::{Error, Failure, GiveUp, Result};
#[cfg(feature = "journal")]
pub use journal::{Entry, EntryState, Journal, JournaledOperation, Persisted};
#[cfg(feature = "journal")]
pub use key::BusinessId;
pub use key::{KeyDeriver, random_key};
pub use operation::{IDEMPOTENCY_KEY, Operation};
pub use outcome::{IDEMPOTENT_REPLAYED, Outcome};
pub use policy::RetryPolicy;
pub use sleep::{ManualSleeper, Sleep, TokioSleeper};

pub use idem_core::Key;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
