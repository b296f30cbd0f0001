//! Inbox behaviours every SQL backend must show (SPEC S12). A backend test file
//! implements [`Backend`] and expands [`inbox_cases!`](crate::inbox_cases).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{ManualClock, SharedClock};
use idem_inbox::{BoxFuture, Error, Inbox, Outcome, PurgeConfig};

/// One backend under test: an inbox and a ledger table next to it in the same database.
pub trait Backend: Clone + Send + Sync + Sized + 'static {
    /// The inbox type.
    type I: Inbox + Clone;

    /// An inbox for `consumer` reading time from `clock`, on the backend's table
    /// (every inbox of one backend shares it, as consumers sharing a database do).
    fn inbox(
        &self,
        consumer: &str,
        retention: Duration,
        clock: SharedClock,
    ) -> impl Future<Output = Self::I> + Send;

    /// The ledger table's name.
    fn ledger_table(&self) -> String;

    /// The effect: appends `(message_id, amount)` to table `ledger` inside `tx`.
    fn credit<'t>(
        tx: &'t mut <Self::I as Inbox>::Tx,
        ledger: String,
        message_id: String,
        amount: i64,
    ) -> BoxFuture<'t, Result<(), Error>>;

    /// The ledger's rows, sorted by message id.
    fn ledger(&self) -> impl Future<Output = Vec<(String, i64)>> + Send;

    /// Drops what the case created in a shared database.
    fn cleanup(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Expands to one `#[tokio::test]` per case for the backend that `$setup` (an async
/// fn returning `Option<B>`) builds.
#[macro_export]
macro_rules! inbox_cases {
    ($setup:path) => {
        $crate::inbox_cases!(@cases $setup;
            first_delivery_applies_effects_and_records_message,
            duplicate_delivery_skips_effects,
            failed_effects_roll_back_and_redelivery_applies_once,
            concurrent_deliveries_apply_effects_exactly_once,
            consumers_deduplicate_independently,
            purge_removes_only_rows_past_retention_in_bounded_batches,
            message_purged_after_retention_is_processed_again,
            invalid_message_id_is_rejected_without_effects,
            retention_shorter_than_broker_window_warns
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

const DAY: Duration = Duration::from_secs(24 * 3600);

fn clock() -> (ManualClock, SharedClock) {
    let c = ManualClock::starting_now();
    (c.clone(), Arc::new(c))
}

async fn credit_once<I: Inbox, B: Backend<I = I>>(
    b: &B,
    inbox: &I,
    id: &str,
    amount: i64,
    runs: &AtomicUsize,
) -> Result<Outcome<()>, Error> {
    let id_owned = id.to_owned();
    let ledger = b.ledger_table();
    inbox
        .process(id, move |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            B::credit(tx, ledger, id_owned, amount)
        })
        .await
}

pub async fn first_delivery_applies_effects_and_records_message<B: Backend>(b: B) {
    let (_, clock) = clock();
    let inbox = b.inbox("points", DAY, clock).await;
    let runs = AtomicUsize::new(0);
    let out = credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap();
    assert_eq!(out, Outcome::Processed(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(b.ledger().await, vec![("m-1".to_owned(), 10)]);
    assert!(inbox.contains("m-1").await.unwrap());
    assert!(!inbox.contains("m-2").await.unwrap());
}

pub async fn duplicate_delivery_skips_effects<B: Backend>(b: B) {
    let (_, clock) = clock();
    let inbox = b.inbox("points", DAY, clock).await;
    let runs = AtomicUsize::new(0);
    assert_eq!(
        credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap(),
        Outcome::Processed(())
    );
    for _ in 0..3 {
        assert_eq!(
            credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap(),
            Outcome::Duplicate
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "effects ran once");
    assert_eq!(b.ledger().await, vec![("m-1".to_owned(), 10)]);
}

pub async fn failed_effects_roll_back_and_redelivery_applies_once<B: Backend>(b: B) {
    let (_, clock) = clock();
    let inbox = b.inbox("points", DAY, clock).await;
    // The effects write, then fail: the write and the inbox row roll back together.
    let ledger = b.ledger_table();
    let failed = inbox
        .process("m-1", |tx| {
            Box::pin(async move {
                B::credit(tx, ledger, "m-1".to_owned(), 10).await?;
                Err::<(), _>(Error::handler("downstream refused"))
            })
        })
        .await;
    assert!(matches!(failed, Err(Error::Handler(_))), "{failed:?}");
    assert_eq!(b.ledger().await, vec![]);
    assert!(!inbox.contains("m-1").await.unwrap());
    // The redelivery runs the effects and commits.
    let runs = AtomicUsize::new(0);
    assert_eq!(
        credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(b.ledger().await, vec![("m-1".to_owned(), 10)]);
}

pub async fn concurrent_deliveries_apply_effects_exactly_once<B: Backend>(b: B) {
    let (_, clock) = clock();
    let inbox = b.inbox("points", DAY, clock).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (inbox, runs, barrier) = (inbox.clone(), runs.clone(), barrier.clone());
            let ledger = b.ledger_table();
            tokio::spawn(async move {
                barrier.wait().await;
                inbox
                    .process("m-race", move |tx| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Box::pin(async move {
                            B::credit(tx, ledger, "m-race".to_owned(), 5).await?;
                            // Hold the transaction open so the others pile up on it.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Ok::<_, Error>(())
                        })
                    })
                    .await
            })
        })
        .collect();
    let mut processed = 0;
    let mut duplicates = 0;
    for t in tasks {
        match t.await.unwrap().unwrap() {
            Outcome::Processed(()) => processed += 1,
            Outcome::Duplicate => duplicates += 1,
        }
    }
    assert_eq!((processed, duplicates), (1, 15));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "effects ran once");
    assert_eq!(b.ledger().await, vec![("m-race".to_owned(), 5)]);
}

pub async fn consumers_deduplicate_independently<B: Backend>(b: B) {
    let (_, clock) = clock();
    let points = b.inbox("points", DAY, clock.clone()).await;
    let mailer = points_sibling(&b, "mailer", clock).await;
    let runs = AtomicUsize::new(0);
    assert_eq!(
        credit_once(&b, &points, "m-1", 1, &runs).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        credit_once(&b, &mailer, "m-1", 2, &runs).await.unwrap(),
        Outcome::Processed(()),
        "another consumer's record of m-1 is not this one's"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A second consumer on the same table as the backend's last inbox.
async fn points_sibling<B: Backend>(b: &B, consumer: &str, clock: SharedClock) -> B::I {
    b.inbox(consumer, DAY, clock).await
}

pub async fn purge_removes_only_rows_past_retention_in_bounded_batches<B: Backend>(b: B) {
    let (manual, clock) = clock();
    let retention = Duration::from_secs(3600);
    let inbox = b.inbox("points", retention, clock).await;
    let runs = AtomicUsize::new(0);
    for i in 0..25 {
        let _ = credit_once(&b, &inbox, &format!("old-{i:02}"), 1, &runs)
            .await
            .unwrap();
    }
    manual.advance(Duration::from_secs(1800));
    for i in 0..5 {
        let _ = credit_once(&b, &inbox, &format!("new-{i:02}"), 1, &runs)
            .await
            .unwrap();
    }
    // The old rows are past retention, the new ones not.
    manual.advance(Duration::from_secs(1801));
    assert_eq!(
        inbox.purge_expired(10).await.unwrap(),
        10,
        "one bounded batch"
    );
    let cfg = PurgeConfig {
        batch: 10,
        max_batches: 1,
    };
    assert_eq!(
        inbox.purge(cfg).await.unwrap(),
        10,
        "bounded by max_batches"
    );
    assert_eq!(inbox.purge(PurgeConfig::default()).await.unwrap(), 5);
    assert_eq!(inbox.purge(PurgeConfig::default()).await.unwrap(), 0);
    for i in 0..25 {
        assert!(!inbox.contains(&format!("old-{i:02}")).await.unwrap());
    }
    for i in 0..5 {
        assert!(inbox.contains(&format!("new-{i:02}")).await.unwrap());
    }
}

pub async fn message_purged_after_retention_is_processed_again<B: Backend>(b: B) {
    // The documented hole: past retention the inbox forgets, so retention must cover
    // the broker's redelivery window.
    let (manual, clock) = clock();
    let inbox = b.inbox("points", Duration::from_secs(60), clock).await;
    let runs = AtomicUsize::new(0);
    let _ = credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap();
    manual.advance(Duration::from_secs(30));
    assert_eq!(
        inbox.purge_expired(100).await.unwrap(),
        0,
        "within retention"
    );
    assert_eq!(
        credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap(),
        Outcome::Duplicate
    );
    manual.advance(Duration::from_secs(31));
    assert_eq!(inbox.purge_expired(100).await.unwrap(), 1);
    assert_eq!(
        credit_once(&b, &inbox, "m-1", 10, &runs).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

pub async fn invalid_message_id_is_rejected_without_effects<B: Backend>(b: B) {
    let (_, clock) = clock();
    let inbox = b.inbox("points", DAY, clock).await;
    let runs = AtomicUsize::new(0);
    for bad in [String::new(), "x".repeat(idem_inbox::MAX_ID_LEN + 1)] {
        let r = credit_once(&b, &inbox, &bad, 1, &runs).await;
        assert!(
            matches!(
                r,
                Err(Error::Invalid {
                    what: "message id",
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(b.ledger().await, vec![]);
}

pub async fn retention_shorter_than_broker_window_warns<B: Backend>(b: B) {
    let (_, clock) = clock();
    let inbox = b.inbox("points", Duration::from_secs(60), clock).await;
    let w = inbox
        .check_retention(Duration::from_secs(120))
        .expect("a warning");
    assert_eq!(w.consumer, "points");
    assert_eq!(w.retention, Duration::from_secs(60));
    assert!(inbox.check_retention(Duration::from_secs(60)).is_none());
}
