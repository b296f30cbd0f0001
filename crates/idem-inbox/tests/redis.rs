//! `RedisInbox` against the Redis server (SPEC S12, the weaker variant).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_inbox::{Error, Inbox, Outcome, RedisInbox};
use idem_test_support::{Relay, WAIT, eventually, service_addr, url_via};
use redis::aio::MultiplexedConnection;

async fn inbox(case: &str) -> Option<RedisInbox<MultiplexedConnection>> {
    let conn = common::redis_conn().await?;
    let prefix = format!(
        "idem-inbox-test:{}",
        idem_core::testing::unique_namespace(case)
    );
    Some(
        RedisInbox::new(conn, "points")
            .unwrap()
            .with_prefix(prefix)
            .with_retention(Duration::from_secs(600)),
    )
}

async fn count(
    inbox: &RedisInbox<MultiplexedConnection>,
    id: &str,
    runs: &AtomicUsize,
) -> Outcome<()> {
    inbox
        .process(id, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok::<_, Error>(()) })
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn redis_duplicate_delivery_skips_effects() {
    let Some(inbox) = inbox("dup").await else {
        return;
    };
    let runs = AtomicUsize::new(0);
    assert_eq!(count(&inbox, "m-1", &runs).await, Outcome::Processed(()));
    assert_eq!(count(&inbox, "m-1", &runs).await, Outcome::Duplicate);
    assert_eq!(count(&inbox, "m-1", &runs).await, Outcome::Duplicate);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(inbox.contains("m-1").await.unwrap());
}

#[tokio::test]
async fn redis_done_marker_expires_with_retention() {
    let Some(inbox) = inbox("ttl").await else {
        return;
    };
    let inbox = inbox.with_retention(Duration::from_secs(3600));
    let runs = AtomicUsize::new(0);
    let _ = count(&inbox, "m-1", &runs).await;
    // Redis keeps time itself, so read the TTL it set rather than waiting it out.
    let mut conn = common::redis_conn().await.unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg(inbox.marker_key("m-1"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 3_590_000 && pttl <= 3_600_000, "{pttl}");
    assert_eq!(
        inbox.purge_expired(100).await.unwrap(),
        0,
        "native TTLs purge"
    );
}

#[tokio::test]
async fn redis_failed_effects_release_the_marker() {
    let Some(inbox) = inbox("fail").await else {
        return;
    };
    let r = inbox
        .process("m-1", |_| {
            Box::pin(async { Err::<(), _>(Error::handler("boom")) })
        })
        .await;
    assert!(matches!(r, Err(Error::Handler(_))));
    assert!(!inbox.contains("m-1").await.unwrap());
    let runs = AtomicUsize::new(0);
    assert_eq!(count(&inbox, "m-1", &runs).await, Outcome::Processed(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Starts processing `id` with effects that hold until released; returns once the
/// effects have started, with the sender that lets them finish with `value` and the
/// task that answers the processing's outcome.
async fn hold_effects<T: Send + 'static>(
    inbox: &RedisInbox<MultiplexedConnection>,
    id: &'static str,
    value: T,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<Outcome<T>, Error>>,
) {
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let inbox = inbox.clone();
    let task = tokio::spawn(async move {
        inbox
            .process(id, move |_| {
                Box::pin(async move {
                    entered_tx.send(()).unwrap();
                    release_rx.await.unwrap();
                    Ok::<_, Error>(value)
                })
            })
            .await
    });
    entered_rx.await.unwrap();
    (release_tx, task)
}

#[tokio::test]
async fn redis_delivery_during_effects_is_in_flight_with_retry_after() {
    let Some(inbox) = inbox("inflight").await else {
        return;
    };
    let (release_tx, first) = hold_effects(&inbox, "m-1", ()).await;
    let runs = AtomicUsize::new(0);
    let second = inbox
        .process("m-1", |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok::<_, Error>(()) })
        })
        .await;
    match second {
        Err(Error::InFlight { retry_after }) => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= idem_inbox::DEFAULT_IN_FLIGHT_LEASE
            )
        }
        other => panic!("expected InFlight, got {other:?}"),
    }
    release_tx.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Processed(()));
    assert_eq!(count(&inbox, "m-1", &runs).await, Outcome::Duplicate);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_effects_keep_their_marker_past_the_lease() {
    let Some(inbox) = inbox("slow").await else {
        return;
    };
    // Renewed every second; without renewals the marker would lapse at 3 s and the
    // next delivery would run the effects a second time. A renewal may come two
    // seconds late, as on a loaded machine, and still keep it.
    let lease = Duration::from_secs(3);
    let inbox = inbox.with_in_flight_lease(lease);
    let (release_tx, first) = hold_effects(&inbox, "m-slow", "charged").await;
    // Redeliveries for three leases' worth of Redis's own time all find it in flight.
    let runs = AtomicUsize::new(0);
    let until = tokio::time::Instant::now() + lease * 3;
    let mut tries = 0;
    while tokio::time::Instant::now() < until {
        let r = inbox
            .process("m-slow", |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok::<_, Error>("charged again") })
            })
            .await;
        assert!(matches!(r, Err(Error::InFlight { .. })), "{r:?}");
        tries += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(tries > 10);
    release_tx.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Processed("charged"));
    assert_eq!(count(&inbox, "m-slow", &runs).await, Outcome::Duplicate);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the effects ran once");
}

