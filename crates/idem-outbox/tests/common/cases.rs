//! Outbox behaviours both SQL backends must show. A backend's test file implements
//! [`Backend`] and expands [`outbox_cases!`](crate::outbox_cases).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_inbox::{Inbox, Outcome, SqliteInbox};
use idem_outbox::{Destination, Message, Outbox, Relay, RelayOptions};

use super::{FakeBroker, Shared, ms};

/// One backend under test: an outbox on a unique table, next to an `orders` table.
pub trait Backend: Clone + Send + Sync + 'static {
    type O: Outbox;

    /// The outbox.
    fn outbox(&self) -> Self::O;

    /// Inserts order `order` and stages `messages` in one transaction, then commits it
    /// (or rolls it back).
    fn order(
        &self,
        order: i64,
        messages: Vec<Message>,
        commit: bool,
    ) -> impl Future<Output = ()> + Send;

    /// The orders in the table.
    fn orders(&self) -> impl Future<Output = i64> + Send;

    /// Drops what the case created in a shared database.
    fn cleanup(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Expands to one `#[tokio::test]` per case for the backend `$setup` builds.
#[macro_export]
macro_rules! outbox_cases {
    ($setup:path) => {
        $crate::outbox_cases!(@cases $setup;
            rolled_back_transaction_publishes_nothing,
            committed_message_is_published_once_and_marked,
            relay_killed_after_publish_before_mark_republishes_and_the_inbox_drops_the_duplicate,
            order_per_key_holds_across_a_failed_publish,
            refused_message_is_parked_and_does_not_block_its_key,
            attempts_run_out_and_the_message_is_parked,
            purge_removes_published_rows_past_retention_only,
            staging_an_id_twice_keeps_one_message,
            stats_count_the_backlog_and_its_age,
            running_relay_publishes_what_commits_and_stops_on_shutdown
        );
    };
    (@cases $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(backend) = $setup(stringify!($case)).await else { return };
                let keep = backend.clone();
                $crate::common::cases::$case(backend).await;
                $crate::common::cases::Backend::cleanup(&keep).await;
            }
        )*
    };
}

pub fn event(id: &str) -> Message {
    Message::with_id(
        id,
        Destination::subject("orders.created"),
        format!("{{\"id\":\"{id}\"}}"),
    )
}

fn quick() -> RelayOptions {
    RelayOptions {
        backoff_base: ms(1),
        backoff_max: ms(5),
        poll_interval: ms(20),
        ..RelayOptions::default()
    }
}

fn relay<B: Backend>(b: &B, broker: &FakeBroker) -> Relay<B::O, Shared<FakeBroker>> {
    Relay::new(b.outbox(), Shared(Arc::new(broker.clone()))).with_options(quick())
}

/// Rounds until nothing is left to claim (backoffs elapsing), at most `max` rounds.
async fn drain<B: Backend>(relay: &Relay<B::O, Shared<FakeBroker>>, max: usize) {
    for _ in 0..max {
        if relay.outbox().stats().await.unwrap().unpublished == 0 {
            return;
        }
        relay.round().await.unwrap();
        tokio::time::sleep(ms(6)).await;
    }
    panic!("the outbox did not drain in {max} rounds");
}

pub async fn rolled_back_transaction_publishes_nothing<B: Backend>(b: B) {
    b.order(1, vec![event("o1")], false).await;
    let broker = FakeBroker::default();
    let report = relay(&b, &broker).round().await.unwrap();
    assert_eq!(report.claimed, 0);
    assert!(broker.delivered().is_empty());
    assert_eq!(b.orders().await, 0);
    assert_eq!(b.outbox().stats().await.unwrap().unpublished, 0);
}

pub async fn committed_message_is_published_once_and_marked<B: Backend>(b: B) {
    b.order(
        1,
        vec![event("o1").header("content-type", "application/json")],
        true,
    )
    .await;
    let broker = FakeBroker::default();
    let relay = relay(&b, &broker);
    let report = relay.round().await.unwrap();
    assert_eq!((report.claimed, report.published), (1, 1));
    assert_eq!(
        relay.round().await.unwrap().claimed,
        0,
        "marked, never sent again"
    );
    let delivered = broker.delivered();
    assert_eq!(
        delivered,
        vec![event("o1").header("content-type", "application/json")]
    );
    let stats = b.outbox().stats().await.unwrap();
    assert_eq!((stats.unpublished, stats.published), (0, 1));
    assert_eq!(relay.metrics().snapshot().published, 1);
}

pub async fn relay_killed_after_publish_before_mark_republishes_and_the_inbox_drops_the_duplicate<
    B: Backend,
