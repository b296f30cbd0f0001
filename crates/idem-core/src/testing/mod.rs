//! The store contract kit (SPEC S10): the cases every store passes, for anyone to run
//! against their own store (a DynamoDB, a Spanner, an in-house database) exactly as
//! idem's own stores run them.
//!
//! # Running it
//!
//! Add `idem-core` with the `testing` feature, and tokio's test macro, as
//! dev-dependencies of the store's crate:
//!
//! ```toml
//! [dev-dependencies]
//! idem-core = { version = "0.1", features = ["testing"] }
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```
//!
//! and call [`store_contract_tests!`](crate::store_contract_tests) once, in an
//! integration test (`tests/contract.rs`), with a factory:
//!
//! ```ignore
//! idem_core::store_contract_tests!(|clock: idem_core::ManualClock, ns: String| async move {
//!     Some(MyStore::for_tests(std::sync::Arc::new(clock), &ns).await)
//! });
//! ```
//!
//! The macro expands to one `#[tokio::test]` per case of [`CASES`], named after it, so
//! the test output lists every case. The guide's page "Write a store" builds a small
//! store and runs the kit against it, start to end.
//!
//! # What the factory provides
//!
//! The factory is called once per case, with two arguments, and returns a future of
//! `Option<S>` where `S: Store`:
//!
//! - **A fresh store per case.** Each case gets its own store, or its own namespace on a
//!   shared server: the second argument, from [`unique_namespace`], is unique to the case
//!   and the process (lower-case ASCII letters, digits and `_`, at most 40 characters),
//!   for a table name, a key prefix or a file name. Cases run in parallel; none may see
//!   another's records. A case never assumes the server is empty.
//! - **A clock.** The first argument is the case's [`ManualClock`](crate::ManualClock).
//!   The store must read the current time from it and from nothing else (not the
//!   server's `NOW()`, not the system clock): the cases advance it to make leases lapse
//!   and records expire without sleeping. A store whose server keeps time itself (native
//!   TTLs) must take the clock's time as a parameter of its statements.
//! - **`None` to skip.** A factory whose server cannot be reached returns `None`, and
//!   the case passes without running. Say so loudly (idem's own tests print a line, and
//!   fail instead when `IDEM_REQUIRE_SERVICES=1`): a skipped contract proves nothing.
//!
//! # How the cases run
//!
//! Each case runs on a multi-threaded tokio runtime with four workers. The concurrency
//! cases ([`cases::concurrent_reservers_exactly_one_wins`],
//! [`cases::concurrent_takeover_exactly_one_wins`],
//! [`cases::secret_is_stored_once_and_never_purged`],
//! [`cases::rate_buckets_give_their_burst_then_their_rate`]) put the store in an `Arc`
//! and spawn 12 to 64 tasks that call it at once, released together by a barrier, so a
//! store's atomicity is tested with real parallel calls (a pool of connections to a real
//! server, for a networked store). A case that waits for a watch gives up after ten
//! seconds rather than hang.
//!
//! # What a failure says
//!
//! A store that breaks an invariant fails the case with a [`Violation`], which names the
//! SPEC section and the invariant first, then what the store did, then the case:
//!
//! ```text
//! S10 insert-if-absent: 64 of 64 concurrent reservations of one scope won; exactly one may [store contract case `concurrent_reservers_exactly_one_wins`]
//! ```
//!
//! [`Case::run`] returns it as an error, for a harness of one's own; [`Case::check`]
//! (what the macro's tests call) panics with it. An unexpected store error (the server
//! went away mid-case) fails the case the same way, with the error in the message.
//!
//! # What it cannot check
//!
//! The kit calls one store value from one process. It does not check that records
//! survive a restart or a crash (durability), that two processes sharing a server see
//! one another's records, that a write is atomic when the connection breaks half way,
//! how the store behaves when its server is slow, partitioned or down, or how fast it
//! is. Each of idem's stores tests those itself, beside the kit.
//!
//! # Versioning
//!
//! The kit is public API of `idem-core`, under the same semantic versioning: the macro,
//! [`Case`], [`CASES`], [`Violation`], the case functions in [`cases`] and the fixtures
//! below keep their names and signatures within a major version (0.x: a minor version).
//! A release may add cases, which hold a store to a part of the contract the kit did not
//! check before; the changelog names them. A case is never loosened in a patch release.
//!
//! The cases live in [`cases`], one file per concern; each takes the store and the
//! clock it reads.

pub mod cases;
mod catalogue;
mod fixtures;

