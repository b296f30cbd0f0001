//! The JetStream adapter against the NATS server (SPEC S12).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use common::TestStream;
use idem_inbox::{
    ConsumerStats, Delivery, Error, Inbox, JetStreamInbox, NatsOptions, PgInbox, Publisher,
    SqliteInbox,
};
use idem_test_support::eventually;
use sqlx::{AssertSqlSafe, PgPool, SqlitePool};

const ID_HEADER: &str = "Idem-Msg-Id";

/// The credit effect on a SQLite ledger.
fn sqlite_credit<'t>(
    d: Delivery,
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

async fn sqlite_rows(pool: &SqlitePool) -> Vec<(String, String, i64)> {
    sqlx::query_as("SELECT message_id, account, amount FROM ledger ORDER BY message_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Runs `consumer` until the stream's consumer is drained and `done` holds, bounded by
/// `within`; returns its stats.
async fn run_until_drained<I: Inbox, H>(
    consumer: &JetStreamInbox<I>,
    stream: &TestStream,
    handler: H,
    within: Duration,
) -> ConsumerStats
where
    H: for<'t> Fn(Delivery, &'t mut I::Tx) -> idem_inbox::BoxFuture<'t, Result<(), Error>>
        + Send
        + Sync,
{
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = async {
        let what = format!("the consumer drained, within {within:?}");
        eventually(what, within, async || stream.drained().await).await;
        let _ = stop_tx.send(());
    };
    let run = consumer.run(handler, async {
        let _ = stop_rx.await;
    });
    let ((), stats) = tokio::join!(watcher, run);
    stats.expect("run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_messages_published_twice_apply_once_with_two_consumers_sharing_postgres() {
    const N: usize = 10_000;
    let Some((client, js)) = common::nats().await else {
        return;
    };
    let Some(pool) = common::pg_pool(24).await else {
        return;
    };
    let stream = TestStream::create(&js, "tenk", Duration::from_secs(30), -1).await;
    let ns = stream.name.to_ascii_lowercase();
    let (table, ledger) = (format!("{ns}_processed"), format!("{ns}_ledger"));
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {ledger} (message_id TEXT NOT NULL, account TEXT NOT NULL, \
         amount BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();

    // Each message twice, under an id header JetStream does not de-duplicate on: both
    // copies are stored and delivered, so only the inbox stands between them and a
    // double credit. The copies go out in alternating runs of 50 (the consumers' pull
    // batch), so the two copies of a message tend to reach different consumers at
    // about the same time.
    const RUN: usize = 50;
    let expected_total: i64 = (0..N).map(|i| (i % 7) as i64 + 1).sum();
    let mut acks = Vec::with_capacity(1_000);
    for start in (0..N).step_by(RUN) {
        for _copy in 0..2 {
            for i in start..(start + RUN).min(N) {
                let amount = (i % 7) as i64 + 1;
                let mut headers = HeaderMap::new();
                headers.insert(ID_HEADER, format!("credit-{i}").as_str());
                let payload = format!("acct-{} {amount}", i % 100);
                acks.push(
                    js.publish_with_headers(stream.subject.clone(), headers, payload.into())
                        .await
                        .unwrap(),
                );
            }
        }
        if acks.len() >= 1_000 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }
    for ack in acks.drain(..) {
        ack.await.unwrap();
    }
    assert_eq!(
        stream.stored().await,
        2 * N as u64,
        "the broker kept both copies"
    );

    // Two consumers, each with its own NATS connection, sharing one durable consumer
    // and one processed-message table.
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let (_, js) = common::nats().await.unwrap();
        let inbox = PgInbox::new(pool.clone(), "points")
            .unwrap()
            .with_table(&table)
            .unwrap();
        inbox.migrate().await.unwrap();
        let options = NatsOptions {
            id_header: ID_HEADER.to_owned(),
            concurrency: 8,
            batch: RUN,
            ..NatsOptions::default()
        };
        consumers.push(
            JetStreamInbox::new(js, &stream.name, &stream.consumer, inbox, options)
                .await
                .unwrap(),
        );
    }
    let handler = |ledger: String| {
        idem_inbox::handler(
            move |d: Delivery, tx: &mut sqlx::Transaction<'static, sqlx::Postgres>| {
                let ledger = ledger.clone();
                Box::pin(async move {
                    let (account, amount) = common::parse_credit(&d.payload)?;
                    sqlx::query(AssertSqlSafe(format!(
                        "INSERT INTO {ledger} (message_id, account, amount) VALUES ($1, $2, $3)"
                    )))
                    .bind(d.message_id)
                    .bind(account)
                    .bind(amount)
                    .execute(&mut **tx)
                    .await?;
                    Ok(())
                })
            },
        )
    };
    let (a, b) = tokio::join!(
        run_until_drained(
            &consumers[0],
            &stream,
            handler(ledger.clone()),
            Duration::from_secs(240)
        ),
        run_until_drained(
            &consumers[1],
            &stream,
            handler(ledger.clone()),
            Duration::from_secs(240)
        ),
    );

    let (rows, distinct, total): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT COUNT(*), COUNT(DISTINCT message_id), COALESCE(SUM(amount), 0)::BIGINT FROM {ledger}"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (rows, distinct),
        (N as i64, N as i64),
        "each credit applied exactly once"
    );
    assert_eq!(total, expected_total);
    let recorded: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(recorded, N as i64);
    assert_eq!(a.processed + b.processed, N as u64);
    assert!(
        a.duplicates + b.duplicates >= N as u64,
        "every second copy was skipped: {a:?} {b:?}"
    );
    assert!(
        a.processed > 0 && b.processed > 0,
        "both consumers worked: {a:?} {b:?}"
    );
    assert_eq!(a.failed + b.failed, 0, "{a:?} {b:?}");
    println!("consumer A {a:?}\nconsumer B {b:?}");

    stream.delete().await;
    drop(client);
    drop_tables(&pool, &[&table, &ledger]).await;
}

