//! A Redis [`Store`](idem_core::Store) for idem, shared by every instance that reaches
//! the same server (SPEC S10).
//!
//! [`RedisStore`] keeps each record as one string value and does every operation as one
//! command or one Lua script touching only that record's key, so it is atomic on a
//! single server and safe on Redis Cluster. Reserve is the atomic insert-if-absent that
//! decides who executes (S5); complete, renew and release are fenced by the attempt's
//! token (S7); records expire through native TTLs (S8). Time is read from the injected
//! clock and passed to the server, so a `ManualClock` controls leases and expiry in
//! tests.
//!
//! A server that cannot be reached makes every operation fail with
//! [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) within about
//! [`DEFAULT_TIMEOUT`]; the middleware answers 503 and never executes. Operations work
//! again once the server is back.
//!
//! Connecting ([`RedisStore::connect`], [`RedisStoreBuilder::connect`]) fails with
//! [`SetupError`], the one type every idem store's builder returns: a URL or TLS file
//! that cannot work is [`SetupError::Invalid`], naming the parameter, before anything
//! is tried; a server that cannot be reached is [`SetupError::Unreachable`], and one
//! that answers and refuses (a password, a TLS handshake) [`SetupError::Refused`], both
//! of which may pass with time; a namespace whose marker a later build wrote is
//! [`SetupError::SchemaVersion`]. A [`SetupError`] converts to a
//! [`StoreError`](idem_core::StoreError) for callers that speak it throughout.
//!
//! # One request, two commands
//!
//! A keyed request costs the server one native command and one short script:
//!
//! - **reserve**: `SET key <in-progress record> NX GET PX <ttl>`. No reply means the key
//!   was free and is now this caller's (attempt 1): the common case needs no script.
//!   A value is the record holding the key; [`idem_core::decide`], the one place of the
//!   decision table, judges it (replay, 409, 422). Only when it says to execute (the
//!   record expired, or its lease lapsed under the same payload) does the store write,
//!   through `scripts/take_over.lua`: a compare-and-set that replaces the record only if
//!   its head (below) is still the one read. A caller that loses reads the record
//!   again; of any number of racers, one wins.
//! - **complete**: `scripts/complete.lua` reads the value, checks the token, the
//!   logical expiry and the state at fixed offsets, and writes the completed record with
//!   `SET … KEEPTTL`. Renew and release are the same kind of script; purge `SCAN`s the
//!   prefix and checks each key with one.
//! - **list** ([`Store::list`](idem_core::Store::list)): `SCAN`s the prefix (each master
//!   of a cluster in turn) and reads each record with `GET`. Each `SCAN` batch is listed
//!   whole, its unlisted keys carried in the page's cursor when a page fills mid-batch,
//!   so the listing is exactly one `SCAN` iteration: no record present throughout is
//!   skipped, none is repeated while the keyspace grows, and one may be repeated on a
//!   later page only if the server shrinks its table mid-listing.
//!
//! One string per record is cheaper on the server than a hash with a script for every
//! operation (the README has the figures): the fresh-key reserve is a single native
//! command, a script reads the few fields it checks with `string.sub` instead of
//! `HMGET`, and the whole record is written with one `SET` instead of a `HSET` of
//! eleven fields, a `PEXPIRE` and an `HDEL`.
//!
//! # TLS
//!
//! `rediss://` (one server) and `rediss+cluster://` (a cluster, every node alike) go
//! through rustls on the ring provider. The server's certificate must chain to
//! `?cacert=FILE` (PEM), or the system's roots without one, and name the URL's host;
//! `cert=FILE` with `key=FILE` present a client certificate; `insecure=true` turns the
//! checks off and is never implied. The files are read and checked when the store
//! opens ([`OpenStore`](idem_core::OpenStore)): one that cannot work is an invalid URL
//! naming the parameter, and a handshake that fails a refusal saying why.
//!
//! # Clusters and replicas
//!
//! `redis+cluster://host:port[?seeds=host:port,…]` opens the store on a Redis Cluster
//! through redis-rs's async cluster client, which discovers the slots from the seed
//! nodes, follows `MOVED` and `ASK` and reconnects to each node. Every command and
//! script names the one record key it touches (the scripts read it as `KEYS[1]`), and
//! the key's hash tag is the scope's digest, so each runs on the master of its record's
//! slot; the purge walks every master in turn.
//!
//! Redis replicates asynchronously: a master that fails right after a reservation can
//! lose it, and the retry then executes again on the promoted replica. `?wait=N` (and
//! `wait_timeout`, or [`RedisStoreBuilder::wait`]) sends `WAIT N timeout` behind each
//! reservation and completion, in the same pipeline, so on the same connection and to
//! the same node; fewer replicas in time release the reservation and fail the operation
//! with [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) (see
//! [`Replication`]).
//!
//! # Waiting duplicates
//!
//! On one server, the complete and release scripts `PUBLISH` the scope's digest on
//! `PREFIX` + `changes` once they have written, and each store keeps one subscriber
//! connection that fires its [`Store::watch`](idem_core::Store::watch)es (SPEC S15), so
//! a duplicate waiting on one instance wakes when another completes
//! ([`RedisStore::listening`]). On a Redis Cluster the store neither publishes nor
//! subscribes (that would take sharded pub/sub on each record's slot): its watches are
//! [`Watch::poll`](idem_core::Watch::poll), and waiters poll.
//!
//! # The record
//!
//! One binary string, big-endian integers, times in milliseconds since the epoch. The
//! fields the scripts read or change sit at fixed offsets in a head of 71 bytes, so a
//! script never decodes the rest; numbers are compared the way the caller wrote them
//! (tokens as their 8 bytes), and a script writes only bytes the caller passed or that
//! it read.
//!
//! | offset | bytes | field                                                           |
//! |-------:|------:|-----------------------------------------------------------------|
//! |      0 |     2 | `I1`: a record of this store, format 1                          |
//! |      2 |     8 | fencing token (`u64`)                                           |
//! |     10 |     8 | `expires_at` (`i64`)                                            |
//! |     18 |     8 | `lease_until` while in progress, `completed_at` once completed  |
//! |     26 |     1 | state: `P` in progress, `C` completed                           |
//! |     27 |     8 | `created_at` (`i64`)                                            |
//! |     35 |     4 | attempt (`u32`)                                                 |
//! |     39 |    32 | fingerprint                                                     |
//! |     71 |    12 | lengths of tenant, endpoint and key (`u32` each)                |
//! |     83 |     … | tenant, endpoint (empty in internal mode), key, as text         |
//!
//! An in-progress record may go on with one byte: why its attempt left it in progress
//! (an upstream timeout or lost connection, `Store::mark_ambiguous`), the reason's place
//! in `Ambiguity::ALL` plus one. A completed record goes on instead with its answer:
//! status (`u16`), the length of the header block (`u32`), the header block (the
//! headers and the answer's metadata, its ambiguity reason included:
//! `idem_core::codec::encode_response_headers`), and the body, which is the rest of the
//! value. A listing reads each record it scans, so the reason needs no index here. Every write a record can see changes its head (a new token on each
//! reservation and takeover, the lease on renewal, the state on completion), which is
//! what the takeover compares.
//!
//! The key is `prefix + "{" + Scope::digest() + "}"` ([`RedisStore::record_key`]); the
//! braces make the digest the Redis Cluster hash tag. The native TTL is the record's
//! remaining life by the store's clock plus [`DEFAULT_TTL_GRACE`].
//!
//! **Tombstones** (SPEC S16). A record reserved with a tombstone TTL writes, when it
//! completes, its tombstone at [`RedisStore::tombstone_key`] (the record's key and `t`,
//! the same hash tag): the record's head with state `T`, the completion time in place of
//! the lease and the tombstone's end as the expiry, then the scope and the status (`u16`),
//! nothing else, with a native TTL at its end plus the grace. A reserve of a request that
//! keeps tombstones runs one script that answers with a live tombstone when the record
//! has expired or is gone; one that keeps none is the plain `SET NX GET` and does not
//! look. `remove` deletes both keys.
//!
//! The tenant secret ([`Store::init_secret`](idem_core::Store::init_secret)) is at
//! `prefix + "meta:" + name` ([`RedisStore::secret_key`]), set once with `SET NX`,
//! without TTL; the purge's `SCAN` matches record and tombstone keys only, so it never
//! reaches it.
//! An `allkeys-*` eviction policy could evict it, as it could records.
//!
//! **The namespace's marker.** Connecting writes `prefix + "meta:schema"`
//! ([`RedisStore::marker_key`]) where it is missing, holding [`SCHEMA_VERSION`], without
//! TTL (`SET … NX GET`, one round trip at start). Records expire natively, so without
//! it a namespace whose records have all expired and a mistyped one would look alike:
//! `idem keys` opens the store without writing (`Schema::Existing`) and reads the
//! marker, and a namespace without it (nor a tenant secret, which gateways from before
//! the marker left) is "never opened by idem", exit 1, as a SQL store without its table
//! is. A namespace marked with a later version than this build's is refused. The
//! `SCAN` of listing and purge never matches it; like the secret, an `allkeys-*`
//! eviction policy or a `FLUSHDB` can remove it, and the next gateway to start writes it
//! again.
//!
//! **Inspecting a record.** `idem keys show` (or the gateway's admin `GET /keys`) decodes
//! it through [`Store::get`](idem_core::Store::get). By hand: `PTTL key` for the native
//! TTL; `redis-cli --no-raw GET key` prints the value with its bytes escaped, where the
//! state (`P`/`C`) is the 27th byte and the tenant, endpoint, key, and for a completed
//! record the body, read as text at the end; `GETRANGE key 2 9` is the token and
//! `GETRANGE key 10 17` the expiry, big-endian.
//!
//! **Records of the older format.** Versions of this crate before the string format
//! kept each record as a hash. This version does not read them: every operation on such
//! a key fails with [`StoreError::Corrupt`](idem_core::StoreError::Corrupt) (the
//! middleware's fail-closed 503), naming the older format, and never acquires or
//! writes there; purge leaves the key to its native TTL and `remove` deletes it. The two
//! formats do not mix, so switch a fleet at once: either under a new
//! [`key_prefix`](RedisStoreBuilder::key_prefix), or after deleting the old hashes
//! under the old one (`SCAN` with `TYPE hash`, then `UNLINK`). Either way a key first
//! used before the switch and retried after it executes again; where that matters,
//! switch when the old records have expired (their TTL plus grace after the last
//! request the old version took).
//!
//! # Examples
//!
//! ```no_run
//! # async fn run() -> Result<(), idem_core::StoreError> {
//! use idem_core::*;
//! use idem_redis::RedisStore;
//!
//! let store = RedisStore::builder()
//!     .key_prefix("payments:idem:")
//!     .connect("redis://127.0.0.1:6379")
//!     .await?;
//!
//! // The tenant: an HMAC of the credential under the secret the store keeps.
//! let tenant = TenantKey::from_store(&store).await?.credential("authorization", b"Bearer sk_1");
//! let scope = Scope::new(ScopeMode::Public, tenant,
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
//!     Reservation::Gone { completed_at, .. } => println!("410, completed at {completed_at:?}"),
//! }
//! # Ok(())
//! # }
//! ```

mod builder;
mod cluster;
mod conn;
mod error;
mod eviction;
mod list;
mod open;
mod purge;
mod record;
mod replication;
mod reserve;
mod schema;
mod store;
mod subscribe;
mod target;

pub use builder::RedisStoreBuilder;
pub use eviction::EvictionRisk;
/// What connecting fails with: one type for every store.
pub use idem_core::SetupError;
pub use schema::SCHEMA_VERSION;
pub use store::{DEFAULT_KEY_PREFIX, DEFAULT_TIMEOUT, DEFAULT_TTL_GRACE, RedisStore};
pub use target::{DEFAULT_WAIT_TIMEOUT, Replication};

/// The README's example, compiled as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
