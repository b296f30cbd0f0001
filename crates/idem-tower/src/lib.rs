//! `Idempotency-Key` middleware for tower and axum.
//!
//! [`IdempotencyLayer`] gives an existing service Stripe-style idempotency keys over any
//! [`idem_core::Store`]: the first request with a key executes and its answer is
//! recorded; a retry with the same key gets that answer back, marked
//! `Idempotent-Replayed: true`, and the handler does not run again.
//!
//! # Examples
//!
//! ```
//! use axum::{Router, body::Body, http::StatusCode, routing::post};
//! use http::Request;
//! use idem_core::MemoryStore;
//! use idem_tower::IdempotencyLayer;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let app = Router::new()
//!     .route("/v1/orders", post(|| async { (StatusCode::CREATED, "order 1") }))
//!     .layer(IdempotencyLayer::new(MemoryStore::new()));
//!
//! let request = || {
//!     Request::post("/v1/orders")
//!         .header("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
//!         .body(Body::from(r#"{"sku":"tea","qty":2}"#))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), 201);
//!
//! let retry = app.oneshot(request()).await.unwrap();
//! assert_eq!(retry.status(), 201);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! # }
//! ```
//!
//! Configure it with the builder:
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderName, Method};
//! use idem_core::{FingerprintOptions, MemoryStore, ScopeMode};
//! use idem_tower::{IdempotencyLayer, RouteConfig};
//!
//! let layer = IdempotencyLayer::new(MemoryStore::new())
//!     .keyed_methods([Method::POST, Method::PATCH])
//!     .require_key_if(|_method, parts| parts.uri.path().starts_with("/v1/charges"))
//!     .scope_mode(ScopeMode::Public)
//!     .fingerprint_options(FingerprintOptions::default().ignore_pointer("/sent_at").unwrap())
//!     .body_limit(256 * 1024)
//!     .ttl(Duration::from_secs(24 * 3600))
//!     .lease(Duration::from_secs(60))
//!     .store_headers([HeaderName::from_static("x-order-version")])
//!     .route_config(|_method, parts| {
//!         parts.uri.path().ends_with("/capture").then(|| {
//!             RouteConfig::new().endpoint("/v1/orders/{id}/capture").require_key(true)
//!         })
//!     });
//! # let _ = layer;
//! ```
//!
//! # What happens to a request (SPEC S2–S8)
//!
//! - Methods that are not keyed (default: anything but POST and PATCH) pass through
//!   untouched and streaming, key or not. A method equal to a keyed one ignoring ASCII
//!   case is keyed as that method (`post` and `PoSt` as `POST`, in the scope and the
//!   fingerprint alike; the handler gets it as sent), since most frameworks run it so:
//!   no spelling sidesteps the key. Nor does a method-override header
//!   (`X-HTTP-Method-Override` and the like, which many frameworks run a request by):
//!   a request is keyed when its method or the overriding one is, and decided as the
//!   keyed one (see [`IdempotencyLayer::method_override_headers`]); overrides that
//!   disagree are 400 `invalid-method-override`. A keyed request carrying the key's or
//!   a tenant header's name spelt with `_` for `-` (`Idempotency_Key`), which CGI and
//!   WSGI servers read as that header, is 400 `ambiguous-header`. A keyed request
//!   without a key passes through on a
//!   route that does not require one; on a route that does (see
//!   [`IdempotencyLayer::require_key`], [`IdempotencyLayer::require_key_if`],
//!   [`RouteConfig::require_key`]) it is answered 400 `missing-key`.
//! - The key is read in the quoted Structured Field form or the bare form; anything
//!   malformed, and two key fields on one request, is 400 `invalid-key`.
//! - The scope is `(tenant, endpoint, key)` in public mode, `(tenant, key)` in internal
//!   mode. The tenant is an HMAC-SHA256 of the `Authorization` value, auth-scheme case
//!   folded ([`TenantHeaders`]; [`IdempotencyLayer::tenant_headers`] lists others),
//!   under a secret: the one given to [`IdempotencyLayer::tenant_key`], else the
//!   store's own, which the layer fetches (and on a store's first use generates) with
//!   [`idem_core::TenantKey::from_store`] before it scopes the first keyed request. So
//!   a stolen store cannot be reversed with a word list, and every instance on one
//!   store names a client alike. A request without the header is `anonymous`, or with
//!   [`IdempotencyLayer::require_tenant`] a 401 `missing-tenant`. The endpoint is
//!   `METHOD route-template`, the template coming
//!   from [`RouteConfig::endpoint`], else axum's `MatchedPath` (feature `axum`, on by
//!   default; present when the layer is added with `Router::layer` or `route_layer`),
//!   else the path.
//! - The body is buffered up to the limit (default 1 MiB; over it: 413 `body-too-large`,
//!   nothing reserved) and fingerprinted over the method, the request target (path and
//!   query) and the body, JSON normalised. A body in the `gzip` or `deflate` content
//!   coding is fingerprinted by its decoded content (up to the same limit; a body whose
//!   coding is another, that does not decode, or that has bytes after its coded stream,
//!   by its bytes), so a retry that a client
//!   compressed afresh matches; the handler gets the body as sent. The fingerprint
//!   takes the concrete path, not the template: a key reused on `/orders/2/capture`
//!   after `/orders/1/capture` is a 422, never order 1's replay.
//! - The store's atomic reserve then decides, through [`idem_core::decide`]:
//!
//! | record                        | answer                                                    |
//! |-------------------------------|-----------------------------------------------------------|
//! | expired, its tombstone alive ([`IdempotencyLayer::tombstone_ttl`]), same fingerprint | 410 `key-expired`: when it completed, with what status; not executed again |
//! | none or expired               | execute (attempt 1)                                       |
//! | fingerprint differs           | 422 `key-reused`                                          |
//! | in progress, lease alive      | 409 `request-in-progress` + `Retry-After`                 |
//! | in progress, lease expired    | execute as attempt n+1, `recovered = true`                |
//! | completed                     | replay: status, stored headers, body, `Idempotent-Replayed: true` |
//! | store error                   | 503 `store-unavailable` + `Retry-After`; handler not called |
//!
//! # Waiting duplicates
//!
//! A duplicate that finds its key in progress may wait for the answer instead of the
//! 409 (SPEC S15): `Prefer: wait=N` (RFC 7240), or a route's default
//! ([`RouteConfig::conflict_wait`], [`IdempotencyLayer::conflict_wait`]; none by
//! default), bounded by [`IdempotencyLayer::max_wait`] (default
//! [`DEFAULT_MAX_WAIT`]), the route's lease, and [`IdempotencyLayer::max_waiters`]
//! (default [`DEFAULT_MAX_WAITERS`]; beyond it, 409 at once). The waiter awaits the
//! store's [`Store::watch`](idem_core::Store::watch), or polls at a backoff when the
//! store cannot tell, and reserves again after each wake: a completion gives it the
//! replay, with `Preference-Applied: wait=N` ([`PREFERENCE_APPLIED`]) when it asked; a release makes it the
//! next attempt; still in progress at the end, it gets the 409. While it waits it holds
//! no store connection, and a client that hangs up frees its slot. A gRPC call sends
//! no `Prefer`; a route's default wait applies to it.
//!
//! # Execution
//!
//! The reservation, the handler and the recording run inside the response future, with
//! no task spawned (unless recording must go on after the answer, as above). A client that disconnects does not cancel them: once the body is
//! read, a response future dropped before it finished hands the rest of its execution to
//! the runtime, where the handler runs to completion and its answer is recorded, so the
//! client's retry gets the replay. While the handler runs, the lease is renewed every
//! third of its length, counted from when the store was asked. A reservation the store
//! confirms half a lease or more after it was asked is not executed under: its lease may
//! have lapsed and another attempt taken over; it is given back if still its own, and
//! the client gets 503 `reservation-late` (SPEC S7). Its request carries an [`IdempotencyContext`] extension (key,
//! scope, attempt, `recovered`, lease) with [`IdempotencyContext::derive`] for
//! deterministic downstream keys.
//!
//! **A handler that panics, or whose service or response body fails, may already have
//! had effects**: the layer records a 500 `handler-failed` problem and replays it to
//! every retry of that key. Map errors you know to be harmless to a response with
//! [`Disposition::Release`] yourself.
//!
//! What is recorded (SPEC S6): every answer of an execution that started, 5xx and
//! 402-style refusals included, except statuses that say the request never started —
//! 400 401 403 404 405 408 409 413 415 422 429 503 by default
//! ([`IdempotencyLayer::release_statuses`], per route
//! [`RouteConfig::release_statuses`]) — which release the key so a corrected retry may
//! execute. A [`Disposition`] response extension overrides that for one response. The
//! handler can ask [`IdempotencyContext::releases`] whether a status will release.
//! A proxy inside the layer (the idem gateway) marks its upstream's answers
//! [`Proxied`], with a deadline: an answer to record is read whole by then, and what
//! goes wrong reading it is the upstream's failure ([`UpstreamFailure`]: a 504 that
//! keeps the record in progress when the answer stalls or breaks off, a recorded 502
//! when it is over the response limit), not the handler's. Where it has no answer of
//! its upstream's, it fails with a [`ForwardError`], which the layer answers in the
//! request's dialect and settles the key by (a 502 that releases it when nothing was
//! sent, a 504 that keeps it in progress when the outcome is unknown). Stored
//! headers are an allow-list ([`DEFAULT_STORED_HEADERS`]: `content-type`,
//! `content-encoding`, `location` and the CORS headers a browser needs to read the
//! answer; plus [`IdempotencyLayer::store_headers`]); [`NEVER_STORED_HEADERS`] are
//! refused. The body
//! is stored as sent, so a compressed answer replays compressed, with its
//! `content-encoding`, whatever the retry's `accept-encoding` says. The first
//! caller receives the handler's full response; replays receive only what was stored.
//!
//! Recording (or releasing) is tried three times within half a second before the
//! caller gets the answer. If the store is down all that time, the caller gets the
//! answer anyway and the write goes on in the background, after growing pauses, for as
//! long again as the lease: retries get 409 meanwhile, then the replay (or, after a
//! release, a new execution), and the handler does not run a second time for an outage
//! shorter than that. Only if the store stays away longer does the lease lapse and a
//! retry execute again, as the next attempt.
//!
//! On shutdown, stop accepting connections, then await
//! [`IdempotencyLayer::in_flight`]`().wait()` so every started execution is recorded
//! (an answer still being recorded in the background counts as in flight).
//!
//! # gRPC (SPEC S18)
//!
//! A unary gRPC call (content type `application/grpc` or `application/grpc+<codec>`,
//! see [`is_grpc`]) is keyed as any request is, by its `idempotency-key` metadata (the
//! same header, the same validation). Its fingerprint covers its method path and its
//! message bytes as sent, never normalised (protobuf is not canonical; a client
//! resends the same bytes). Its answer is recorded with its status fields
//! ([`GRPC_STATUS_FIELDS`]): a replay sends them as trailers again, or in the headers
//! of a trailers-only answer, as first sent. The key is released by the statuses of
//! [`GrpcReleaseCodes`] ([`DEFAULT_GRPC_RELEASE_CODES`]; see
//! [`IdempotencyLayer::grpc_release_codes`], [`RouteConfig::grpc_release_codes`]) and
//! the answer recorded otherwise. The layer's own answers to a gRPC call are gRPC
//! errors ([`Problem::to_grpc_response`], [`ProblemKind::grpc_code`]). The layer cannot
//! tell a streaming method from a unary one by its head: a keyed call whose request
//! stream is not one message is answered `INVALID_ARGUMENT`, and streaming calls are
//! meant to be sent without a key, when they pass through untouched.
//!
//! # Problem types
//!
//! Every error answer is an RFC 9457 `application/problem+json` body with `type`,
//! `title`, `status` and `detail`, unless a [`Profile`] other than the default says
//! otherwise ([`IdempotencyLayer::profile`], [`RouteConfig::profile`]): under `stripe`,
//! `acp` and `ucp` the same answers are written as those protocols' SDKs parse them (a
//! key reused with another payload is a 400 `idempotency_error` in Stripe's envelope,
//! a 422 `idempotency_conflict` under ACP, a 409 under UCP). The `type` URIs are
//! stable:
//!
//! | status | `type`                                          | meaning                               |
//! |--------|-------------------------------------------------|---------------------------------------|
//! | 400    | `https://idem.dev/problems/invalid-key`         | malformed or repeated key header      |
//! | 400    | `https://idem.dev/problems/missing-key`         | the route requires a key              |
//! | 400    | `https://idem.dev/problems/body-unreadable`     | the request body could not be read    |
//! | 401    | `https://idem.dev/problems/missing-tenant`      | [`IdempotencyLayer::require_tenant`] and no tenant header; `WWW-Authenticate: Bearer`; nothing reserved |
//! | 400    | `https://idem.dev/problems/invalid-host`        | no `Host` on HTTP/1.1, several, or one that names no host (the idem gateway's listener, SPEC S14); nothing reserved or forwarded |
//! | 400    | `https://idem.dev/problems/invalid-method-override` | method-override headers that do not name one method; nothing reserved or forwarded |
//! | 400    | `https://idem.dev/problems/ambiguous-header`    | a keyed request carries the key's or a tenant header's name spelt with `_` for `-`; nothing reserved or forwarded |
//! | 400    | `https://idem.dev/problems/duplicate-json-member` | a keyed request's JSON body names a member twice in one object (RFC 7493), at any depth; nothing reserved or forwarded |
//! | 400    | `https://idem.dev/problems/unreadable-json` | a keyed request's JSON body, on a route that reads its key or fingerprint's fields from it (key pointer, ignored pointers, JCS), is not JSON the layer reads (see [`idem_core::UnreadableJson`]); nothing reserved or forwarded |
//! | 400    | `https://idem.dev/problems/invalid-path`        | the path cannot be normalised (the idem gateway's listener, SPEC S14); nothing reserved or forwarded |
//! | 413    | `https://idem.dev/problems/body-too-large`      | body over the limit; nothing reserved |
//! | 408    | `https://idem.dev/problems/body-timeout`        | body not in within the body timeout; nothing reserved |
//! | 409    | `https://idem.dev/problems/request-in-progress` | another attempt runs (after any wait granted); `Retry-After` |
//! | 422    | `https://idem.dev/problems/key-reused`          | key reused with a different payload   |
//! | 410    | `https://idem.dev/problems/key-expired`         | the key's record expired and its tombstone remains ([`IdempotencyLayer::tombstone_ttl`], SPEC S16); members `completed_at` and `completed_status`; not executed again |
//! | 500    | `https://idem.dev/problems/handler-failed`      | the handler panicked or failed (recorded) |
//! | 500    | `https://idem.dev/problems/response-too-large`  | the handler ran; its answer is over the response limit (recorded) |
//! | 503    | `https://idem.dev/problems/store-unavailable`   | store unreachable; `Retry-After`      |
//! | 503    | `https://idem.dev/problems/replay-unavailable`  | the answer, recorded as a [`ResourceReference`], could not be rendered again; the operation ran; `Retry-After` |
//! | 500    | `https://idem.dev/problems/replay-unavailable`  | the recorded answer is sealed and cannot be opened (`idem_core::Sealed`: a key id the ring lacks, changed bytes); the operation ran and is not executed again; no `Retry-After` |
//! | 502    | `https://idem.dev/problems/upstream-unreachable` | a proxy inside the layer could not connect to its upstream, or set up TLS with it ([`ForwardError`]); nothing was sent, the key is released |
//! | 504    | `https://idem.dev/problems/upstream-timeout`    | the upstream's answer did not come whole in time; the record stays in progress until its lease lapses |
//! | 504    | `https://idem.dev/problems/upstream-connection-lost` | the upstream's connection broke after the request was sent; the record stays in progress until its lease lapses |
//! | 502    | `https://idem.dev/problems/upstream-answer-too-large` | the upstream ran; its answer is over the response limit (recorded) |
//!
//! The 400s for the key, the 413 and the 408 are answered before the body is read
//! whole. What is left of it is read away in the background ([`drain_body`]: up to
//! [`DRAIN_LIMIT`], 4 MiB, within [`DRAIN_TIMEOUT`], 5 s, then the connection closes), so
//! a client that sends its whole body before it reads gets the answer, not a reset.
//!
//! # Limits of this version
//!
//! - The response future is boxed (one allocation per request; a keyed request's
//!   execution is a second one).
//! - A keyed request's response to be recorded is buffered whole, up to
//!   [`IdempotencyLayer::response_limit`] ([`DEFAULT_RESPONSE_LIMIT`], 8 MiB). A larger
//!   answer comes from a handler that has run, so it is replaced, for the first caller
//!   and every retry alike, by a recorded 500 `response-too-large` problem: the operation
//!   never runs twice, but its answer is lost. Raise the limit above your largest
//!   answer, or record a reference to the resource instead (SPEC S6: a
//!   [`ResourceReference`] extension, rendered again at replay by a renderer of yours,
//!   [`IdempotencyLayer::render_references_with`], or by the wrapped service where it
//!   routes a `GET` by path, [`IdempotencyLayer::render_references`]). A response the
//!   layer releases (by status or disposition), or records as a reference, is known
//!   from its head and streams through unread, at any size.

