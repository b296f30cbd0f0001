//! The relay's figures (issue 41 §4), against the live PostgreSQL, NATS and RabbitMQ:
//!
//! - **throughput**: messages per second the relay publishes, confirmed and marked,
//!   against the broker's own floor measured in the same run (the same client
//!   publishing confirmed messages in batches without an outbox);
//! - **latency** from the staging transaction's commit to a subscriber receiving the
//!   message (p50, p99), with the relay idle-waiting on `LISTEN/NOTIFY`.
//!
//! `cargo bench -p idem-outbox --bench relay` (`OUTBOX_BENCH_N` messages, default 5000;
//! `OUTBOX_BENCH_BATCH` per round, default 256).
//! It prints figures and asserts nothing.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use idem_outbox::{
    Destination, Message, NatsPublisher, Outbox, PgOutbox, Publish, RabbitPublisher, Relay,
    RelayOptions,
};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use sqlx::AssertSqlSafe;

/// Messages per relay round, and per confirmed batch of the floor
/// (`OUTBOX_BENCH_BATCH`, default 256).
fn batch() -> usize {
    std::env::var("OUTBOX_BENCH_BATCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

fn messages(n: usize, destination: &Destination, tag: &str) -> Vec<Message> {
    (0..n)
        .map(|i| Message::with_id(format!("{tag}-{i}"), destination.clone(), vec![b'x'; 256]))
        .collect()
}

/// The broker's floor: the publisher alone, batches of [`batch`] confirmed.
async fn floor<P: Publish>(publisher: &P, messages: &[Message]) -> f64 {
    let started = Instant::now();
    for chunk in messages.chunks(batch()) {
        let refs: Vec<&Message> = chunk.iter().collect();
        for r in publisher.publish_all(&refs).await {
            r.expect("confirmed");
        }
    }
    messages.len() as f64 / started.elapsed().as_secs_f64()
}

async fn stage(outbox: &PgOutbox, messages: &[Message]) {
    for chunk in messages.chunks(500) {
        let mut tx = outbox.pool().begin().await.unwrap();
        for m in chunk {
            outbox.stage(&mut tx, m).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
}

/// `relays` relays (each with its own publisher) draining `messages` staged beforehand,
/// in rounds of [`batch`]: several relays overlap one's database work with another's
/// publishing, as several instances of a service do.
async fn relay_throughput<P, F>(
    outbox: &PgOutbox,
    relays: usize,
    publisher: F,
    messages: &[Message],
) -> f64
where
    P: Publish,
    F: AsyncFn() -> P,
{
    stage(outbox, messages).await;
    let mut all = Vec::new();
    for _ in 0..relays {
        all.push(
            Relay::new(outbox.clone(), publisher().await).with_options(RelayOptions {
                batch: batch(),
                ..RelayOptions::default()
            }),
        );
    }
    let started = Instant::now();
    let rounds = all.iter().map(|relay| async move {
        loop {
            let r = relay.round().await.unwrap();
            assert_eq!(r.failed + r.parked, 0, "{r:?}");
            if r.claimed == 0 {
                break;
            }
        }
    });
    futures_util::future::join_all(rounds).await;
    assert_eq!(outbox.stats().await.unwrap().unpublished, 0);
    messages.len() as f64 / started.elapsed().as_secs_f64()
}

/// Stages `n` messages one per transaction at `rate` per second while a relay runs;
/// `received` yields the body (the commit time in µs) of each message a subscriber got.
async fn latency<P: Publish>(
    outbox: &PgOutbox,
    publisher: P,
    destination: &Destination,
    n: usize,
    rate: u32,
    mut received: futures_util::stream::BoxStream<'static, Vec<u8>>,
) -> (Duration, Duration) {
    let relay = Arc::new(Relay::new(outbox.clone(), publisher));
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    let staging = {
        let outbox = outbox.clone();
        let destination = destination.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
            for i in 0..n {
                tick.tick().await;
                let mut tx = outbox.pool().begin().await.unwrap();
                let m = Message::with_id(format!("lat-{i}"), destination.clone(), Vec::new());
                outbox.stage(&mut tx, &m).await.unwrap();
                tx.commit().await.unwrap();
                // Timed after the commit returned, matched by id when it arrives.
                COMMITS.lock().unwrap().insert(m.id, now_us());
            }
        })
    };
    let mut latencies = Vec::with_capacity(n);
    while latencies.len() < n {
        let id = received.next().await.expect("a message");
        let at = now_us();
        let id = String::from_utf8(id).unwrap();
        let committed = loop {
            if let Some(t) = COMMITS.lock().unwrap().remove(&id) {
                break t;
            }
            tokio::task::yield_now().await;
        };
        latencies.push(Duration::from_micros(at.saturating_sub(committed) as u64));
    }
    staging.await.unwrap();
    stop.send(()).unwrap();
    running.await.unwrap();
    latencies.sort();
    let p = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    (p(0.50), p(0.99))
}

static COMMITS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, u128>>> =
    std::sync::LazyLock::new(Default::default);

fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

async fn fresh_outbox(pool: &sqlx::PgPool, name: &str) -> PgOutbox {
    sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {name}")))
        .execute(pool)
        .await
        .unwrap();
    let outbox = PgOutbox::new(pool.clone()).with_table(name).unwrap();
    outbox.migrate().await.unwrap();
    outbox
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("OUTBOX_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let tag = format!("{}", std::process::id());
    let pg = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        ))
        .await
        .expect("PostgreSQL");
    let table = format!("bench_outbox_{tag}");
    println!(
        "idem-outbox relay bench: {n} messages of 256 bytes, batches of {}, PostgreSQL outbox",
        batch()
    );

    // NATS JetStream.
    let client = async_nats::connect(url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222"))
        .await
        .expect("NATS");
    let js = async_nats::jetstream::new(client.clone());
    let stream = format!("OUTBOX_BENCH_{tag}");
    let subject = format!("outbox_bench.{tag}");
    js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![subject.clone()],
        max_age: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .unwrap();
    let to_nats = Destination::subject(&subject);
    let floor_nats = floor(
        &NatsPublisher::new(js.clone()),
        &messages(n, &to_nats, "floor"),
    )
    .await;
    let mut relay_nats = Vec::new();
    for relays in [1, 2] {
        let outbox = fresh_outbox(&pg, &table).await;
        let batch = messages(n, &to_nats, &format!("relay{relays}"));
        let js = js.clone();
        let publisher = async || NatsPublisher::new(js.clone());
        relay_nats.push(relay_throughput(&outbox, relays, publisher, &batch).await);
    }
    let subscriber = client.subscribe(subject.clone()).await.unwrap();
    let ids = subscriber
        .map(|m| {
            m.headers
                .and_then(|h| h.get("Nats-Msg-Id").map(|v| v.as_str().as_bytes().to_vec()))
                .unwrap_or_default()
        })
        .boxed();
    let outbox = fresh_outbox(&pg, &table).await;
    let (p50_nats, p99_nats) = latency(
        &outbox,
        NatsPublisher::new(js.clone()),
        &to_nats,
        n.min(2000),
        200,
        ids,
    )
    .await;
    js.delete_stream(&stream).await.unwrap();
    println!(
        "NATS JetStream: floor {floor_nats:.0} msg/s; 1 relay {:.0} msg/s ({:.2}x), 2 relays {:.0} msg/s ({:.2}x); commit to subscriber p50 {p50_nats:.1?}, p99 {p99_nats:.1?} (200 msg/s)",
        relay_nats[0],
        relay_nats[0] / floor_nats,
        relay_nats[1],
        relay_nats[1] / floor_nats
    );

    // RabbitMQ.
    let amqp = url(
        "IDEM_TEST_RABBITMQ_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    );
    let conn = lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default())
        .await
        .expect("RabbitMQ");
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("outbox_bench.{tag}");
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let to_rabbit = Destination::subject(&queue);
    let publisher = RabbitPublisher::connect(&amqp).await.unwrap();
    let floor_rabbit = floor(&publisher, &messages(n, &to_rabbit, "floor")).await;
    let mut relay_rabbit = Vec::new();
    for relays in [1, 2] {
        let outbox = fresh_outbox(&pg, &table).await;
        let batch = messages(n, &to_rabbit, &format!("relay{relays}"));
        let publisher = async || RabbitPublisher::connect(&amqp).await.unwrap();
        relay_rabbit.push(relay_throughput(&outbox, relays, publisher, &batch).await);
    }
    ch.queue_purge(queue.as_str().into(), Default::default())
        .await
        .unwrap();
    let consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let ids = consumer
        .then(|d| async move {
            let d = d.unwrap();
            d.ack(BasicAckOptions::default()).await.unwrap();
            d.properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().as_bytes().to_vec())
                .unwrap_or_default()
        })
        .boxed();
    let outbox = fresh_outbox(&pg, &table).await;
    let (p50_rabbit, p99_rabbit) = latency(
        &outbox,
        RabbitPublisher::connect(&amqp).await.unwrap(),
        &to_rabbit,
        n.min(2000),
        200,
        ids,
    )
    .await;
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    println!(
        "RabbitMQ: floor {floor_rabbit:.0} msg/s; 1 relay {:.0} msg/s ({:.2}x), 2 relays {:.0} msg/s ({:.2}x); commit to consumer p50 {p50_rabbit:.1?}, p99 {p99_rabbit:.1?} (200 msg/s)",
        relay_rabbit[0],
        relay_rabbit[0] / floor_rabbit,
        relay_rabbit[1],
        relay_rabbit[1] / floor_rabbit
    );
    sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(&pg)
        .await
        .unwrap();
}
