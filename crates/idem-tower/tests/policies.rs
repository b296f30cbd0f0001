//! SPEC S23 in the layer: a profile's rule for a 5xx (released
//! under `acp`, recorded otherwise, a set given to the layer replacing it) and the
//! operation's state on every keyed answer. Every test runs against the memory store
//! and the SQLite store.

mod support;

use std::time::Duration;

use idem_core::{Reservation, Store};
use idem_tower::{IDEMPOTENCY_OPERATION_STATE, Profile};
use support::{App, Counters, StoreKind};

const ORDER: &str = r#"{"sku":"tea","qty":2,"amount":100}"#;

macro_rules! for_each_store {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::StoreKind::Memory).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::StoreKind::Sqlite).await
                }
            )*
        }
    };
}

for_each_store!(
    acp_releases_a_5xx_so_the_retry_executes,
    the_other_profiles_record_a_5xx,
    a_release_list_given_replaces_the_profiles,
    an_answer_released_on_a_takeover_is_unknown,
    a_reused_key_says_the_state_of_the_operation_it_holds,
);

fn state(reply: &support::Reply) -> &str {
    reply
        .header(IDEMPOTENCY_OPERATION_STATE.as_str())
        .expect("every keyed answer says where the operation stands")
}

async fn acp_releases_a_5xx_so_the_retry_executes(kind: StoreKind) {
    let app = App::start_with(kind, |l| l.profile(Profile::Acp)).await;
    let body = r#"{"status":500}"#;
    for executions in 1..=2 {
        let failed = app.post("/status").key("k-acp-500").json(body).send().await;
        assert_eq!(failed.status, 500);
        assert!(!failed.is_replay());
        assert_eq!(state(&failed), "unknown", "the upstream may have acted");
        assert_eq!(Counters::get(&app.counters.statuses), executions);
    }
    assert!(!app.has_record("/status", "k-acp-500").await, "released");
}

async fn the_other_profiles_record_a_5xx(kind: StoreKind) {
    for profile in [Profile::Ietf, Profile::Stripe, Profile::Ucp] {
        let app = App::start_with(kind, |l| l.profile(profile)).await;
        let body = r#"{"status":500}"#;
        let first = app.post("/status").key("k-500").json(body).send().await;
        assert_eq!(first.status, 500);
        assert_eq!(state(&first), "completed");
        let retry = app.post("/status").key("k-500").json(body).send().await;
        assert!(retry.is_replay(), "{profile}");
        assert_eq!(state(&retry), "completed");
        assert_eq!(Counters::get(&app.counters.statuses), 1, "{profile}");
    }
}

async fn a_release_list_given_replaces_the_profiles(kind: StoreKind) {
    let app = App::start_with(kind, |l| {
        l.profile(Profile::Acp)
            .release_statuses([http::StatusCode::CONFLICT])
    })
    .await;
    let body = r#"{"status":500}"#;
    app.post("/status").key("k-given").json(body).send().await;
    let retry = app.post("/status").key("k-given").json(body).send().await;
    assert!(retry.is_replay(), "the layer's set wins over acp's");
    assert_eq!(Counters::get(&app.counters.statuses), 1);
}

async fn an_answer_released_on_a_takeover_is_unknown(kind: StoreKind) {
    let app = App::start(kind).await;
    let body = r#"{"status":503}"#;
    let lease_for = Duration::from_secs(60);
    let request = support::reserve_request("/status", "k-taken", body, lease_for);
    let Reservation::Acquired(_dead) = app.store.reserve(&request).await.unwrap() else {
        panic!("reserved");
    };
    let busy = app.post("/status").key("k-taken").json(body).send().await;
    assert_eq!(busy.status, 409);
    assert_eq!(state(&busy), "in_progress");
    assert_eq!(busy.json()["operation_state"], "in_progress");
    app.clock.advance(lease_for + Duration::from_millis(1));
    let taken = app.post("/status").key("k-taken").json(body).send().await;
    assert_eq!(taken.status, 503);
    assert_eq!(state(&taken), "unknown", "the dead attempt may have acted");
    assert_eq!(Counters::get(&app.counters.statuses), 1);
    let fresh = app.post("/status").key("k-fresh").json(body).send().await;
    assert_eq!(fresh.status, 503);
    assert_eq!(state(&fresh), "not_started", "S6's 503 on a first attempt");
}

async fn a_reused_key_says_the_state_of_the_operation_it_holds(kind: StoreKind) {
    let app = App::start(kind).await;
    let request = support::reserve_request("/orders", "k-held", ORDER, Duration::from_secs(60));
    let Reservation::Acquired(_running) = app.store.reserve(&request).await.unwrap() else {
        panic!("reserved");
    };
    let other = r#"{"sku":"coffee"}"#;
    let reused = app.post("/orders").key("k-held").json(other).send().await;
    let body = reused.assert_problem(422, "key-reused");
    assert_eq!(body["operation_state"], "in_progress");
    assert_eq!(state(&reused), "in_progress");

    let first = app.post("/orders").key("k-done").json(ORDER).send().await;
    assert_eq!(first.status, 201);
    assert_eq!(state(&first), "completed");
    let reused = app.post("/orders").key("k-done").json(other).send().await;
    assert_eq!(
        reused.assert_problem(422, "key-reused")["operation_state"],
        "completed"
    );
    assert_eq!(state(&reused), "completed");

    let missing = app.post("/orders").json(ORDER).send().await;
    assert_eq!(
        missing.status, 201,
        "no key on an optional route passes through"
    );
    assert!(
        missing
            .header(IDEMPOTENCY_OPERATION_STATE.as_str())
            .is_none()
    );
}
