//! The store contract suite (SPEC S10), and the scopes and fingerprints its cases use.
//!
//! A store crate runs the whole suite with one macro call in an integration test:
//!
//! ```ignore
//! idem_core::store_contract_tests!(|clock: idem_core::ManualClock, _ns: String| async move {
//!     Some(idem_core::MemoryStore::with_clock(std::sync::Arc::new(clock)))
//! });
//! ```
//!
//! The macro expands to one `#[tokio::test]` per contract case, named after the case,
//! so the test output lists every case for every store. The factory receives the
//! case's [`ManualClock`](crate::ManualClock) (the store must read time from it) and a namespace unique to
//! the case (a table prefix, key prefix or file name), so that cases running in
//! parallel against one shared server never see each other's records. A factory
//! returns `None` to skip when its service is unreachable (the workspace's
//! `idem-test-support` crate says so loudly, and fails under `IDEM_REQUIRE_SERVICES=1`).
//!
//! The cases live in [`cases`], one file per concern; each takes the store and the
//! clock it reads.

pub mod cases;
mod fixtures;

pub use fixtures::{scope_of, test_fingerprint, test_scope, unique_namespace};
#[cfg(feature = "seal")]
pub mod legacy;
#[cfg(feature = "seal")]
pub mod sealing;

/// Runs every contract case as its own `#[tokio::test]`. See the [module docs](self).
#[macro_export]
macro_rules! store_contract_tests {
    ($factory:expr) => {
        $crate::store_contract_tests!(@cases $factory;
            concurrent_reservers_exactly_one_wins,
            concurrent_takeover_exactly_one_wins,
            replays_completed_response,
            large_binary_body_round_trips,
            referenced_answer_round_trips,
            response_metadata_round_trips,
            in_progress_ambiguity_is_kept_with_the_record,
            mismatched_payload_is_rejected,
            live_lease_is_in_progress_with_retry_after,
            expired_lease_is_taken_over_as_next_attempt,
            stale_token_cannot_complete_renew_or_release,
            renew_extends_the_lease,
            complete_is_idempotent_for_the_same_lease,
            release_lets_the_key_execute_again,
            expired_record_counts_as_absent,
            completed_record_expires_at_its_ttl_though_the_lease_is_longer,
            purge_removes_only_expired_in_bounded_batches,
            scopes_never_collide,
            get_and_remove_show_and_delete_records,
            secret_is_stored_once_and_never_purged,
            rate_buckets_give_their_burst_then_their_rate,
            tombstone_refuses_a_retry_after_expiry,
            a_lapsed_tombstone_counts_as_absent,
            removing_a_tombstone_lets_the_key_execute_again,
            watch_fires_when_the_record_completes,
            watch_fires_when_the_record_is_released,
            watch_fires_when_the_record_is_removed,
            watch_fires_for_its_own_scope_only,
            list_filters_by_state_age_and_ambiguity,
            list_pages_return_each_record_exactly_once,
            list_limit_is_bounded
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let clock = $crate::ManualClock::starting_now();
                let ns = $crate::testing::unique_namespace(stringify!($case));
                let factory = $factory;
                let Some(store) = factory(clock.clone(), ns).await else {
                    return;
                };
                $crate::testing::cases::$case(store, clock).await;
            }
        )*
    };
}
