//! The RabbitMQ adapter against the live server (SPEC S12).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_inbox::{
    Error, Inbox, QueueType, RabbitDelivery, RabbitInbox, RabbitOptions, RabbitStats, SqliteInbox,
};
use idem_test_support::{Relay, RelayMode, eventually, service_addr, service_unavailable, url_via};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sqlx::SqlitePool;

fn rabbit_url() -> String {
    idem_test_support::services::rabbitmq_url()
}

/// A queue with a name unique to the test, its publishing channel and a ledger.
struct Fixture {
    url: String,
    queue: String,
    connection: Connection,
    channel: Channel,
    ledger: SqlitePool,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new(case: &str, kind: QueueType) -> Option<Fixture> {
        let url = rabbit_url();
        let connect = Connection::connect(&url, ConnectionProperties::default());
        let connection = match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return service_unavailable("RabbitMQ", &url, &e),
            Err(e) => return service_unavailable("RabbitMQ", &url, &e),
        };
        let queue = format!("inbox.{}", idem_core::testing::unique_namespace(case));
        RabbitInbox::<SqliteInbox>::declare_queue(&url, &queue, kind)
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ledger = common::sqlite_ledger(dir.path()).await;
        Some(Fixture {
            url,
            queue,
            connection,
            channel,
            ledger,
            _dir: dir,
        })
    }

    async fn inbox(&self) -> SqliteInbox {
        let inbox = SqliteInbox::new(self.ledger.clone(), "points").unwrap();
        inbox.migrate().await.unwrap();
        inbox
    }

    async fn publish(&self, id: Option<&str>, headers: FieldTable, payload: &str) {
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = id {
            properties = properties.with_message_id(id.into());
        }
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                payload.as_bytes(),
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }

    async fn ledger_rows(&self) -> Vec<(String, String, i64)> {
        sqlx::query_as("SELECT message_id, account, amount FROM ledger ORDER BY message_id")
            .fetch_all(&self.ledger)
            .await
            .unwrap()
    }

    async fn cleanup(self) {
        self.channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let _ = self.connection.close(200, "bye".into()).await;
    }
}

fn credit<'t>(
    d: RabbitDelivery,
    tx: &'t mut sqlx::Transaction<'static, sqlx::Sqlite>,
) -> idem_inbox::BoxFuture<'t, Result<(), Error>> {
    Box::pin(async move {
        let (account, amount) = common::parse_credit(&d.payload)?;
        sqlx::query("INSERT INTO ledger (message_id, account, amount) VALUES (?1, ?2, ?3)")
            .bind(d.message_id)
            .bind(account)
            .bind(amount)
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
}

type SqliteTx = sqlx::Transaction<'static, sqlx::Sqlite>;

/// Names a handler's type so the compiler sees its future borrow the transaction.
fn typed<F>(f: F) -> F
where
    F: for<'t> Fn(RabbitDelivery, &'t mut SqliteTx) -> idem_inbox::BoxFuture<'t, Result<(), Error>>,
{
    f
}

/// Runs `consumer` until `done` holds (bounded), then stops it and returns its stats.
async fn run_until<H>(
    consumer: &RabbitInbox<SqliteInbox>,
    handler: H,
    mut done: impl AsyncFnMut() -> bool,
) -> RabbitStats
where
    H: for<'t> Fn(
            RabbitDelivery,
            &'t mut sqlx::Transaction<'static, sqlx::Sqlite>,
        ) -> idem_inbox::BoxFuture<'t, Result<(), Error>>
        + Send
        + Sync,
{
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = async {
        eventually(
            "the consumer finished its work",
            Duration::from_secs(60),
            async || done().await,
        )
        .await;
        let _ = stop_tx.send(());
    };
    let run = consumer.run(handler, async {
        let _ = stop_rx.await;
    });
    let ((), stats) = tokio::join!(watcher, run);
    stats.expect("run")
}