async fn drop_tables(pool: &PgPool, tables: &[&str]) {
    let sql = format!("DROP TABLE IF EXISTS {}", tables.join(", "));
    sqlx::query(AssertSqlSafe(sql)).execute(pool).await.unwrap();
}

async fn sqlite_consumer(
    js: async_nats::jetstream::Context,
    stream: &TestStream,
    pool: &SqlitePool,
    options: NatsOptions,
) -> JetStreamInbox<SqliteInbox> {
    let inbox = SqliteInbox::new(pool.clone(), "points").unwrap();
    inbox.migrate().await.unwrap();
    JetStreamInbox::new(js, &stream.name, &stream.consumer, inbox, options)
        .await
        .unwrap()
}

#[tokio::test]
async fn publisher_sets_nats_msg_id_so_jetstream_drops_the_republish() {
    let Some((_client, js)) = common::nats().await else {
        return;
    };
    // Nothing here is redelivered on purpose: an ack wait a loaded machine's slow ack
    // cannot overrun, so that no delivery counts twice.
    let stream = TestStream::create(&js, "publisher", Duration::from_secs(30), 5).await;
    let publisher = Publisher::new(js.clone());
    let first = publisher
        .publish(stream.subject.clone(), "order-17", "alice 10".into())
        .await
        .unwrap();
    let again = publisher
        .publish(stream.subject.clone(), "order-17", "alice 10".into())
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(
        again.duplicate,
        "JetStream's duplicate window dropped the republish"
    );
    assert_eq!(again.sequence, first.sequence);
    assert_eq!(stream.stored().await, 1);

    let dir = tempfile::tempdir().unwrap();
    let pool = common::sqlite_ledger(dir.path()).await;
    let consumer = sqlite_consumer(js.clone(), &stream, &pool, NatsOptions::default()).await;
    let stats = run_until_drained(&consumer, &stream, sqlite_credit, Duration::from_secs(30)).await;
    assert_eq!(
        (stats.processed, stats.duplicates, stats.sequence_ids),
        (1, 0, 0)
    );
    assert_eq!(
        sqlite_rows(&pool).await,
        vec![("order-17".to_owned(), "alice".to_owned(), 10)]
    );
    stream.delete().await;
}

