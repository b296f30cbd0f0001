//! The contract cases, one file per concern. Each takes a store reading time from the
//! clock it is given, and panics when the store breaks the invariant it checks.
//!
//! Each is listed, with the SPEC section and the invariant it checks, in
//! [`CASES`](super::CASES). Run them through the
//! [`store_contract_tests!`](crate::store_contract_tests) macro or [`Case::run`](super::Case::run),
//! whose failure names that section and invariant; called directly, a case that fails
//! panics with its own message only.

use std::time::Duration;

use super::fixtures::{test_fingerprint, test_scope};
use crate::{
    Lease, ManualClock, Reservation, ReserveRequest, Scope, Store, StoreError, StoredResponse,
};

mod expiry;
mod lease;
mod list;
pub(crate) mod meta;
mod race;
mod records;
mod replay;
mod tombstone;
mod watch;

pub use expiry::{
    completed_record_expires_at_its_ttl_though_the_lease_is_longer,
    expired_record_counts_as_absent, purge_removes_only_expired_in_bounded_batches,
};
pub use lease::{
    expired_lease_is_taken_over_as_next_attempt, live_lease_is_in_progress_with_retry_after,
    release_lets_the_key_execute_again, renew_extends_the_lease,
    stale_token_cannot_complete_renew_or_release,
};
pub use list::{
    list_filters_by_state_age_and_ambiguity, list_limit_is_bounded,
    list_pages_return_each_record_exactly_once,
};
pub use meta::{in_progress_ambiguity_is_kept_with_the_record, response_metadata_round_trips};
pub use race::{concurrent_reservers_exactly_one_wins, concurrent_takeover_exactly_one_wins};
pub use records::{
    get_and_remove_show_and_delete_records, rate_buckets_give_their_burst_then_their_rate,
    scopes_never_collide, secret_is_stored_once_and_never_purged,
};
pub use replay::{
    complete_is_idempotent_for_the_same_lease, large_binary_body_round_trips,
    mismatched_payload_is_rejected, referenced_answer_round_trips, replays_completed_response,
};
pub use tombstone::{
    a_lapsed_tombstone_counts_as_absent, removing_a_tombstone_lets_the_key_execute_again,
    tombstone_refuses_a_retry_after_expiry,
};
pub use watch::{
    watch_fires_for_its_own_scope_only, watch_fires_when_the_record_completes,
    watch_fires_when_the_record_is_released, watch_fires_when_the_record_is_removed,
};

const LEASE: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(24 * 3600);

fn request(scope: &Scope, body: &str) -> ReserveRequest {
    ReserveRequest::new(scope.clone(), test_fingerprint(body))
        .ttl(TTL)
        .lease(LEASE)
}

async fn acquire<S: Store>(store: &S, req: &ReserveRequest) -> Lease {
    match store.reserve(req).await.expect("reserve") {
        Reservation::Acquired(lease) => lease,
        other => panic!("expected to acquire {:?}, got {other:?}", req.scope),
    }
}

fn response() -> StoredResponse {
    StoredResponse::new(201, r#"{"id":"ch_1"}"#)
        .with_header("content-type", "application/json")
        .with_header("location", "/v1/charges/ch_1")
}

fn assert_fenced(result: crate::Result<()>, what: &str) {
    match result {
        Err(StoreError::Fenced) => {}
        other => panic!("{what} with a stale token must fail Fenced, got {other:?}"),
    }
}