/// Waits until `key` is gone from Redis (it expired, or was released); panics, saying
/// `what`, when it is still there after `within`.
async fn wait_gone(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    within: Duration,
    what: &str,
) {
    eventually(what, within, async || {
        let mut conn = conn.clone();
        let exists: bool = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        !exists
    })
    .await
}

#[tokio::test]
async fn redis_lapsed_in_flight_marker_lets_redelivery_run_effects_again() {
    // The documented weakness: a consumer that died mid-effects leaves a marker that
    // lapses, and the redelivery runs the effects a second time.
    let Some(inbox) = inbox("lapse").await else {
        return;
    };
    // Long enough that the process below still finds the marker on a loaded machine.
    let lease = Duration::from_secs(2);
    let inbox = inbox.with_in_flight_lease(lease);
    let mut conn = common::redis_conn().await.unwrap();
    // A crashed consumer's marker: in flight, never finished.
    let key = inbox.marker_key("m-1");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("in-flight:dead")
        .arg("PX")
        .arg(lease.as_millis() as u64)
        .query_async(&mut conn)
        .await
        .unwrap();
    let runs = AtomicUsize::new(0);
    let r = inbox
        .process("m-1", |_| Box::pin(async { Ok::<_, Error>(()) }))
        .await;
    assert!(matches!(r, Err(Error::InFlight { .. })), "{r:?}");
    // Redis expires keys on its own clock; wait past the lease, bounded.
    wait_gone(&conn, &key, lease + WAIT, "the marker lapsed").await;
    assert_eq!(count(&inbox, "m-1", &runs).await, Outcome::Processed(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_concurrent_deliveries_run_effects_once() {
    let Some(inbox) = inbox("race").await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (inbox, runs, barrier) = (inbox.clone(), runs.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                inbox
                    .process("m-race", move |_| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Box::pin(async { Ok::<_, Error>(()) })
                    })
                    .await
            })
        })
        .collect();
    let mut processed = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(Outcome::Processed(())) => processed += 1,
            Ok(Outcome::Duplicate) | Err(Error::InFlight { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(processed, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A `SET NX` of the in-flight marker that ran on Redis but whose reply was lost does
/// not hold the message back for the whole lease: with a reconnecting connection the
/// inbox deletes the marker it may have set (fenced by its token), and the next
/// delivery runs the effects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_reply_to_the_in_flight_mark_frees_the_message() {
    let url = common::redis_url();
    let Some(_) = common::redis_conn().await else {
        return;
    };
    let target = service_addr(&url, 6379).await;
    let relay = Relay::start(target).await;
    let through = url_via(&url, relay.addr());
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(through).unwrap())
        .await
        .unwrap();
    let prefix = format!(
        "idem-inbox-test:{}",
        idem_core::testing::unique_namespace("lost")
    );
    let inbox = RedisInbox::new(conn, "points").unwrap().with_prefix(prefix);
    let runs = AtomicUsize::new(0);
    let run = || {
        inbox.process("m-lost-reply", |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok::<_, Error>(()) })
        })
    };

    relay.lose_reply_to(b"m-lost-reply");
    assert!(matches!(run().await, Err(Error::Redis(_))));
    assert_eq!(relay.replies_lost(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // The in-flight lease is 60 s; without the release the message would wait that long.
    let mut direct = common::redis_conn().await.unwrap();
    let key = inbox.marker_key("m-lost-reply");
    wait_gone(
        &direct,
        &key,
        Duration::from_secs(30),
        "the lost mark no longer holds the message",
    )
    .await;
    assert_eq!(run().await.unwrap(), Outcome::Processed(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut direct)
        .await
        .unwrap();
}
