//! PostgreSQL store for idem: [`PgStore`], the shared store for several instances on
//! several machines (SPEC S10).
//!
//! - **Reserve in one round trip.** One statement inserts the record if absent, takes
//!   over an expired record or a lapsed lease atomically, or else hands back the
//!   existing row, which [`idem_core::Reservation::from_existing`] interprets. The
//!   primary key on the scope decides who is first (SPEC S5 stage 1).
//! - **Shared commits.** Reserves, completions and releases that queue while others
//!   are being written go to the server together, one statement (one round trip, one
//!   synced commit) per kind of operation for the whole batch, with exactly the
//!   single-row semantics; a lone operation is written at once
//!   ([`PgStoreBuilder::batching`], [`PgStore::batch_stats`]).
//! - **Fenced writes.** `complete`, `renew` and `release` are single statements that
//!   match the attempt's fencing token (SPEC S7).
//! - **Same-transaction completion.** [`PgStore::complete_in`] completes the record on
//!   the caller's connection, inside the transaction that holds the business writes
//!   (SPEC S9).
//! - **Bounded purge.** `purge_expired` deletes at most a batch of expired rows through
//!   the `expires_at` index, skipping rows others hold; [`PgStore::spawn_sweeper`] runs
//!   it in the background (SPEC S8).
//! - **Embedded migration.** The table and its indexes are created on connect; see
//!   [`schema`] for the index design. Migration 4 adds tombstones (SPEC S16): a
//!   `tombstone_until` column and a `tombstone` state, into which the purge compacts an
//!   expired record that keeps one (no headers, no body), alive until then.
//! - **Waiting duplicates hear of completions.** Triggers on the table (migration 3)
//!   `NOTIFY` [`schema::NOTIFY_CHANNEL`] when an in-progress record is completed or
//!   released, whatever path wrote it; each store keeps one `LISTEN` connection of its
//!   own, outside its pool, that fires its [`Store::watch`](idem_core::Store::watch)es
//!   (SPEC S15; [`PgStore::listening`]). While it is down, watches poll.
//! - **Fail closed.** Connection errors, pool timeouts and a server that stops answering
//!   are [`idem_core::StoreError::Unavailable`], never a reservation.
//!
//! "Now" always comes from the injected clock, passed as a parameter, never from the
//! server's `now()`.
//!
//! TLS goes through rustls (ring) and is set in the URL as libpq spells it:
//! `sslmode=disable|prefer|require|verify-ca|verify-full` (default `prefer`),
//! `sslrootcert=FILE`, and `sslcert=FILE` with `sslkey=FILE` for a client certificate.
//! The files are read and checked when the store is built; one that cannot work is
//! [`SetupError::Invalid`], naming its parameter. `require` with a CA verifies the chain,
//! as in libpq, and `allow` is refused.
//!
//! # Errors
//!
//! Setting the store up ([`PgStore::connect`], the [`PgStoreBuilder`]'s methods,
//! [`PgStore::migrate`] and the [`schema`] functions) fails with [`SetupError`], the one
//! type every idem store's builder returns: a URL or TLS file that cannot work is
//! [`SetupError::Invalid`] and a table name that does not fit [`SetupError::Namespace`],
//! both before anything is tried; a server that is not there is
//! [`SetupError::Unreachable`], naming the cause, and one that answers and refuses (the
//! role, the database, the TLS handshake, the migration's statements)
//! [`SetupError::Refused`], with PostgreSQL's message and SQLSTATE; both may pass with
//! time. A table migrated by a newer build is [`SetupError::SchemaVersion`]. Once built,
//! every operation speaks [`StoreError`](idem_core::StoreError), and a [`SetupError`]
//! converts to one for callers that speak it throughout.
//!
//! # Examples
//!
//! ```no_run
//! use idem_core::{Endpoint, Fingerprint, Key, Reservation, ReserveRequest, Scope,
//!     ScopeMode, Store, StoredResponse, TenantKey};
//! use idem_postgres::PgStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//!
//! let endpoint = Endpoint::new("POST", "/v1/charges");
//! // The tenant: an HMAC of the credential under the secret the store keeps.
//! let tenant = TenantKey::from_store(&store).await?.credential("authorization", b"Bearer sk_1");
//! let scope = Scope::new(ScopeMode::Public, tenant,
//!     endpoint.clone(), Key::new("8e03978e-40d5-43e8-bc93-6894a57f9324")?);
//! let fp = Fingerprint::compute("POST", endpoint.as_str(), None, b"amount=100",
//!     &Default::default());
//! let request = ReserveRequest::new(scope, fp);
//!
//! match store.reserve(&request).await? {
//!     Reservation::Acquired(lease) => {
//!         // Execute the side effect once, then record its answer.
//!         store.complete(&lease, &StoredResponse::new(201, "charged")).await?;
//!     }
//!     Reservation::Replay(response) => println!("replay {}", response.status),
//!     Reservation::InProgress { retry_after } => println!("409, retry in {retry_after:?}"),
//!     Reservation::Mismatch => println!("422"),
//!     Reservation::Gone { completed_at, .. } => println!("410, completed at {completed_at:?}"),
//! }
//! # Ok(()) }
//! ```

mod ambiguity;
mod batch;
mod builder;
mod durability;
mod error;
mod handoff;
mod list;
mod listen;
mod open;
pub mod schema;
mod statements;
mod store;
mod tls;
mod write;

pub use batch::{BatchStats, DEFAULT_MAX_BATCH};
#[allow(deprecated)]
pub use builder::PgStoreOptions;
pub use builder::{DEFAULT_MAX_CONNECTIONS, DEFAULT_OPERATION_TIMEOUT, PgStoreBuilder};
pub use durability::DurabilityRisk;
/// What the builder, constructors and [`schema`] functions fail with: one type for
/// every store.
pub use idem_core::SetupError;
pub use schema::DEFAULT_TABLE;
pub use store::PgStore;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
