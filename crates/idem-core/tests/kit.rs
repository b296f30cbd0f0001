//! The store contract kit catches a store that breaks an invariant, and says which: a
//! memory store that overwrites a reservation in progress instead of inserting only if
//! absent (an upsert where insert-if-absent was due) fails the race case with SPEC S10's
//! invariant named, and still passes the cases it does not break.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::testing::{CASES, Case, Violation};
use idem_core::{
    Ambiguity, Lease, ListPage, ListQuery, ManualClock, MemoryStore, Record, RecordState,
    Reservation, ReserveRequest, Result, Scope, Store, StoredResponse,
};
use tokio::sync::Mutex;

/// A memory store whose `reserve` replaces a record in progress: every reserver of a
/// busy key wins, as a `REPLACE` where an insert-if-absent was due would let it. Its
/// lock makes each replacement one step, so that every one of them wins, and the
/// failure's text is the same on every run.
struct Overwriting(MemoryStore, Mutex<()>);

#[async_trait]
impl Store for Overwriting {
    async fn reserve(&self, request: &ReserveRequest) -> Result<Reservation> {
        let _one_at_a_time = self.1.lock().await;
        if let Some(record) = self.0.get(&request.scope).await?
            && matches!(record.state, RecordState::InProgress { .. })
        {
            self.0.remove(&request.scope).await?;
        }
        self.0.reserve(request).await
    }
    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<()> {
        self.0.complete(lease, response).await
    }
    async fn renew(&self, lease: &Lease, lease_for: Duration) -> Result<()> {
        self.0.renew(lease, lease_for).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.0.release(lease).await
    }
    async fn mark_ambiguous(&self, lease: &Lease, reason: Ambiguity) -> Result<()> {
        self.0.mark_ambiguous(lease, reason).await
    }
    async fn get(&self, scope: &Scope) -> Result<Option<Record>> {
        self.0.get(scope).await
    }
    async fn remove(&self, scope: &Scope) -> Result<bool> {
        self.0.remove(scope).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize> {
        self.0.purge_expired(limit).await
    }
    async fn ping(&self) -> Result<()> {
        self.0.ping().await
    }
    async fn init_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>> {
        self.0.init_secret(name, candidate).await
    }
    async fn list(&self, query: &ListQuery) -> Result<ListPage> {
        self.0.list(query).await
    }
}

fn overwriting(clock: &ManualClock) -> Overwriting {
    Overwriting(
        MemoryStore::with_clock(Arc::new(clock.clone())),
        Mutex::new(()),
    )
}

fn case(name: &str) -> Case {
    Case::named(name).unwrap_or_else(|| panic!("the kit has no case {name}"))
}

const RACE: &str = "concurrent_reservers_exactly_one_wins";

const RACE_BROKEN: &str = "S10 insert-if-absent: 64 of 64 concurrent reservations of one scope \
     won; exactly one may [store contract case `concurrent_reservers_exactly_one_wins`]";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_overwrites_a_reservation_fails_naming_insert_if_absent() {
    let clock = ManualClock::starting_now();
    let violation: Violation = case(RACE)
        .run(overwriting(&clock), clock)
        .await
        .expect_err("the kit must catch a store where every reserver wins");
    assert_eq!(violation.case, case(RACE));
    assert_eq!(violation.to_string(), RACE_BROKEN);
}

/// What a `#[test]` made by `store_contract_tests!` does: panic with the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_check_a_test_runs_panics_with_the_violation() {
    let clock = ManualClock::starting_now();
    let store = overwriting(&clock);
    let panic = tokio::spawn(case(RACE).check(store, clock))
        .await
        .expect_err("the check must panic");
    let payload = panic.into_panic();
    let message = payload
        .downcast_ref::<String>()
        .expect("the panic carries the violation's text");
    assert_eq!(message, RACE_BROKEN);
}

/// The same broken store passes what it does not break, and fails the other cases that
/// meet a second reserver of a busy key, each naming its own invariant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_case_names_its_own_invariant() {
    let clock = ManualClock::starting_now();
    case("replays_completed_response")
        .run(overwriting(&clock), clock)
        .await
        .expect("a replay is not broken");

    let clock = ManualClock::starting_now();
    let violation = case("live_lease_is_in_progress_with_retry_after")
        .run(overwriting(&clock), clock)
        .await
        .expect_err("a live lease is overwritten");
    let text = violation.to_string();
    assert!(
        text.starts_with("S5 in progress while the lease lives: ") && text.contains("Acquired"),
        "{text}"
    );
}

/// A well-behaved store passes every case through the function runner too, the way a
/// harness of one's own would call the kit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_memory_store_passes_every_case_run_by_name() {
    for case in CASES {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        if let Err(violation) = case.run(store, clock).await {
            panic!("{violation}");
        }
    }
}
