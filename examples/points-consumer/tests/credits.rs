//! The example end to end against the NATS server: credits published twice (a
//! publisher's retry) and consumed through the inbox land once each.

use std::time::Duration;

use idem_core::testing::unique_namespace;
use idem_test_support::service_unavailable;
use idem_test_support::services::nats_url;
use points_consumer::{Credit, Ledger, Names, credit_handler, ensure_stream, publish};

#[tokio::test]
async fn credits_published_twice_are_applied_once() {
    let url = nats_url();
    let client = match async_nats::connect(&url).await {
        Ok(c) => c,
        Err(e) => return service_unavailable("NATS", &url, &e).unwrap_or(()),
    };
    let js = async_nats::jetstream::new(client);
    let ns = unique_namespace("points");
    let names = Names {
        stream: format!("POINTS_{ns}"),
        subject: format!("points.{ns}"),
        consumer: "points-ledger".to_owned(),
    };
    ensure_stream(&js, &names).await.unwrap();
    let credits: Vec<_> = (0..50)
        .map(|i| {
            let credit = Credit {
                account: format!("acct-{}", i % 3),
                points: i + 1,
            };
            (format!("credit-{i}"), credit)
        })
        .collect();
    assert_eq!(publish(&js, &names, &credits).await.unwrap(), (50, 0));
    assert_eq!(publish(&js, &names, &credits).await.unwrap(), (0, 50));

    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("points.db")).await.unwrap();
    let consumer = ledger.consumer(js.clone(), &names).await.unwrap();
    let mut watched = consumer.consumer().clone();
    let drained = async move {
        for _ in 0..300 {
            let info = watched.info().await.unwrap();
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("not drained within 30 s");
    };
    let stats = consumer.run(credit_handler(), drained).await.unwrap();
    assert_eq!(
        (stats.processed, stats.duplicates, stats.failed),
        (50, 0, 0)
    );

    let expected = |k: i64| (0..50).filter(|i| i % 3 == k).map(|i| i + 1).sum::<i64>();
    assert_eq!(
        ledger.balances().await.unwrap(),
        vec![
            ("acct-0".to_owned(), expected(0)),
            ("acct-1".to_owned(), expected(1)),
            ("acct-2".to_owned(), expected(2)),
        ]
    );
    js.delete_stream(&names.stream).await.unwrap();
}
