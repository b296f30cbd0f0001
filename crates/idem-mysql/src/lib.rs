//! MySQL and MariaDB store for idem: [`MySqlStore`], a shared store for several
//! instances, in the database that already holds an application's business rows.
//!
//! What works today:
//!
//! - **Every operation of the store contract** (`idem_core::testing`), run against
//!   MariaDB: reserve, complete, renew, release, ambiguity marks, tombstones (SPEC S16),
//!   bounded purge through the `expires_at` index (SPEC S8), listing with paging, the
//!   tenant secret.
//! - **A fixed-width primary key**: the SHA-256 of the scope
//!   ([`Scope::digest`](idem_core::Scope::digest)), 32 bytes, so that no key, tenant or
//!   endpoint length can pass InnoDB's index limit ([`schema`]).
//! - **Reserve without gap locks.** A plain `INSERT` that the primary key refuses
//!   (duplicate key, 1062) where a row exists; then a plain read, which
//!   [`idem_core::Reservation::from_existing`] interprets; and only where that says the
//!   record may be taken over, an `UPDATE` by primary key fenced on the token, state and
//!   expiry read. One statement for a new key, two for one in progress or completed,
//!   three for a takeover. Never
//!   `INSERT … ON DUPLICATE KEY UPDATE` nor `SELECT … FOR UPDATE` of a missing row, which
//!   under REPEATABLE READ take next-key locks that concurrent duplicates deadlock on.
//!   The store sets no isolation level: its statements run in autocommit under the
//!   server's default, REPEATABLE READ in both MySQL and MariaDB, and each reads what committed
//!   before it.
//! - **Shared commits** ([`MySqlStoreBuilder::batching`], on by default): reserves and
//!   completions that queue while others are written go to the server together, one
//!   multi-row statement (and so one commit) per kind of operation for the whole batch,
//!   with exactly the single-row outcomes; a lone operation is written at once, alone.
//!   A batch the server refuses (a deadlock among them) is written again one operation
//!   at a time through the single-row statements ([`MySqlStore::batch_stats`]).
//! - **Deadlocks and lock waits are retried.** A statement InnoDB rolled back for a lock
//!   (1213, 1205) runs again, a bounded number of times within the operation timeout;
//!   then the operation is [`StoreError::Unavailable`](idem_core::StoreError::Unavailable).
//! - **A reservation whose reply was lost is released.** An insert that failed after
//!   it was sent (the connection broke, the operation timed out) may have committed: the
//!   store deletes the first attempt by its token in the background, so that a retry
//!   soon executes rather than waiting out the lease.
//! - **Fenced writes.** `complete`, `renew`, `release` and `mark_ambiguous` match the
//!   attempt's fencing token (SPEC S7); [`MySqlStore::complete_in`] completes on the
//!   caller's connection, inside its transaction (SPEC S9).
//! - **Migrations under a lock**: the session's `GET_LOCK`, released after, since
//!   MySQL commits a transaction at each DDL statement; [`schema::check`] reads without
//!   writing.
//! - `utf8mb4` with its binary collation, `ENGINE=InnoDB`, `LONGBLOB` answers. An
//!   answer larger than the server's `max_allowed_packet` fails as unavailable.
//! - **Waiting duplicates woken across instances** (SPEC S15) without `LISTEN/NOTIFY`:
//!   one poller per store asks, once per interval ([`DEFAULT_WAIT_POLL`], the URL's
//!   `wait-poll-ms`) and in one statement per [`MOST_PER_STATEMENT`] scopes, which of
//!   the records its waiters watch a live attempt still holds, and wakes the waiters of
//!   the others, whichever instance ended the attempt. The cost is per instance and
//!   interval, not per waiter, and nothing while nobody waits; a failed statement wakes
//!   every waiter to look for itself. [`MySqlStoreBuilder::wait_poll`] sets it.
//! - **TLS** through rustls: `ssl-mode` (`DISABLED`, `PREFERRED`, `REQUIRED`,
//!   `VERIFY_CA`, `VERIFY_IDENTITY`), `ssl-ca`, and `ssl-cert` with `ssl-key` for a
//!   client certificate, read and checked when the store is built; a handshake that
//!   fails is a refusal that says so.
//!
//! The gateway opens it from `--store mysql://…` or `mariadb://…` (a namespace `NAME` is
//! the table `NAME_records`), through [`OpenStore`](idem_core::OpenStore).
//!
//! Key-rate buckets ([`Store::take_rate_token`](idem_core::Store::take_rate_token)) are
//! shared by every instance on the table, in `TABLE_rate` ([`schema::rate_table`]).
//!
//! No RSA: the driver's `mysql-rsa` feature is off, so a MySQL 8 account on
//! `caching_sha2_password` cannot send its password over plain TCP until the server
//! cached it (over TLS it can); MariaDB's `mysql_native_password` and `ed25519` accounts are unaffected.
//!
//! # Errors
//!
//! Setting the store up ([`MySqlStore::connect`], the [`MySqlStoreBuilder`]'s methods,
//! [`MySqlStore::migrate`] and the [`schema`] functions) fails with [`SetupError`]: a
//! URL that cannot work is [`SetupError::Invalid`] and a table name that does not fit
//! [`SetupError::Namespace`], before anything is tried; a server that is not there is
//! [`SetupError::Unreachable`], and one that answers and refuses
//! [`SetupError::Refused`], with MySQL's message and error number. Once built, every
//! operation speaks [`StoreError`](idem_core::StoreError).
//!
//! # Examples
//!
//! ```no_run
//! use idem_core::{Endpoint, Fingerprint, Key, Reservation, ReserveRequest, Scope,
//!     ScopeMode, Store, StoredResponse, Tenant};
//! use idem_mysql::MySqlStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
//!
//! let endpoint = Endpoint::new("POST", "/v1/charges");
//! let scope = Scope::new(ScopeMode::Public, Tenant::new("acct_1"), endpoint.clone(),
//!     Key::new("8e03978e-40d5-43e8-bc93-6894a57f9324")?);
//! let fp = Fingerprint::compute("POST", endpoint.as_str(), None, b"amount=100",
//!     &Default::default());
//!
//! match store.reserve(&ReserveRequest::new(scope, fp)).await? {
//!     Reservation::Acquired(lease) => {
//!         // Execute the side effect once, then record its answer.
//!         store.complete(&lease, &StoredResponse::new(201, "charged")).await?;
//!     }
//!     Reservation::Replay(response) => println!("replay {}", response.status),
//!     other => println!("{other:?}"),
//! }
//! # Ok(()) }
//! ```

mod batch;
mod builder;
mod error;
mod list;
mod open;
mod poller;
pub mod schema;
mod statements;
mod store;
mod tls;
mod write;

pub use batch::{BatchStats, DEFAULT_MAX_BATCH};
pub use builder::{DEFAULT_MAX_CONNECTIONS, DEFAULT_OPERATION_TIMEOUT, MySqlStoreBuilder, SCHEMES};
/// What the builder, constructors and [`schema`] functions fail with: one type for
/// every store.
pub use idem_core::SetupError;
pub use poller::{DEFAULT_WAIT_POLL, MOST_PER_STATEMENT};
pub use schema::DEFAULT_TABLE;
pub use store::MySqlStore;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
