//! The Idempotency-Key protocol, without I/O.
//!
//! `idem-core` holds what every part of idem agrees on: how a header value becomes a
//! [`Key`] (SPEC S2), whose key it is ([`Scope`], S3), what makes two requests the same
//! ([`Fingerprint`], S4), the decision table ([`decide`], S5) and the [`Store`] trait
//! that backends implement (S10), with an in-memory [`MemoryStore`]. A store keeps its
//! records under a [`Namespace`], and opens itself from its URL through [`OpenStore`];
//! every store's builder fails with one [`SetupError`], which opening from a URL carries
//! as an [`OpenError`].
//! [`Store::list`] pages through records for operators ([`ListQuery`]), by state, age
//! and whether their outcome is ambiguous ([`Ambiguity`]). A recorded answer
//! ([`StoredResponse`]) keeps what the record knows about it besides its headers and
//! body as typed [`ResponseMeta`], which each store maps at its boundary ([`codec`]).
//! The protocol profiles, the dialects an API's answers are written in, are listed once,
//! by [`Profile`].
//! The `testing` feature adds the store contract kit every store runs, idem's own and
//! anyone else's (the module `testing`).
//!
//! # Examples
//!
//! One request's life against a store:
//!
//! ```
//! # tokio_test();
//! # fn tokio_test() {
//! # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # rt.block_on(async {
//! use idem_core::*;
//!
//! let store = MemoryStore::new();
//! let key = Key::parse(b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\"").unwrap();
//! let endpoint = Endpoint::new("POST", "/v1/charges");
//! // The tenant: an HMAC of the credential under the store's secret (SPEC S3).
//! let tenants = TenantKey::from_store(&store).await.unwrap();
//! let tenant = tenants.credential("authorization", b"Bearer sk_1");
//! let scope = Scope::new(ScopeMode::Public, tenant, endpoint.clone(), key);
//! let body = br#"{"amount":100}"#;
//! let fp = Fingerprint::compute("POST", endpoint.as_str(), Some("application/json"),
//!     body, &FingerprintOptions::default());
//! let request = ReserveRequest::new(scope, fp);
//!
//! // First arrival: reserve, execute, complete.
//! let Reservation::Acquired(lease) = store.reserve(&request).await.unwrap() else {
//!     unreachable!()
//! };
//! store.complete(&lease, &StoredResponse::new(201, "charged")).await.unwrap();
//!
//! // The retry is answered from the record.
//! match store.reserve(&request).await.unwrap() {
//!     Reservation::Replay(r) => assert_eq!(r.status, 201),
//!     other => panic!("{other:?}"),
//! }
//! # });
//! # }
//! ```

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod canonical;
mod clock;
pub mod codec;
mod decision;
#[cfg(feature = "tokio")]
mod feed;
mod fingerprint;
mod form;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod jcs;
mod json;
mod key;
mod list;
mod memory;
mod meta;
mod multipart;
mod namespace;
pub mod open;
pub mod private_file;
mod profile;
mod rate;
mod record;
mod scope;
#[cfg(feature = "seal")]
pub mod seal;
mod store;
#[cfg(feature = "sweeper")]
mod sweeper;
mod tenant;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "tokio")]
mod unconfirmed;
mod watch;
mod wrapper;

pub use clock::{Clock, ManualClock, SharedClock, SystemClock, Timestamp, duration_millis};
pub use codec::{AMBIGUOUS_HEADER, REFERENCE_HEADER, TRAILER_PREFIX};
pub use decision::{Decision, Reservation, decide};
#[cfg(feature = "tokio")]
pub use feed::{Backoff, ChangeFeed, FEED_FIRST_BACKOFF, FEED_MAX_BACKOFF, FeedSession};
pub use fingerprint::{
    DEFAULT_BODY_LIMIT, DuplicateMember, Fingerprint, FingerprintOptions, RefusedJson,
    is_json_content_type,
};
pub use json::{
    MAX_EXPONENT_DIGITS, MAX_JSON_DEPTH, PointedValue, PointerError, PointerLookup, UnreadableJson,
    is_blank, value_at_pointer,
};
pub use key::{Key, KeyError, MAX_KEY_LEN};
pub use list::{
    Ambiguity, DEFAULT_LIST_LIMIT, ListCursor, ListPage, ListQuery, MAX_LIST_LIMIT, StateFilter,
};
pub use memory::{DEFAULT_MAX_ENTRIES, MemoryStore};
pub use meta::ResponseMeta;
pub use namespace::{DEFAULT_NAMESPACE, MAX_NAMESPACE_LEN, Namespace, NamespaceError};
pub use open::{MigrationPlan, OpenError, OpenStore, Schema, SetupError, StoreOptions, redact_url};
pub use profile::{Profile, UnknownProfile};
pub use rate::{KeyRate, KeyRateError, LocalBucket};
pub use record::{
    DEFAULT_LEASE, DEFAULT_TTL, FencingToken, Lease, Record, RecordState, ReserveRequest,
    StoredResponse,
};
pub use scope::{Endpoint, Scope, ScopeMode, Tenant};
#[cfg(feature = "seal")]
pub use seal::Sealed;
#[cfg(feature = "seal")]
pub use seal::{RecordKeyError, RecordKeys};
pub use store::{MetricKind, Result, Store, StoreError, StoreMetric};
#[cfg(feature = "sweeper")]
pub use sweeper::{Sweeper, SweeperConfig, sweep_once};
pub use tenant::{
    MIN_TENANT_SECRET_LEN, TENANT_PREFIX, TENANT_SECRET_NAME, TenantHasher, TenantKey,
    TenantSecretError,
};
#[cfg(feature = "tokio")]
pub use unconfirmed::{
    MAX_UNCONFIRMED_RELEASES, UNCONFIRMED_RELEASE_PAUSES, release_unconfirmed,
    release_unconfirmed_with,
};
pub use watch::{ChangeHub, Watch};
pub use wrapper::Forward;
