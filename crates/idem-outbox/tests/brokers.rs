//! The publishers against the live brokers: NATS JetStream and RabbitMQ.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::stream;
use common::cases::event;
use futures_util::StreamExt;
use idem_outbox::{
    Destination, Message, NatsPublisher, Outbox, Publish, PublishError, RabbitPublisher, Relay,
    SqliteOutbox,
};
use idem_test_support::service_unavailable;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;

async fn js() -> Option<async_nats::jetstream::Context> {
    let url = common::nats_url();
    match tokio::time::timeout(Duration::from_secs(10), async_nats::connect(&url)).await {
        Ok(Ok(client)) => Some(async_nats::jetstream::new(client)),
        Ok(Err(e)) => service_unavailable("NATS", &url, &e),
        Err(e) => service_unavailable("NATS", &url, &e),
    }
}

async fn rabbit() -> Option<lapin::Connection> {
    let url = common::rabbitmq_url();
    let connect = lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => service_unavailable("RabbitMQ", &url, &e),
        Err(e) => service_unavailable("RabbitMQ", &url, &e),
    }
}

async fn sqlite_outbox(dir: &tempfile::TempDir) -> (sqlx::SqlitePool, SqliteOutbox) {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("service.db"))
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let outbox = SqliteOutbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    (pool, outbox)
}

async fn stage(pool: &sqlx::SqlitePool, outbox: &SqliteOutbox, messages: &[Message]) {
    let mut tx = pool.begin().await.unwrap();
    for m in messages {
        outbox.stage(&mut tx, m).await.unwrap();
    }
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_publish_sets_the_msg_id_and_a_republish_is_dropped_by_the_stream() {
    let Some(js) = js().await else { return };
    let ns = common::unique("natspub");
    let subject = format!("outbox.{ns}");
    let name = format!("OUTBOX_{ns}");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        max_age: Duration::from_secs(600),
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap();
    let publisher = NatsPublisher::new(js.clone());
    let m = Message::with_id("n-1", Destination::subject(&subject), "hello").header("k", "v");
    let results = publisher.publish_all(&[&m, &m]).await;
    assert_eq!(results, [Ok(()), Ok(())]);
    let mut s = js.get_stream(&name).await.unwrap();
    assert_eq!(
        s.info().await.unwrap().state.messages,
        1,
        "the duplicate window drops it"
    );
    let stored = s.get_raw_message(1).await.unwrap();
    assert_eq!(stored.headers.get("Nats-Msg-Id").unwrap().as_str(), "n-1");
    assert_eq!(stored.headers.get("k").unwrap().as_str(), "v");

    // Refused for good: no stream captures the subject, or an exchange destination.
    let nowhere = Message::with_id("n-2", Destination::subject(format!("nowhere.{ns}")), "x");
    let exchange = Message::with_id("n-3", Destination::exchange("x", "k"), "x");
    let results = publisher.publish_all(&[&nowhere, &exchange]).await;
    assert!(
        matches!(&results[0], Err(PublishError::Refused(e)) if e.contains("no stream")),
        "{results:?}"
    );
    assert!(
        matches!(&results[1], Err(PublishError::Refused(_))),
        "{results:?}"
    );
    js.delete_stream(&name).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_to_nats_publishes_staged_messages_in_order() {
    let Some(js) = js().await else { return };
    let ns = common::unique("natsrelay");
    let subject = format!("outbox.{ns}");
    let name = format!("OUTBOX_{ns}");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        max_age: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pool, outbox) = sqlite_outbox(&dir).await;
    let messages: Vec<Message> = (0..50)
        .map(|i| {
            Message::with_id(
                format!("m{i}"),
                Destination::subject(&subject),
                format!("{i}"),
            )
            .ordering_key(format!("k{}", i % 3))
        })
        .collect();
    stage(&pool, &outbox, &messages).await;
    let relay = Relay::new(outbox.clone(), NatsPublisher::new(js.clone()));
    while relay.round().await.unwrap().claimed > 0 {}
    assert_eq!(outbox.stats().await.unwrap().published, 50);
    let s = js.get_stream(&name).await.unwrap();
    let ids: Vec<String> = futures_util::stream::iter(1..=50u64)
        .then(|seq| {
            let s = s.clone();
            async move {
                s.get_raw_message(seq)
                    .await
                    .unwrap()
                    .headers
                    .get("Nats-Msg-Id")
                    .unwrap()
                    .to_string()
            }
        })
        .collect()
        .await;
    for k in 0..3 {
        let of_k: Vec<usize> = ids
            .iter()
            .map(|id| id[1..].parse::<usize>().unwrap())
            .filter(|i| i % 3 == k)
            .collect();
        assert!(of_k.windows(2).all(|w| w[0] < w[1]), "{of_k:?}");
    }
    js.delete_stream(&name).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_publish_is_confirmed_persistent_and_carries_the_message_id() {
    let Some(conn) = rabbit().await else { return };
    let queue = common::unique("rabbitpub");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let publisher = RabbitPublisher::connect(&common::rabbitmq_url())
        .await
        .unwrap();
    let m = Message::with_id("r-1", Destination::subject(&queue), "hello").header("k", "v");
    assert_eq!(publisher.publish_all(&[&m]).await, [Ok(())]);

    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "t".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let d = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(d.data, b"hello");
    assert_eq!(d.properties.message_id().as_ref().unwrap().as_str(), "r-1");
    assert_eq!(*d.properties.delivery_mode(), Some(2));
    d.ack(BasicAckOptions::default()).await.unwrap();

    // Refused for good: no such exchange, nothing routes it, too large. The channel
    // survives the missing exchange.
    let no_exchange =
        Message::with_id("r-2", Destination::exchange(format!("{queue}_x"), "k"), "x");
    let unroutable = Message::with_id("r-3", Destination::subject(format!("{queue}_none")), "x");
    let publisher = publisher.with_max_message_size(4);
    let large = Message::with_id("r-4", Destination::subject(&queue), "12345");
    let results = publisher
        .publish_all(&[&no_exchange, &unroutable, &large])
        .await;
    assert!(
        matches!(&results[0], Err(PublishError::Refused(e)) if e.contains("no exchange")),
        "{results:?}"
    );
    assert!(
        matches!(&results[1], Err(PublishError::Refused(e)) if e.contains("no queue")),
        "{results:?}"
    );
    assert!(
        matches!(&results[2], Err(PublishError::Refused(_))),
        "{results:?}"
    );
    let small = Message::with_id("r-5", Destination::subject(&queue), "ok");
    assert_eq!(publisher.publish_all(&[&small]).await, [Ok(())]);
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "bye".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_to_rabbit_parks_what_no_queue_takes_and_publishes_the_rest() {
    let Some(conn) = rabbit().await else { return };
    let queue = common::unique("rabbitrelay");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (pool, outbox) = sqlite_outbox(&dir).await;
    let mut messages: Vec<Message> = (0..20)
        .map(|i| Message::with_id(format!("m{i}"), Destination::subject(&queue), "x"))
        .collect();
    messages.push(event("lost").ordering_key("z"));
    stage(&pool, &outbox, &messages).await;
    let publisher = Arc::new(
        RabbitPublisher::connect(&common::rabbitmq_url())
            .await
            .unwrap(),
    );
    let relay = Relay::new(outbox.clone(), common::Shared(publisher));
    while relay.round().await.unwrap().claimed > 0 {}
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.published, stats.parked), (20, 1));
    let q = ch
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(q.message_count(), 20);
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "bye".into()).await;
}
