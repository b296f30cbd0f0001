//! Retry classification, waits, limits and the budget, against a scripted server on
//! 127.0.0.1. Waits go through a `ManualSleeper`, so each test asserts the exact waits
//! requested and none of them sleeps.

use std::sync::Arc;
use std::time::Duration;

use idem_client::{
    Client, Error, Failure, GiveUp, ManualSleeper, RetryBudget, RetryPolicy, http_date,
};
use idem_core::{Clock, ManualClock, Timestamp};
use idem_test_support::upstream::{Reply, Upstream};
use idem_test_support::{Fault, Relay};

/// A client on a manual clock standing at a whole second (HTTP-dates have no
/// fractions), with a sleeper that records waits and moves that clock.
fn client(policy: RetryPolicy) -> (Client, ManualSleeper, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let sleeper = ManualSleeper::new(clock.clone());
    let client = Client::builder()
        .policy(policy)
        .clock(Arc::new(clock.clone()))
        .sleeper(sleeper.clone())
        .seed(1)
        .build()
        .unwrap();
    (client, sleeper, clock)
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(4)
        .base_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(2))
        .deadline(Duration::from_secs(60))
}

fn all_same_key(server: &Upstream, key: &str) {
    let keys = server.keys();
    assert!(!keys.is_empty());
    for k in keys {
        assert_eq!(
            k.as_deref(),
            Some(key),
            "every attempt carries the operation's key"
        );
    }
}

#[tokio::test]
async fn bad_gateway_and_gateway_timeout_are_retried_with_the_same_key() {
    let server = Upstream::scripted([Reply::status(502), Reply::status(504)]).await;
    let (client, sleeper, _) = client(policy());
    let op = client
        .post(server.url_for("/v1/charges"))
        .body("amount=100");

    let outcome = op.send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 3);
    assert!(!outcome.replayed());
    assert_eq!(outcome.key(), op.key());
    assert_eq!(server.total(), 3);
    all_same_key(&server, op.key().as_str());
    let delays = sleeper.delays();
    assert_eq!(delays.len(), 2);
    let p = policy();
    assert!(delays[0] <= p.backoff_ceiling(1), "{delays:?}");
    assert!(delays[1] <= p.backoff_ceiling(2), "{delays:?}");
}

#[tokio::test]
async fn conflict_then_success_waits_for_the_servers_retry_after() {
    let server = Upstream::scripted([Reply::with_header(409, "retry-after", "2")]).await;
    let (client, sleeper, _) = client(policy());
    let op = client.post(server.url_for("/v1/charges"));

    let outcome = op.send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 2);
    assert_eq!(sleeper.delays(), [Duration::from_secs(2)]);
    all_same_key(&server, op.key().as_str());
}

#[tokio::test]
async fn conflict_without_retry_after_backs_off() {
    let server = Upstream::scripted([Reply::status(409)]).await;
    let (client, sleeper, _) = client(policy());

    let outcome = client.post(server.url_for("/")).send().await.unwrap();

    assert_eq!(outcome.attempts(), 2);
    let delays = sleeper.delays();
    assert_eq!(delays.len(), 1);
    assert!(delays[0] <= policy().backoff_ceiling(1));
}

