//! The client against the real `IdempotencyLayer` (idem-tower) over a `MemoryStore`,
//! on 127.0.0.1, with faults injected between them.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_client::{Client, Error, KeyDeriver, ManualSleeper, RetryPolicy, Sleep};
use idem_core::{ManualClock, SystemClock};
use idem_test_support::{Fault, Relay};
use support::ChargeApp;
use tokio::sync::{Semaphore, watch};

fn client_with(sleeper: impl Sleep) -> Client {
    Client::builder()
        .policy(RetryPolicy::default().max_attempts(4))
        .sleeper(sleeper)
        .seed(3)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_lost_after_execution_is_retried_and_replayed_handler_ran_once() {
    let app = ChargeApp::start(false, Arc::new(SystemClock), Duration::from_secs(60)).await;
    let proxy = Relay::start(app.addr).await;
    proxy.fault_next([Fault::LoseReply]);
    let sleeper = ManualSleeper::new(ManualClock::starting_now());
    let client = client_with(sleeper.clone());
    let op = client
        .post(proxy.http_url("/v1/charges"))
        .json(&serde_json::json!({"amount": 1000}));

    let outcome = op.send().await.unwrap();

    assert_eq!(app.runs(), 1, "the handler ran once");
    assert_eq!(
        proxy.connections(),
        2,
        "the first connection was cut after the server answered"
    );
    assert_eq!(outcome.status(), 201);
    assert!(outcome.replayed(), "the retry got the recorded answer");
    assert_eq!(outcome.attempts(), 2);
    assert_eq!(outcome.key(), op.key());
    let body: serde_json::Value = outcome.json().unwrap();
    assert_eq!(body, serde_json::json!({"execution": 1, "amount": 1000}));
    assert_eq!(sleeper.delays().len(), 1);
}

/// Records the wait, lets the first attempt's handler finish, and returns once that
/// attempt has its answer: the retry then finds the record completed.
#[derive(Debug, Clone)]
struct FinishFirstThenWake {
    delays: Arc<Mutex<Vec<Duration>>>,
    gate: Arc<Semaphore>,
    first_done: watch::Receiver<bool>,
}

#[async_trait]
impl Sleep for FinishFirstThenWake {
    async fn sleep(&self, delay: Duration) {
        self.delays.lock().unwrap().push(delay);
        self.gate.add_permits(1);
        let mut done = self.first_done.clone();
        done.wait_for(|d| *d).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_while_the_first_attempt_runs_then_replay() {
    // The store's clock stands still, so the 409's Retry-After is one second: the first
    // attempt has only just begun (the lease, 30 s, is only the upper bound).
    let store_clock = ManualClock::starting_now();
    let app = ChargeApp::start(true, Arc::new(store_clock), Duration::from_secs(30)).await;
    let (done_tx, done_rx) = watch::channel(false);
    let sleeper = FinishFirstThenWake {
        delays: Arc::default(),
        gate: app.gate(),
        first_done: done_rx,
    };
    let client = client_with(sleeper.clone());
    let op = client
        .post(app.url())
        .json(&serde_json::json!({"amount": 250}));

    let first = tokio::spawn({
        let op = op.clone();
        async move {
            let outcome = op.send().await;
            done_tx.send(true).unwrap();
            outcome
        }
    });
    app.wait_started(1).await;
    // The same operation again while the first attempt holds the key.
    let second = op.send().await.unwrap();
    let first = first.await.unwrap().unwrap();

    assert_eq!(app.runs(), 1);
    assert_eq!(first.status(), 201);
    assert!(!first.replayed());
    assert_eq!(first.attempts(), 1);
    assert_eq!(second.status(), 201);
    assert!(second.replayed());
    assert_eq!(second.attempts(), 2, "409, then the replay");
    assert_eq!(
        *sleeper.delays.lock().unwrap(),
        [Duration::from_secs(1)],
        "waited the server's Retry-After"
    );
    assert_eq!(first.body(), second.body());
}

#[tokio::test]
async fn reused_key_with_another_payload_is_key_reused_with_zero_retries() {
    let app = ChargeApp::start(false, Arc::new(SystemClock), Duration::from_secs(60)).await;
    let sleeper = ManualSleeper::new(ManualClock::starting_now());
    let client = client_with(sleeper.clone());
    let first = client
        .post(app.url())
        .json(&serde_json::json!({"amount": 100}));
    first.send().await.unwrap();

    // Deliberate effort: the only way to reuse a key is to say so.
    let err = client
        .post(app.url())
        .with_key(first.key().clone())
        .json(&serde_json::json!({"amount": 999}))
        .send()
        .await
        .unwrap_err();

    let Error::KeyReused { key, answer, .. } = &err else {
        panic!("expected KeyReused, got {err:?}");
    };
    assert_eq!(key, first.key());
    assert_eq!(answer.status(), 422);
    assert_eq!(err.attempts(), 1);
    assert!(sleeper.delays().is_empty());
    assert_eq!(app.runs(), 1);
}

#[tokio::test]
async fn derived_key_lets_a_restarted_caller_find_the_first_answer() {
    let app = ChargeApp::start(false, Arc::new(SystemClock), Duration::from_secs(60)).await;
    let deriver = KeyDeriver::new(b"test secret, 32 bytes long......".to_vec());
    let order = serde_json::json!({"amount": 4200});

    // Two clients, as two processes would be, derive the key from the order number.
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let client = client_with(ManualSleeper::new(ManualClock::starting_now()));
        let op = client
            .post(app.url())
            .with_key(deriver.derive("charge", b"order-2024-0042"))
            .json(&order);
        outcomes.push(op.send().await.unwrap());
    }

    assert_eq!(app.runs(), 1);
    assert!(!outcomes[0].replayed());
    assert!(outcomes[1].replayed());
    assert_eq!(outcomes[0].key(), outcomes[1].key());
    assert_eq!(outcomes[0].body(), outcomes[1].body());
}