mod body;
mod body_key;
mod bounds;
mod buckets;
mod coding;
mod conclude;
mod config;
mod context;
mod detach;
mod disposition;
mod drain;
mod earlier;
mod execute;
mod fingerprint;
mod forward;
mod future;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod grpc;
mod handled;
mod heartbeat;
mod hints;
mod in_flight;
mod keyed;
mod late;
mod layer;
mod look_alike;
pub mod mcp;
mod method_override;
mod observer;
mod operation_state;
mod plan;
mod principal;
mod problem;
mod profile;
mod publish;
mod replay;
mod scope;
mod service;
mod settle;
mod shared;
mod sources;
mod tenant;
mod tenant_limit;
mod wait;

pub use body::IdempotencyBody;
pub use config::{
    DEFAULT_HEADER_NAME, DEFAULT_RELEASE_STATUSES, DEFAULT_RESPONSE_LIMIT, DEFAULT_STORED_HEADERS,
    NEVER_STORED_HEADERS, ReleaseStatuses, RouteConfig, is_storable_header,
};
pub use context::IdempotencyContext;
pub use disposition::{Disposition, Proxied, ResourceReference, UpstreamFailure};
pub use drain::{DRAIN_LIMIT, DRAIN_TIMEOUT, drain_body};
pub use forward::ForwardError;
pub use future::ResponseFuture;
pub use grpc::{
    DEFAULT_GRPC_RELEASE_CODES, GRPC_CODE_NAMES, GRPC_RETRY_PUSHBACK, GRPC_STATUS_FIELDS,
    GrpcReleaseCodes, code_name as grpc_code_name, is_grpc,
};
pub use handled::Handled;
pub use hints::{STRIPE_SHOULD_RETRY, X_SHOULD_RETRY};
/// The dialect of the layer's own answers (see the guide's profiles table).
///
/// | situation | `ietf` (default) | `stripe` | `acp` | `ucp` |
/// |---|---|---|---|---|
/// | key reused with another payload | 422 | 400 `idempotency_error` | 422 `idempotency_conflict` | 409 `idempotency_conflict` |
/// | request still in progress | 409 | 409 `idempotency_error` (`idempotency_key_in_use`) | 409 `idempotency_in_flight` | 409 `idempotency_in_flight` |
/// | key missing where required | 400 | 400 `invalid_request_error` | 400 `idempotency_key_required` | 400 `idempotency_key_required` |
/// | key malformed | 400 | 400 `invalid_request_error` | 400 `idempotency_key_invalid` | 400 `idempotency_key_invalid` |
/// | key expired (tombstone) | 410 | 400 `idempotency_error` | 422 `idempotency_key_expired` | 409 `idempotency_key_expired` |
/// | body | `application/problem+json` | `{"error": {"type", "code"?, "message", "doc_url"}}` | `{"type", "code", "message"}` | `{"code", "content"}` |
/// | operation state in a problem | member `operation_state` | `error.operation_state` | member `operation_state` | member `operation_state` |
/// | an upstream 5xx (but 503) | recorded | recorded | released | recorded |
///
/// Every other answer of the layer (a store outage, a body too large, …) keeps its
/// status and is written in the profile's body shape. Every answer to a keyed request
/// carries [`IDEMPOTENCY_OPERATION_STATE`] under every profile. A profile's 5xx rule
/// is the default of the statuses that release the key
/// ([`ReleaseStatuses::of_profile`]); a set given to the layer or a route replaces it.
/// Replays carry `Idempotent-Replayed: true` under every profile (or the name
/// [`IdempotencyLayer::replay_header`] gives it); under `acp` every answer to a keyed
/// request also echoes its `Idempotency-Key` as the client spelt it and publishes the
/// record's lifetime in [`RETENTION_HEADER`].
pub use idem_core::Profile;
pub use idem_core::UnknownProfile;
pub use in_flight::InFlight;
pub use layer::IdempotencyLayer;
pub use method_override::DEFAULT_METHOD_OVERRIDE_HEADERS;
pub use observer::{Observer, Outcome};
pub use operation_state::{IDEMPOTENCY_OPERATION_STATE, OperationState};
pub use principal::Principal;
pub use problem::{PROBLEM_CONTENT_TYPE, Problem, ProblemKind, STORE_UNAVAILABLE_RETRY_AFTER};
pub use publish::{HeaderChoice, LAYER_HEADERS, RETENTION_HEADER, replay_marker};
pub use replay::IDEMPOTENT_REPLAYED;
pub use service::Idempotency;
pub use sources::{Credential, CredentialError, TenantSources, Verified};
pub use tenant::TenantHeaders;
pub use tenant_limit::{MIN_TENANT_PREFIX, TenantNameError, TenantOverride, check_tenant_name};
pub use wait::{DEFAULT_MAX_WAIT, DEFAULT_MAX_WAITERS, PREFERENCE_APPLIED};

/// The error type the layer's bounds convert inner errors into.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