>(
    b: B,
) {
    b.order(1, vec![event("o1")], true).await;
    let broker = FakeBroker::default();
    broker.hang_after_confirm(true);
    let first = relay(&b, &broker);
    let task = tokio::spawn(async move { first.round().await });
    broker.wait_confirmed().await;
    // Killed: its batch is dropped unmarked (PostgreSQL rolls the claim back).
    task.abort();
    let _ = task.await;
    broker.hang_after_confirm(false);
    drain::<B>(&relay(&b, &broker), 100).await;
    assert_eq!(
        broker.delivered_ids(),
        ["o1", "o1"],
        "at least once: published again"
    );

    // The consumer's inbox credits the order once.
    let dir = tempfile::tempdir().unwrap();
    let pool = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("consumer.db"))
            .create_if_missing(true),
    )
    .await
    .unwrap();
    sqlx::query("CREATE TABLE ledger (message_id TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let inbox = SqliteInbox::new(pool.clone(), "ledger").unwrap();
    inbox.migrate().await.unwrap();
    let mut outcomes = Vec::new();
    for m in broker.delivered() {
        let id = m.id.clone();
        let outcome = inbox
            .process(&m.id, |tx| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO ledger VALUES (?1)")
                        .bind(id)
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, idem_inbox::Error>(())
                })
            })
            .await
            .unwrap();
        outcomes.push(outcome);
    }
    assert_eq!(outcomes, [Outcome::Processed(()), Outcome::Duplicate]);
    let credited: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(credited, 1);
}

pub async fn order_per_key_holds_across_a_failed_publish<B: Backend>(b: B) {
    let keyed = |id: &str, key: &str| event(id).ordering_key(key);
    b.order(
        1,
        vec![
            keyed("a0", "A"),
            keyed("b0", "B"),
            keyed("a1", "A"),
            event("n0"),
            keyed("a2", "A"),
        ],
        true,
    )
    .await;
    let broker = FakeBroker::default();
    broker.fail_once("a0");
    let relay = relay(&b, &broker);
    let first = relay.round().await.unwrap();
    assert_eq!((first.published, first.failed), (2, 1), "{first:?}");
    assert_eq!(
        broker.delivered_ids(),
        ["b0", "n0"],
        "A waits behind its failed head"
    );
    drain::<B>(&relay, 100).await;
    let a: Vec<String> = broker
        .delivered_ids()
        .into_iter()
        .filter(|id| id.starts_with('a'))
        .collect();
    assert_eq!(a, ["a0", "a1", "a2"]);
    assert_eq!(relay.metrics().snapshot().publish_failures, 1);
}

pub async fn refused_message_is_parked_and_does_not_block_its_key<B: Backend>(b: B) {
    b.order(
        1,
        vec![
            event("big").ordering_key("K"),
            event("next").ordering_key("K"),
        ],
        true,
    )
    .await;
    let broker = FakeBroker::default();
    broker.refuse("big");
    let relay = relay(&b, &broker);
    drain::<B>(&relay, 10).await;
    assert_eq!(broker.delivered_ids(), ["next"]);
    let outbox = b.outbox();
    let parked = outbox.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].message.id, "big");
    assert!(parked[0].error.contains("too large"), "{}", parked[0].error);
    assert_eq!(outbox.stats().await.unwrap().parked, 1);
    assert_eq!(relay.metrics().snapshot().parked, 1);

    // Once the cause is fixed, the operator puts it back in line.
    assert!(outbox.requeue("big").await.unwrap());
    assert!(!outbox.requeue("big").await.unwrap());
    let broker2 = FakeBroker::default();
    drain::<B>(&self::relay(&b, &broker2), 10).await;
    assert_eq!(broker2.delivered_ids(), ["big"]);
}

pub async fn attempts_run_out_and_the_message_is_parked<B: Backend>(b: B) {
    b.order(1, vec![event("flaky")], true).await;
    let broker = FakeBroker::default();
    let relay =
        Relay::new(b.outbox(), Shared(Arc::new(broker.clone()))).with_options(RelayOptions {
            max_attempts: Some(2),
            ..quick()
        });
    broker.fail_once("flaky");
    relay.round().await.unwrap();
    tokio::time::sleep(ms(10)).await;
    broker.fail_once("flaky");
    let second = relay.round().await.unwrap();
    assert_eq!(second.parked, 1, "{second:?}");
    let parked = b.outbox().parked(10).await.unwrap();
    assert!(
        parked[0].error.starts_with("gave up after 2 attempts"),
        "{}",
        parked[0].error
    );
    assert_eq!(parked[0].attempts, 2);
}