/// A 409 means another attempt holds the key and nothing ran for this one: waiting it
/// out as the server asks does not use up attempts, so a slow first attempt is waited
/// for, however many 409s that takes, within the deadline.
#[tokio::test]
async fn conflicts_after_the_first_attempt_do_not_use_up_attempts() {
    let busy = |secs: u32| Reply::with_header(409, "retry-after", secs.to_string());
    let server = Upstream::scripted([busy(1), busy(2), busy(4), busy(8), busy(16)]).await;
    let (client, sleeper, _) = client(policy().max_attempts(2));
    let op = client.post(server.url_for("/v1/charges"));

    let outcome = op.send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 6, "five 409s, then the answer");
    assert_eq!(
        sleeper.delays(),
        [1, 2, 4, 8, 16].map(Duration::from_secs),
        "each wait as the server asked"
    );
    all_same_key(&server, op.key().as_str());
    // Other failures still count: a 502 after the 409s is the second attempt.
    let server = Upstream::scripted([busy(1), busy(1), Reply::status(502)]).await;
    let err = client.post(server.url_for("/")).send().await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Exhausted {
                reason: GiveUp::MaxAttempts,
                attempts: 3,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn conflicts_are_waited_out_only_until_the_deadline() {
    let server = Upstream::scripted([]).await;
    server.set_default(Reply::with_header(409, "retry-after", "0"));
    let (client, sleeper, _) = client(policy().max_attempts(2).deadline(Duration::from_secs(5)));

    let err = client.post(server.url_for("/")).send().await.unwrap_err();

    assert!(
        matches!(&err, Error::Exhausted { reason: GiveUp::Deadline, attempts: 5, last, .. }
            if matches!(&**last, Failure::Answer(o) if o.status() == 409)),
        "{err:?}"
    );
    // `Retry-After: 0` is waited as a second, not in a hot loop.
    assert_eq!(sleeper.delays(), [Duration::from_secs(1); 4]);
}

/// The budget keeps retries from piling on a failing server; waiting out a 409 is the
/// server's own pacing and does not draw on it.
#[tokio::test]
async fn an_empty_budget_still_waits_out_a_conflict() {
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let client = Client::builder()
        .policy(policy())
        .budget(RetryBudget::default().ratio(0.0).min_retries(0))
        .clock(Arc::new(clock.clone()))
        .sleeper(ManualSleeper::new(clock))
        .build()
        .unwrap();
    let server = Upstream::scripted([Reply::with_header(409, "retry-after", "1")]).await;
    let outcome = client.post(server.url_for("/")).send().await.unwrap();
    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 2);

    let server = Upstream::scripted([Reply::status(502)]).await;
    let err = client.post(server.url_for("/")).send().await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Exhausted {
                reason: GiveUp::Budget,
                attempts: 1,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_policy_without_retries_does_not_wait_out_a_conflict() {
    let server = Upstream::scripted([Reply::with_header(409, "retry-after", "1")]).await;
    let (client, sleeper, _) = client(RetryPolicy::no_retries());

    let err = client.post(server.url_for("/")).send().await.unwrap_err();

    assert!(
        matches!(
            &err,
            Error::Exhausted {
                reason: GiveUp::MaxAttempts,
                attempts: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(sleeper.delays().is_empty());
}

#[tokio::test]
async fn too_many_requests_honours_retry_after_one_second() {
    let server = Upstream::scripted([Reply::with_header(429, "retry-after", "1")]).await;
    let (client, sleeper, _) = client(policy());

    let outcome = client.post(server.url_for("/")).send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 2);
    assert_eq!(sleeper.delays(), [Duration::from_secs(1)]);
    assert_eq!(server.total(), 2);
}

#[tokio::test]
async fn service_unavailable_honours_a_dated_retry_after() {
    let (client, sleeper, clock) = client(policy());
    let at = http_date(clock.now().plus(Duration::from_secs(3)));
    let server = Upstream::scripted([Reply::with_header(503, "retry-after", at)]).await;

    let outcome = client.post(server.url_for("/")).send().await.unwrap();

    assert_eq!(outcome.attempts(), 2);
    assert_eq!(sleeper.delays(), [Duration::from_secs(3)]);
}

#[tokio::test]
async fn key_reused_is_a_typed_error_with_zero_retries() {
    let server = Upstream::scripted([Reply::problem(
        422,
        "key-reused",
        "this key was used with a different request body",
    )])
    .await;
    let (client, sleeper, _) = client(policy());
    let op = client.post(server.url_for("/v1/charges"));

    let err = op.send().await.unwrap_err();

    let Error::KeyReused {
        key,
        detail,
        answer,
    } = &err
    else {
        panic!("expected KeyReused, got {err:?}");
    };
    assert_eq!(key, op.key());
    assert_eq!(detail, "this key was used with a different request body");
    assert_eq!(answer.status(), 422);
    assert_eq!(err.attempts(), 1);
    assert!(!err.is_retryable_later());
    assert!(err.to_string().contains("create a new operation"), "{err}");
    assert_eq!(server.total(), 1);
    assert!(sleeper.delays().is_empty());
}

#[tokio::test]
async fn key_expired_410_is_a_typed_error_with_zero_retries() {
    let server = Upstream::scripted([Reply::problem(
        410,
        "key-expired",
        "the operation with this key completed at 2026-12-01T09:30:00.125Z with status 201",
    )])
    .await;
    let (client, sleeper, _) = client(policy());
    let op = client.post(server.url_for("/v1/charges"));

    let err = op.send().await.unwrap_err();

    let Error::KeyExpired {
        key,
        detail,
        answer,
    } = &err
    else {
        panic!("expected KeyExpired, got {err:?}");
    };
    assert_eq!(key, op.key());
    assert!(detail.contains("status 201"), "{detail}");
    assert_eq!(answer.status(), 410);
    assert_eq!(err.attempts(), 1);
    assert!(!err.is_retryable_later());
    assert!(err.to_string().contains("not executed again"), "{err}");
    assert_eq!(server.total(), 1);
    assert!(sleeper.delays().is_empty());
}

#[tokio::test]
async fn invalid_key_400_is_a_typed_error_with_zero_retries() {
    let server = Upstream::scripted([Reply::problem(
        400,
        "invalid-key",
        "the Idempotency-Key is 300 characters long; the limit is 255",
    )])
    .await;
    let (client, sleeper, _) = client(policy());

    let err = client.post(server.url_for("/")).send().await.unwrap_err();

    assert!(
        matches!(&err, Error::InvalidKey { detail, .. } if detail.contains("limit is 255")),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("1 to 255 printable ASCII"),
        "{err}"
    );
    assert_eq!(server.total(), 1);
    assert!(sleeper.delays().is_empty());
}

#[tokio::test]
async fn other_400_and_422_are_rejected_not_retried() {
    for code in [400, 422] {
        let server = Upstream::scripted([Reply::Status(
            code,
            vec![("content-type", "text/plain".into())],
            "amount must be positive".into(),
        )])
        .await;
        let (client, sleeper, _) = client(policy());

        let err = client.post(server.url_for("/")).send().await.unwrap_err();

        match &err {
            Error::Rejected { status, detail, .. } => {
                assert_eq!(status.as_u16(), code);
                assert_eq!(detail, "amount must be positive");
            }
            other => panic!("expected Rejected for {code}, got {other:?}"),
        }
        assert_eq!(server.total(), 1);
        assert!(sleeper.delays().is_empty());
    }
}

#[tokio::test]
async fn other_4xx_and_500_are_returned_as_the_answer() {
    for code in [401, 402, 404, 500] {
        let server = Upstream::scripted([Reply::status(code)]).await;
        let (client, sleeper, _) = client(policy());

        let outcome = client.post(server.url_for("/")).send().await.unwrap();

        assert_eq!(outcome.status().as_u16(), code);
        assert_eq!(outcome.attempts(), 1);
        assert_eq!(server.total(), 1);
        assert!(sleeper.delays().is_empty());
    }
}

#[tokio::test]
async fn replayed_answer_is_reported_as_replayed() {
    let server = Upstream::scripted([Reply::Status(
        201,
        vec![("idempotent-replayed", "true".into())],
        r#"{"id":"ch_1"}"#.into(),
    )])
    .await;
    let (client, _, _) = client(policy());

    let outcome = client.post(server.url_for("/")).send().await.unwrap();

    assert_eq!(outcome.status(), 201);
    assert!(outcome.replayed());
    let body: serde_json::Value = outcome.json().unwrap();
    assert_eq!(body["id"], "ch_1");
}

#[tokio::test]
async fn connection_closed_before_the_answer_is_retried() {
    let server = Upstream::scripted([]).await;
    let proxy = Relay::start(server.addr).await;
    proxy.fault_next([Fault::Close]);
    let (client, sleeper, _) = client(policy());
    let op = client.post(proxy.http_url("/v1/charges")).body("x");

    let outcome = op.send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 2);
    assert_eq!(server.total(), 1);
    assert_eq!(proxy.connections(), 2);
    assert_eq!(sleeper.delays().len(), 1);
}

#[tokio::test]
async fn refused_connections_stop_at_max_attempts() {
    // A port that was just free: nothing listens on it.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (client, sleeper, _) = client(policy().max_attempts(3));
    let op = client.post(format!("http://127.0.0.1:{port}/"));

    let err = op.send().await.unwrap_err();

    let Error::Exhausted {
        key,
        attempts,
        reason,
        last,
    } = &err
    else {
        panic!("expected Exhausted, got {err:?}");
    };
    assert_eq!(key, op.key());
    assert_eq!(*attempts, 3);
    assert_eq!(*reason, GiveUp::MaxAttempts);
    assert!(
        matches!(&**last, Failure::Transport(e) if e.is_connect()),
        "{last}"
    );
    assert!(err.is_retryable_later());
    assert_eq!(sleeper.delays().len(), 2);
}

#[tokio::test]
async fn attempt_timeout_is_retried() {
    let server = Upstream::scripted([Reply::Hang]).await;
    // Long enough that the second attempt, answered at once, gets its answer on a loaded
    // machine.
    let (client, _, _) = client(policy().attempt_timeout(Duration::from_secs(3)));

    let outcome = client.post(server.url_for("/")).send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 2);
    assert_eq!(server.total(), 2);
}

#[tokio::test]
async fn deadline_stops_a_retry_whose_wait_would_pass_it() {
    let server = Upstream::scripted([Reply::with_header(429, "retry-after", "10")]).await;
    let (client, sleeper, _) = client(policy().deadline(Duration::from_secs(5)));

    let err = client.post(server.url_for("/")).send().await.unwrap_err();

    assert!(
        matches!(&err, Error::Exhausted { reason: GiveUp::Deadline, attempts: 1, last, .. }
            if matches!(&**last, Failure::Answer(o) if o.status() == 429)),
        "{err:?}"
    );
    assert!(
        sleeper.delays().is_empty(),
        "no wait that cannot end in time"
    );
    assert_eq!(server.total(), 1);
}

#[tokio::test]
async fn deadline_counts_the_waits_already_made() {
    // 4 s + 4 s of Retry-After fit in 10 s; a third 4 s wait would end at 12 s.
    let server = Upstream::scripted([]).await;
    server.set_default(Reply::with_header(503, "retry-after", "4"));
    let (client, sleeper, _) = client(policy().max_attempts(10).deadline(Duration::from_secs(10)));

    let err = client.post(server.url_for("/")).send().await.unwrap_err();

    assert!(
        matches!(
            err,
            Error::Exhausted {
                reason: GiveUp::Deadline,
                attempts: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        sleeper.delays(),
        [Duration::from_secs(4), Duration::from_secs(4)]
    );
}

#[tokio::test]
async fn sending_an_operation_again_keeps_its_key() {
    let server = Upstream::scripted([Reply::status(503), Reply::status(503)]).await;
    let (client, _, _) = client(policy().max_attempts(2));
    let op = client.post(server.url_for("/"));

    let first = op.send().await.unwrap_err();
    assert!(first.is_retryable_later());
    let second = op.send().await.unwrap();

    assert_eq!(second.status(), 200);
    assert_eq!(second.key(), op.key());
    assert_eq!(server.total(), 3);
    all_same_key(&server, op.key().as_str());
}

#[tokio::test]
async fn backoff_waits_are_reproducible_from_a_seed() {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let server =
            Upstream::scripted([Reply::status(502), Reply::status(502), Reply::status(502)]).await;
        let (client, sleeper, _) = client(policy());
        client.post(server.url_for("/")).send().await.unwrap();
        runs.push(sleeper.delays());
    }
    assert_eq!(runs[0].len(), 3);
    assert_eq!(runs[0], runs[1]);
    for (i, d) in runs[0].iter().enumerate() {
        assert!(*d <= policy().backoff_ceiling(i as u32 + 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn budget_caps_retries_of_a_thousand_failing_operations() {
    const OPERATIONS: usize = 1000;
    let server = Upstream::scripted([]).await;
    server.set_default(Reply::status(502));
    // The clients' clock stands still, so every operation falls in one budget window;
    // the sleeper moves a clock of its own.
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let sleeper = ManualSleeper::new(ManualClock::new(Timestamp::from_millis(0)));
    let budget = RetryBudget::default().ratio(0.1).min_retries(10);
    let client = Client::builder()
        .policy(policy().max_attempts(5))
        .budget(budget.clone())
        .clock(Arc::new(clock))
        .sleeper(sleeper.clone())
        .build()
        .unwrap();

    // 20 tasks send 50 operations each, in parallel.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let client = client.clone();
        let url = server.url_for("/v1/charges");
        tasks.spawn(async move {
            let mut reasons = Vec::new();
            for _ in 0..OPERATIONS / 20 {
                match client.post(&url).send().await {
                    Err(Error::Exhausted { reason, .. }) => reasons.push(reason),
                    other => panic!("expected Exhausted, got {other:?}"),
                }
            }
            reasons
        });
    }
    let reasons: Vec<GiveUp> = tasks.join_all().await.into_iter().flatten().collect();

    let stats = client.budget_stats();
    let allowed = budget.allowance(OPERATIONS as u64);
    assert_eq!(allowed, 110);
    assert_eq!(stats.requests, OPERATIONS as u64);
    assert!(stats.retries_granted <= allowed, "{stats:?}");
    // Without the budget, 4 retries each would be 4,000.
    assert_eq!(
        server.total() as u64,
        OPERATIONS as u64 + stats.retries_granted
    );
    assert_eq!(sleeper.delays().len() as u64, stats.retries_granted);
    let by_budget = reasons.iter().filter(|r| **r == GiveUp::Budget).count();
    assert_eq!(by_budget as u64, stats.retries_refused);
    assert!(
        by_budget >= OPERATIONS - 110 / 4,
        "{by_budget} operations stopped by the budget"
    );
    println!("{stats:?}");
}

#[tokio::test]
async fn budget_allows_exactly_ratio_plus_floor_when_sequential() {
    let server = Upstream::scripted([]).await;
    server.set_default(Reply::status(503));
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let client = Client::builder()
        .policy(policy().max_attempts(3))
        .budget(RetryBudget::default().ratio(0.1).min_retries(10))
        .clock(Arc::new(clock))
        .sleeper(ManualSleeper::new(ManualClock::new(
            Timestamp::from_millis(0),
        )))
        .build()
        .unwrap();

    for _ in 0..1000 {
        assert!(client.post(server.url_for("/")).send().await.is_err());
    }

    assert_eq!(client.budget_stats().retries_granted, 110);
    assert_eq!(server.total(), 1110);
}

#[tokio::test]
async fn a_custom_classifier_changes_one_case_and_keeps_the_rest() {
    #[derive(Debug)]
    struct Retry500Too;
    impl idem_client::Classify for Retry500Too {
        fn classify_status(
            &self,
            status: http::StatusCode,
            headers: &http::HeaderMap,
        ) -> idem_client::Retryable {
            if status == http::StatusCode::INTERNAL_SERVER_ERROR {
                return idem_client::Retryable::Transient;
            }
            idem_client::DefaultClassifier.classify_status(status, headers)
        }
    }
    let server = Upstream::scripted([
        Reply::status(500),
        Reply::with_header(429, "retry-after", "1"),
    ])
    .await;
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let sleeper = ManualSleeper::new(clock.clone());
    let client = Client::builder()
        .policy(policy())
        .classifier(Retry500Too)
        .clock(Arc::new(clock))
        .sleeper(sleeper.clone())
        .build()
        .unwrap();

    let outcome = client.post(server.url_for("/")).send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.attempts(), 3);
    let delays = sleeper.delays();
    assert!(delays[0] <= policy().backoff_ceiling(1));
    assert_eq!(delays[1], Duration::from_secs(1));
}