#[tokio::test]
async fn message_without_id_header_falls_back_to_stream_sequence() {
    let Some((_client, js)) = common::nats().await else {
        return;
    };
    // Nothing here is redelivered on purpose: an ack wait a loaded machine's slow ack
    // cannot overrun, so that no delivery counts twice.
    let stream = TestStream::create(&js, "fallback", Duration::from_secs(30), 5).await;
    for payload in ["alice 1", "bob 2"] {
        js.publish(stream.subject.clone(), payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let pool = common::sqlite_ledger(dir.path()).await;
    let consumer = sqlite_consumer(js.clone(), &stream, &pool, NatsOptions::default()).await;
    let stats = run_until_drained(&consumer, &stream, sqlite_credit, Duration::from_secs(30)).await;
    assert_eq!((stats.processed, stats.sequence_ids), (2, 2));
    let ids: Vec<String> = sqlite_rows(&pool).await.into_iter().map(|r| r.0).collect();
    assert_eq!(
        ids,
        vec![
            format!("seq:{}:1", stream.name),
            format!("seq:{}:2", stream.name)
        ]
    );
    assert!(consumer.inbox().contains(&ids[0]).await.unwrap());
    stream.delete().await;
}

#[tokio::test]
async fn failed_effects_are_nacked_and_the_redelivery_applies_once() {
    let Some((_client, js)) = common::nats().await else {
        return;
    };
    let stream = TestStream::create(&js, "nak", Duration::from_secs(30), 5).await;
    Publisher::new(js.clone())
        .publish(stream.subject.clone(), "m-1", "alice 5".into())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pool = common::sqlite_ledger(dir.path()).await;
    let options = NatsOptions {
        nak_delay: Duration::from_millis(100),
        ..NatsOptions::default()
    };
    let consumer = sqlite_consumer(js.clone(), &stream, &pool, options).await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = attempts.clone();
    // The first delivery writes, then fails: the write rolls back, the message is
    // nak'ed (not left to the 30 s ack wait) and the redelivery succeeds.
    let handler = idem_inbox::handler(
        move |d: Delivery, tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>| {
            let attempt = seen.fetch_add(1, Ordering::SeqCst) + 1;
            Box::pin(async move {
                assert_eq!(d.delivered, attempt as i64);
                sqlite_credit(d, tx).await?;
                if attempt == 1 {
                    return Err(Error::handler("ledger service refused"));
                }
                Ok(())
            })
        },
    );
    let stats = run_until_drained(&consumer, &stream, handler, Duration::from_secs(20)).await;
    assert_eq!((stats.processed, stats.failed), (1, 1));
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(
        sqlite_rows(&pool).await,
        vec![("m-1".to_owned(), "alice".to_owned(), 5)]
    );
    stream.delete().await;
}

#[tokio::test]
async fn retention_check_reads_stream_and_consumer_windows() {
    let Some((_client, js)) = common::nats().await else {
        return;
    };
    // Duplicate window 120 s; 5 deliveries of a 2 s ack wait is 10 s.
    let stream = TestStream::create(&js, "window", Duration::from_secs(2), 5).await;
    let dir = tempfile::tempdir().unwrap();
    let pool = common::sqlite_ledger(dir.path()).await;
    let consumer = sqlite_consumer(js.clone(), &stream, &pool, NatsOptions::default()).await;
    assert_eq!(
        consumer.broker_window().await.unwrap(),
        Duration::from_secs(120)
    );
    assert_eq!(
        consumer.check_retention().await.unwrap(),
        None,
        "7 days cover it"
    );

    let short = SqliteInbox::new(pool.clone(), "points")
        .unwrap()
        .with_retention(Duration::from_secs(60));
    let consumer = JetStreamInbox::new(
        js.clone(),
        &stream.name,
        &stream.consumer,
        short,
        NatsOptions::default(),
    )
    .await
    .unwrap();
    let warning = consumer
        .check_retention()
        .await
        .unwrap()
        .expect("a warning");
    assert_eq!(warning.retention, Duration::from_secs(60));
    assert_eq!(warning.broker_window, Duration::from_secs(120));
    stream.delete().await;
}

#[tokio::test]
async fn message_with_an_unstorable_id_is_terminated_not_redelivered() {
    let Some((_client, js)) = common::nats().await else {
        return;
    };
    let stream = TestStream::create(&js, "term", Duration::from_secs(1), 5).await;
    let mut headers = HeaderMap::new();
    headers.insert(ID_HEADER, "x".repeat(idem_inbox::MAX_ID_LEN + 1).as_str());
    js.publish_with_headers(stream.subject.clone(), headers, "alice 1".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pool = common::sqlite_ledger(dir.path()).await;
    let options = NatsOptions {
        id_header: ID_HEADER.to_owned(),
        ..NatsOptions::default()
    };
    let consumer = sqlite_consumer(js.clone(), &stream, &pool, options).await;
    let stats = run_until_drained(&consumer, &stream, sqlite_credit, Duration::from_secs(20)).await;
    assert_eq!(
        (stats.processed, stats.failed),
        (0, 1),
        "delivered once, then terminated"
    );
    assert_eq!(sqlite_rows(&pool).await, vec![]);
    stream.delete().await;
}