async fn published_twice_apply_once(kind: QueueType, case: &str) {
    const N: usize = 200;
    let Some(f) = Fixture::new(case, kind).await else {
        return;
    };
    for i in 0..N {
        for _copy in 0..2 {
            f.publish(
                Some(&format!("credit-{i}")),
                FieldTable::default(),
                &format!("acct-{} 1", i % 10),
            )
            .await;
        }
    }
    let consumer = RabbitInbox::new(
        &f.url,
        &f.queue,
        f.inbox().await,
        RabbitOptions {
            prefetch: 50,
            concurrency: 4,
            ..RabbitOptions::default()
        },
    );
    let ledger = f.ledger.clone();
    let stats = run_until(&consumer, credit, async || {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_inbox")
            .fetch_one(&ledger)
            .await
            .unwrap();
        n == N as i64
    })
    .await;
    // Every copy arrives; the run may stop before the last duplicates are acked, which
    // a later consumer would skip in turn.
    assert_eq!(stats.processed, N as u64, "{stats:?}");
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert_eq!(f.ledger_rows().await.len(), N);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_published_twice_apply_once_on_a_classic_queue() {
    published_twice_apply_once(QueueType::Classic, "classic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_published_twice_apply_once_on_a_quorum_queue() {
    published_twice_apply_once(QueueType::Quorum, "quorum").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivery_after_commit_is_acked_without_effects() {
    let Some(f) = Fixture::new("aftercommit", QueueType::Classic).await else {
        return;
    };
    let inbox = f.inbox().await;
    // A consumer that committed m-1 and died before its ack: the row is there.
    let processed = inbox
        .process("m-1", |tx| {
            credit(
                RabbitDelivery {
                    message_id: "m-1".into(),
                    exchange: String::new(),
                    routing_key: String::new(),
                    payload: b"alice 10".to_vec(),
                    headers: None,
                    redelivered: false,
                },
                tx,
            )
        })
        .await
        .unwrap();
    assert!(!processed.is_duplicate());
    f.publish(Some("m-1"), FieldTable::default(), "alice 10")
        .await;
    f.publish(Some("m-2"), FieldTable::default(), "bob 20")
        .await;
    let consumer = RabbitInbox::new(&f.url, &f.queue, inbox, RabbitOptions::default());
    let stats = run_until(&consumer, credit, async || f.ledger_rows().await.len() == 2).await;
    assert_eq!(stats.processed, 1, "{stats:?}");
    assert_eq!(
        f.ledger_rows().await,
        [
            ("m-1".into(), "alice".into(), 10),
            ("m-2".into(), "bob".into(), 20)
        ]
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_message_is_requeued_and_applied_once() {
    let Some(f) = Fixture::new("requeue", QueueType::Quorum).await else {
        return;
    };
    f.publish(Some("m-1"), FieldTable::default(), "alice 10")
        .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let consumer = RabbitInbox::new(
        &f.url,
        &f.queue,
        f.inbox().await,
        RabbitOptions {
            requeue_delay: Duration::from_millis(50),
            ..RabbitOptions::default()
        },
    );
    let handler = {
        let calls = calls.clone();
        typed(move |d: RabbitDelivery, tx: &mut SqliteTx| {
            let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
            let fut = credit(d, tx);
            Box::pin(async move {
                fut.await?;
                if first {
                    return Err(Error::handler("the first try fails after its writes"));
                }
                Ok(())
            }) as idem_inbox::BoxFuture<'_, Result<(), Error>>
        })
    };
    let stats = run_until(&consumer, handler, async || {
        f.ledger_rows().await.len() == 1
    })
    .await;
    assert_eq!((stats.failed, stats.processed), (1, 1), "{stats:?}");
    assert_eq!(f.ledger_rows().await, [("m-1".into(), "alice".into(), 10)]);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_without_message_id_is_rejected_unless_a_header_names_it() {
    let Some(f) = Fixture::new("noid", QueueType::Classic).await else {
        return;
    };
    let mut headers = FieldTable::default();
    headers.insert("x-credit-id".into(), AMQPValue::LongString("h-1".into()));
    f.publish(None, FieldTable::default(), "alice 10").await;
    f.publish(None, headers.clone(), "bob 20").await;
    let consumer = RabbitInbox::new(&f.url, &f.queue, f.inbox().await, RabbitOptions::default());
    let err = consumer
        .message_id(&lapin::message::Delivery::mock(
            1,
            "".into(),
            "".into(),
            false,
            vec![],
        ))
        .unwrap_err();
    assert!(err.to_string().contains("no message-id"), "{err}");
    let stats = run_until(&consumer, credit, async || {
        // Both settled: rejected, so the queue is empty and nothing unacked.
        queue_empty(&f).await
    })
    .await;
    assert_eq!(stats.rejected, 2, "{stats:?}");
    assert!(f.ledger_rows().await.is_empty());

    f.publish(None, headers, "bob 20").await;
    let consumer = RabbitInbox::new(
        &f.url,
        &f.queue,
        f.inbox().await,
        RabbitOptions {
            id_header: Some("x-credit-id".into()),
            ..RabbitOptions::default()
        },
    );
    run_until(&consumer, credit, async || f.ledger_rows().await.len() == 1).await;
    assert_eq!(f.ledger_rows().await, [("h-1".into(), "bob".into(), 20)]);
    f.cleanup().await;
}

async fn queue_empty(f: &Fixture) -> bool {
    let q = f
        .channel
        .queue_declare(
            f.queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    q.message_count() == 0 && q.consumer_count() == 1 && {
        // Ready is zero; give the in-flight reject a moment to land.
        tokio::time::sleep(Duration::from_millis(100)).await;
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_connection_is_opened_again_and_nothing_is_applied_twice() {
    let Some(f) = Fixture::new("reconnect", QueueType::Quorum).await else {
        return;
    };
    let proxy = Relay::start(service_addr(&f.url, 5672).await).await;
    let via = url_via(&f.url, proxy.addr());
    for i in 0..5 {
        f.publish(Some(&format!("a-{i}")), FieldTable::default(), "alice 1")
            .await;
    }
    let consumer = RabbitInbox::new(
        &via,
        &f.queue,
        f.inbox().await,
        RabbitOptions {
            reconnect_backoff: Duration::from_millis(50),
            ..RabbitOptions::default()
        },
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let driver = async {
        eventually("the first five", Duration::from_secs(30), async || {
            f.ledger_rows().await.len() == 5
        })
        .await;
        // The broker is down a moment: the live connection is reset, a reconnect is
        // refused until it is back.
        proxy.set_mode(RelayMode::Refuse);
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.set_mode(RelayMode::Forward);
        for i in 0..5 {
            f.publish(Some(&format!("b-{i}")), FieldTable::default(), "bob 1")
                .await;
        }
        eventually(
            "all ten after the reconnect",
            Duration::from_secs(30),
            async || f.ledger_rows().await.len() == 10,
        )
        .await;
        let _ = stop_tx.send(());
    };
    let run = consumer.run(credit, async {
        let _ = stop_rx.await;
    });
    let ((), stats) = tokio::join!(driver, run);
    let stats = stats.unwrap();
    assert!(stats.reconnects >= 1, "{stats:?}");
    assert_eq!(stats.processed, 10, "{stats:?}");
    f.cleanup().await;
}
