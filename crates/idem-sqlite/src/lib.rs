//! SQLite store for idem: the embedded default (SPEC S10).
//!
//! [`SqliteStore`] keeps idempotency records in one table of a SQLite database file, so
//! a single-instance service gets records that survive restarts without running a
//! database server. It passes idem's store contract suite.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("idem.db").display());
//! use idem_core::*;
//! use idem_sqlite::SqliteStore;
//!
//! let store = SqliteStore::connect(&url).await?; // e.g. "sqlite://idem.db"
//!
//! let key = Key::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324")?;
//! let endpoint = Endpoint::new("POST", "/v1/charges");
//! let scope = Scope::new(ScopeMode::Public, Tenant::anonymous(), endpoint.clone(), key);
//! let fp = Fingerprint::compute("POST", endpoint.as_str(), None, b"amount=100",
//!     &FingerprintOptions::default());
//! let request = ReserveRequest::new(scope, fp);
//!
//! let Reservation::Acquired(lease) = store.reserve(&request).await? else {
//!     unreachable!("the first arrival acquires")
//! };
//! store.complete(&lease, &StoredResponse::new(201, "charged")).await?;
//!
//! // The retry is answered from the record.
//! assert_eq!(store.reserve(&request).await?,
//!     Reservation::Replay(StoredResponse::new(201, "charged")));
//! # Ok(())
//! # }
//! ```
//!
//! Completing in the handler's own transaction (SPEC S9), so that the business write
//! and the completion commit together or not at all:
//!
//! ```no_run
//! # async fn handler(store: idem_sqlite::SqliteStore, lease: idem_core::Lease)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::StoredResponse;
//!
//! let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
//! sqlx::query("INSERT INTO orders (id, amount) VALUES (?1, ?2)")
//!     .bind("ord_1")
//!     .bind(100)
//!     .execute(&mut *tx)
//!     .await?;
//! // Fails with StoreError::Fenced if another attempt took the key over: dropping `tx`
//! // then rolls the order back.
//! store.complete_in(&mut tx, &lease, &StoredResponse::new(201, "ord_1")).await?;
//! tx.commit().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Design
//!
//! - **sqlx for the API and reads.** The PostgreSQL store and the applications that
//!   complete records inside their own transactions (S9) use sqlx; on sqlx the SQLite
//!   store takes the same `Pool`/`Transaction` types, so a handler's transaction can
//!   span its business tables and the records table, and switching backends changes
//!   little. `get` and `ping` read through the pool.
//! - **One writer, group commit.** SQLite has one write lock per file. Every write
//!   (`reserve`, `complete`, `renew`, `release`, `remove`, `purge_expired`) is queued
//!   for one thread that owns one connection: it takes what has queued (up to
//!   [`SqliteStoreBuilder::write_batch`], 128), runs each operation's statements in
//!   arrival order inside one `BEGIN IMMEDIATE`, commits, and only then answers each
//!   caller. A failed `COMMIT`, or a statement that ends the transaction, answers every
//!   operation of the batch `Unavailable`, never `Acquired` for a row that was not
//!   stored; a statement that fails alone fails only its operation. Pooled writers used
//!   to queue in SQLite's busy handler, sleeping up to 100 ms between tries while the
//!   lock sat free; one writer never waits for itself. The queue is bounded
//!   ([`SqliteStoreBuilder::write_queue`], 1024): callers wait for room. The thread
//!   drives its connection synchronously with rusqlite, linked to the same SQLite,
//!   because through sqlx each statement is a round trip to another thread, two
//!   wake-ups that cost more than the statement. In WAL mode a second thread
//!   checkpoints (passively, at most every 100 ms while writes flow), so that copying
//!   the WAL into the file and syncing it does not stall commits; after each of its
//!   rounds the writer copies the few frames that arrived meanwhile, so that the WAL
//!   starts over instead of growing for as long as writes never pause, and a WAL that
//!   a burst grew past 64 MiB is cut back when it does. Both end, closing
//!   their connections, when the last clone of the store is dropped, or on
//!   `Store::close`, which writes what is queued first and leaves the WAL folded into
//!   the file; closing the pool fails later writes.
//! - **One statement reserves.** A fresh key is one plain `INSERT … ON CONFLICT DO
//!   NOTHING`. When a row is there, `INSERT … ON CONFLICT DO UPDATE … WHERE …
//!   RETURNING` replaces an expired record or takes over a lapsed lease with the same
//!   fingerprint, atomically; the `WHERE` mirrors `idem_core::decide`'s execute rows.
//!   (The upsert alone would do for both, but SQLite runs it with a statement journal
//!   and an ephemeral table for `RETURNING`: the plain insert cuts the writer's work per
//!   request by about 30 %.) The writer holds the write lock throughout, so nothing
//!   changes the row between the two. When the upsert writes nothing the store reads
//!   the row and answers what `decide` says of it. Complete, renew and release are
//!   single statements fenced by the attempt's token.
//! - **Time from the clock, not SQLite.** Every timestamp is milliseconds from the
//!   store's injected clock, so tests move time by hand and several processes on one
//!   file agree as far as their clocks do.
//! - **WAL, `synchronous = NORMAL`, `busy_timeout`** (set by [`SqliteStore::connect`];
//!   [`SqliteStoreBuilder::connect_options`] gives them for a pool of one's own).
//!   In WAL mode readers never block the writer nor it them. `NORMAL` syncs the WAL at
//!   checkpoints, not at every commit: the database can never be corrupted, but a
//!   power loss or OS crash (not a process crash) may lose the last commits. For idem
//!   that means a just-completed record may come back as absent, so the retry executes
//!   again, as after expiry (S8); a business unique constraint closes that hole. If it
//!   must not, add `?synchronous=full` to the URL (or set it in
//!   [`SqliteStoreBuilder::connect_with`]'s options): every group commit is then synced,
//!   which cost about a fifth of the gateway's throughput in a load run on 2 cores.
//!   `?page_size=1024` in the URL makes a new file with 1 KiB pages, which write about
//!   half the bytes per request (see [`SqliteStoreBuilder::connect_options`]).
//!   Several stores (processes) on one file each have their writer; they and the
//!   application's own transactions wait up to `busy_timeout` for the lock, and then
//!   fail, which middleware answers with a fail-closed 503.
//! - **Embedded migration** on every open, idempotent and serialised by
//!   `BEGIN IMMEDIATE`, with a version per records table in `idem_schema_versions`.
//!   Version 2 (tombstones, SPEC S16) rebuilds the table once, in the migration's
//!   transaction: SQLite cannot alter the state column's `CHECK`.
//! - **Tombstones** (SPEC S16). A record completed with a tombstone TTL keeps
//!   `tombstone_until`; the purge compacts it, once expired, into a `tombstone` row
//!   (no headers, no body) that lives until then.
//! - **Owner-only files** (SPEC S14). [`SqliteStore::connect`] creates a missing
//!   database file itself, with mode 0600, before SQLite opens it; SQLite gives the
//!   `-wal` and `-shm` the database's mode, so all three are the owner's only,
//!   whatever the umask. A file that exists keeps its mode, with a warning if every
//!   user may read or write it. With [`SqliteStoreBuilder::connect_with`] or
//!   [`SqliteStoreBuilder::from_pool`] the application opens the file, and its mode is
//!   the application's to choose.
//!
//! # Errors
//!
//! Setting the store up ([`SqliteStore::connect`], the [`SqliteStoreBuilder`]'s methods)
//! fails with [`SetupError`], the one type every idem store's builder returns: a URL or
//! setting that cannot work (a `page_size` SQLite does not take, a database file whose
//! directory is missing) is [`SetupError::Invalid`]; a table name the
//! [`Namespace`](idem_core::Namespace) rule refuses, [`SetupError::Namespace`]; with
//! [`migrate(false)`](SqliteStoreBuilder::migrate), no file or no table is
//! [`SetupError::NoSchema`] and a schema of another version
//! [`SetupError::SchemaVersion`], as is a newer one when migrating; a file SQLite cannot
//! open or migrate, [`SetupError::Failed`]. A file has no server that could be away or
//! refuse it, so this store never fails to set up as `Unreachable` or `Refused`. Once
//! open, every operation speaks [`StoreError`](idem_core::StoreError), and a
//! [`SetupError`] converts to one for callers that speak it throughout.
//!
//! # Schema
//!
//! Primary key `(tenant, endpoint, idem_key)`, `endpoint` empty in internal scope mode;
//! `fingerprint` BLOB; `created_at`, `expires_at`, `lease_until`, `completed_at`
//! INTEGER milliseconds; `attempt`; `token` (the fencing token as a signed 64-bit
//! integer); `state` (`in_progress` or `completed`); `status`, `headers`
//! (`idem_core::codec`), `body` BLOB. An index on `expires_at` serves
//! [`purge_expired`](idem_core::Store::purge_expired), which deletes in bounded
//! batches; run `idem_core::Sweeper` to keep the file bounded.
//!
//! `TABLE_meta` (`name` TEXT primary key, `value` BLOB) holds the secrets of
//! [`init_secret`](idem_core::Store::init_secret) (the tenant secret), apart from the
//! records: no purge or removal reaches it. It lives in the same file, so a copy of
//! the file holds it too.

mod builder;
mod connection;
mod error;
mod file;
mod list;
mod open;
mod row;
mod schema;
mod store;
mod write;
mod writer;

pub use builder::SqliteStoreBuilder;
/// What the builder and constructors fail with: one type for every store.
pub use idem_core::SetupError;
pub use schema::{DEFAULT_TABLE, SCHEMA_VERSION, VERSIONS_TABLE};
pub use store::{DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, SqliteStore};
pub use writer::{DEFAULT_WRITE_BATCH, DEFAULT_WRITE_QUEUE, WriterStats};

/// The sqlx types this crate's API takes, re-exported so callers use the same version.
pub use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool};

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