pub use catalogue::{CASES, Case, Violation};
pub use fixtures::{scope_of, test_fingerprint, test_scope, unique_namespace};
#[cfg(feature = "seal")]
pub mod legacy;
#[cfg(feature = "seal")]
pub mod sealing;

/// Runs every case of the store contract kit ([`CASES`]) as its own `#[tokio::test]`,
/// against the stores `$factory` makes. See the [module docs](self) for what the factory
/// must provide.
#[macro_export]
macro_rules! store_contract_tests {
    (@with [@table] $($case:ident = $section:literal, $invariant:literal;)*) => {
        /// Every case of the kit, in the order the
        /// [`store_contract_tests!`](crate::store_contract_tests) macro runs them.
        pub const CASES: &[Case] = &[$(
            Case { name: stringify!($case), section: $section, invariant: $invariant },
        )*];

        /// Runs the case `name`; `false` when the kit has none of that name.
        async fn dispatch<S: $crate::Store>(name: &str, store: S, clock: $crate::ManualClock) -> bool {
            match name {
                $(stringify!($case) => $crate::testing::cases::$case(store, clock).await,)*
                _ => return false,
            }
            true
        }
    };
    (@with [@tests $factory:expr] $($case:ident = $section:literal, $invariant:literal;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let clock = $crate::ManualClock::starting_now();
                let ns = $crate::testing::unique_namespace(stringify!($case));
                let factory = $factory;
                let Some(store) = factory(clock.clone(), ns).await else {
                    return;
                };
                $crate::testing::Case::named(stringify!($case))
                    .expect("a case of the kit")
                    .check(store, clock)
                    .await;
            }
        )*
    };
    ($factory:expr) => {
        $crate::__store_contract_catalogue!(@tests $factory);
    };
}

/// The one list of the kit's cases, each with the SPEC section and the invariant it
/// checks, handed to [`store_contract_tests!`](crate::store_contract_tests), which makes
/// [`CASES`] and the tests from it. Not API: call `store_contract_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_contract_catalogue {
    ($($then:tt)*) => {
        $crate::store_contract_tests! { @with [$($then)*]
            concurrent_reservers_exactly_one_wins = "S10", "insert-if-absent";
            concurrent_takeover_exactly_one_wins = "S7", "one takeover of a lapsed lease";
            replays_completed_response = "S5", "replay of a completed record";
            large_binary_body_round_trips = "S6", "answers kept byte for byte";
            referenced_answer_round_trips = "S6", "answers recorded as a reference";
            response_metadata_round_trips = "S6", "answer metadata kept";
            in_progress_ambiguity_is_kept_with_the_record = "S7", "the reason an attempt stays in progress";
            mismatched_payload_is_rejected = "S5", "fingerprint mismatch";
            live_lease_is_in_progress_with_retry_after = "S5", "in progress while the lease lives";
            expired_lease_is_taken_over_as_next_attempt = "S7", "takeover as attempt n+1";
            stale_token_cannot_complete_renew_or_release = "S7", "fencing";
            renew_extends_the_lease = "S7", "lease renewal";
            complete_is_idempotent_for_the_same_lease = "S9", "completing twice keeps the first answer";
            release_lets_the_key_execute_again = "S6", "release";
            expired_record_counts_as_absent = "S8", "expiry";
            completed_record_expires_at_its_ttl_though_the_lease_is_longer = "S8", "TTL counted from creation";
            purge_removes_only_expired_in_bounded_batches = "S8", "bounded purge";
            scopes_never_collide = "S3", "scope isolation";
            get_and_remove_show_and_delete_records = "S10", "inspection and removal";
            secret_is_stored_once_and_never_purged = "S3", "one tenant secret, never purged";
            rate_buckets_give_their_burst_then_their_rate = "S10", "shared rate buckets";
            tombstone_refuses_a_retry_after_expiry = "S16", "tombstone refuses a retry";
            a_lapsed_tombstone_counts_as_absent = "S16", "a lapsed tombstone is absent";
            removing_a_tombstone_lets_the_key_execute_again = "S16", "removing a tombstone";
            watch_fires_when_the_record_completes = "S15", "waiters hear a completion";
            watch_fires_when_the_record_is_released = "S15", "waiters hear a release";
            watch_fires_when_the_record_is_removed = "S15", "waiters hear a removal";
            watch_fires_for_its_own_scope_only = "S15", "waiters hear their own scope only";
            list_filters_by_state_age_and_ambiguity = "S10", "listing filters";
            list_pages_return_each_record_exactly_once = "S10", "listing pages";
            list_limit_is_bounded = "S10", "listing bounded";
        }
    };
}