pub async fn purge_removes_published_rows_past_retention_only<B: Backend>(b: B) {
    b.order(1, vec![event("p1"), event("p2"), event("refused")], true)
        .await;
    let broker = FakeBroker::default();
    broker.refuse("refused");
    drain::<B>(&relay(&b, &broker), 10).await;
    b.order(2, vec![event("pending")], true).await;
    let outbox = b.outbox();
    assert_eq!(
        outbox
            .purge_published(Duration::from_secs(3600), 10)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(ms(5)).await;
    assert_eq!(
        outbox.purge_published(Duration::ZERO, 1).await.unwrap(),
        1,
        "bounded"
    );
    assert_eq!(outbox.purge_published(Duration::ZERO, 10).await.unwrap(), 1);
    let stats = outbox.stats().await.unwrap();
    assert_eq!(
        (stats.published, stats.parked, stats.unpublished),
        (0, 1, 1)
    );
}

pub async fn staging_an_id_twice_keeps_one_message<B: Backend>(b: B) {
    b.order(1, vec![event("dup"), event("dup")], true).await;
    let broker = FakeBroker::default();
    drain::<B>(&relay(&b, &broker), 10).await;
    assert_eq!(broker.delivered_ids(), ["dup"]);
}

pub async fn stats_count_the_backlog_and_its_age<B: Backend>(b: B) {
    b.order(1, vec![event("s1"), event("s2")], true).await;
    tokio::time::sleep(ms(30)).await;
    let stats = b.outbox().stats().await.unwrap();
    assert_eq!(stats.unpublished, 2);
    assert!(stats.oldest_unpublished_age >= ms(30), "{stats:?}");
}

pub async fn running_relay_publishes_what_commits_and_stops_on_shutdown<B: Backend>(b: B) {
    let broker = FakeBroker::default();
    let relay = Arc::new(relay(&b, &broker));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    for i in 0..20 {
        b.order(i, vec![event(&format!("r{i}"))], true).await;
    }
    idem_test_support::eventually("20 published", idem_test_support::WAIT, async || {
        broker.delivered().len() == 20
    })
    .await;
    stop.send(()).unwrap();
    let metrics = running.await.unwrap();
    assert_eq!(metrics.published, 20);
    assert_eq!(b.orders().await, 20);
}

/// Runs `relays` at once until `outbox` has nothing unpublished, then stops them.
async fn run_until_drained<O: Outbox, P: idem_outbox::Publish>(
    relays: Vec<Arc<Relay<O, P>>>,
    outbox: &O,
) {
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    let tasks: Vec<_> = relays
        .into_iter()
        .map(|relay| {
            let mut stopped = stop.subscribe();
            tokio::spawn(async move {
                relay
                    .run(async move {
                        let _ = stopped.recv().await;
                    })
                    .await
            })
        })
        .collect();
    idem_test_support::eventually("the outbox drained", Duration::from_secs(60), async || {
        outbox.stats().await.unwrap().unpublished == 0
    })
    .await;
    stop.send(()).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Two relays share a table of a backend that allows several (not SQLite's): 600
/// messages over 10 ordering keys are each published once, each key's in staging order.
pub async fn two_relays_publish_each_message_once<B: Backend>(b: B) {
    const N: i64 = 600;
    let broker = Arc::new(FakeBroker::default());
    let options = RelayOptions {
        batch: 16,
        ..RelayOptions::default()
    };
    let relays: Vec<_> = (0..2)
        .map(|_| {
            Arc::new(Relay::new(b.outbox(), Shared(broker.clone())).with_options(options.clone()))
        })
        .collect();
    let metrics: Vec<_> = relays.iter().map(|r| r.metrics()).collect();
    for i in 0..N {
        let key = format!("k{}", i % 10);
        b.order(i, vec![event(&format!("m{i}")).ordering_key(key)], true)
            .await;
    }
    run_until_drained(relays, &b.outbox()).await;
    let delivered = broker.delivered();
    let mut seen = HashMap::new();
    for m in &delivered {
        *seen.entry(m.id.clone()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), N as usize);
    assert!(
        seen.values().all(|&n| n == 1),
        "a message was published twice"
    );
    // Order per key: each key's messages in staging order.
    for k in 0..10 {
        let ids: Vec<i64> = delivered
            .iter()
            .filter(|m| m.ordering_key.as_deref() == Some(&format!("k{k}")))
            .map(|m| m.id[1..].parse().unwrap())
            .collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "key k{k} out of order: {ids:?}"
        );
    }
    let published: u64 = metrics.iter().map(|m| m.snapshot().published).sum();
    assert_eq!(published, N as u64);
}
