//! Key-rate buckets on MySQL ([`Store::take_rate_token`]): shared by every instance on a
//! table, made by many at once without a deadlock, refilled by the store's clock, and
//! forgotten by the purge once full.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::unique_namespace;
use idem_core::{KeyRate, ManualClock, Store};
use idem_mysql::MySqlStore;
use idem_test_support::figure;

/// A second instance on `ns`'s table with a pool of its own, reading `clock`.
fn second_instance(clock: &ManualClock, ns: &str) -> MySqlStore {
    MySqlStore::builder()
        .table(common::table_for(ns))
        .clock(Arc::new(clock.clone()))
        .acquire_timeout(Duration::from_secs(10))
        .operation_timeout(Duration::from_secs(30))
        .connect_lazy(&common::mysql_url())
        .expect("a lazy store")
}

/// `n` takes from `bucket` at once, alternating between the two instances; how many
/// got a token.
async fn takes_at_once(stores: [&MySqlStore; 2], bucket: &str, rate: KeyRate, n: usize) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = stores[i % 2].clone();
            let bucket = bucket.to_owned();
            tokio::spawn(async move { store.take_rate_token(&bucket, &rate).await })
        })
        .collect();
    let mut taken = 0;
    for task in tasks {
        match task.await.expect("task").expect("take") {
            Some(true) => taken += 1,
            Some(false) => {}
            None => panic!("the MySQL store keeps shared buckets"),
        }
    }
    taken
}

/// Two instances (two pools) on one table: 40 takes at once from a bucket of 8 grant
/// exactly 8, whichever instance each reached; a quarter of a second at 4 a second gives
/// back one token, which one of 10 takes at once gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_on_one_table_share_each_bucket() {
    let clock = ManualClock::starting_now();
    let ns = unique_namespace("rate_shared");
    let Some(a) = common::store_with_clock(&clock, &ns).await else {
        return;
    };
    let b = second_instance(&clock, &ns);
    let rate = KeyRate::new(4.0, 8).expect("a rate");
    let bucket = format!("tenant-{ns}");
    assert_eq!(takes_at_once([&a, &b], &bucket, rate, 40).await, 8);
    assert_eq!(
        b.take_rate_token(&bucket, &rate).await.unwrap(),
        Some(false)
    );
    clock.advance(Duration::from_millis(249));
    assert_eq!(
        a.take_rate_token(&bucket, &rate).await.unwrap(),
        Some(false)
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(takes_at_once([&a, &b], &bucket, rate, 10).await, 1);
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        takes_at_once([&a, &b], &bucket, rate, 20).await,
        8,
        "a bucket refills to its burst, no further"
    );
    b.pool().close().await;
}

/// Sixteen takes at once, split between two instances, on a bucket nobody made yet,
/// twenty times over: each round grants exactly the burst of 3, and InnoDB rolls no
/// statement back for a deadlock or a lock wait (the instances' retry counters stay 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_making_one_bucket_at_once_neither_deadlock_nor_overgrant() {
    let clock = ManualClock::starting_now();
    let ns = unique_namespace("rate_new");
    let Some(a) = common::store_with_clock(&clock, &ns).await else {
        return;
    };
    let b = second_instance(&clock, &ns);
    let rate = KeyRate::new(1.0, 3).expect("a rate");
    for round in 0..20 {
        let bucket = format!("tenant-{round}");
        assert_eq!(
            takes_at_once([&a, &b], &bucket, rate, 16).await,
            3,
            "round {round}"
        );
    }
    let retries = |s: &MySqlStore| figure(s, "idem_mysql_lock_retries_total");
    assert_eq!((retries(&a), retries(&b)), (0, 0));
    b.pool().close().await;
}

/// A bucket nobody took from for its refill time is full: the purge deletes its row
/// (counting it as no record), and the next take finds a full bucket again.
#[tokio::test]
async fn the_purge_forgets_full_buckets_only() {
    let clock = ManualClock::starting_now();
    let ns = unique_namespace("rate_purge");
    let Some(store) = common::store_with_clock(&clock, &ns).await else {
        return;
    };
    let rate = KeyRate::new(1.0, 2).expect("a rate");
    let rows = async || -> i64 {
        let rate_table = idem_mysql::schema::rate_table(store.table());
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {rate_table}"
        )))
        .fetch_one(store.pool())
        .await
        .expect("count")
    };
    for _ in 0..2 {
        assert_eq!(store.take_rate_token("t", &rate).await.unwrap(), Some(true));
    }
    assert_eq!(
        store.take_rate_token("t", &rate).await.unwrap(),
        Some(false)
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(store.purge_expired(100).await.unwrap(), 0);
    assert_eq!(rows().await, 1, "a bucket within its refill time stays");
    clock.advance(Duration::from_millis(1001));
    assert_eq!(
        store.purge_expired(100).await.unwrap(),
        0,
        "no record purged"
    );
    assert_eq!(rows().await, 0, "a full bucket is forgotten");
    for _ in 0..2 {
        assert_eq!(store.take_rate_token("t", &rate).await.unwrap(), Some(true));
    }
    assert_eq!(
        store.take_rate_token("t", &rate).await.unwrap(),
        Some(false)
    );
}
