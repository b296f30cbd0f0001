//! Two independent pools on one database file (as two processes would have) race for
//! the same keys: SQLite's write lock and the one-statement reserve let exactly one
//! reserver per key win.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{ManualClock, Reservation, ReserveRequest, Store, StoredResponse};
use idem_sqlite::SqliteStore;

const KEYS: usize = 200;
const RESERVERS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pools_on_one_file_acquire_each_key_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("race.db").display());
    let clock = ManualClock::starting_now();
    let open = || {
        SqliteStore::builder()
            .clock(Arc::new(clock.clone()))
            .max_connections(4)
            .busy_timeout(Duration::from_secs(30))
            .connect(&url)
    };
    let (a, b) = tokio::join!(open(), open());
    let pools = [a.unwrap(), b.unwrap()];

    let requests: Arc<Vec<ReserveRequest>> = Arc::new(
        (0..KEYS)
            .map(|i| {
                ReserveRequest::new(
                    test_scope("/v1/orders", &format!("key-{i}")),
                    test_fingerprint(&format!(r#"{{"order":{i}}}"#)),
                )
            })
            .collect(),
    );
    // Each reserver walks every key, four through each pool, and all eight meet at a
    // barrier before each key so that every key is contended by all of them at once.
    let barriers: Arc<Vec<tokio::sync::Barrier>> = Arc::new(
        (0..KEYS)
            .map(|_| tokio::sync::Barrier::new(RESERVERS))
            .collect(),
    );
    let tasks: Vec<_> = (0..RESERVERS)
        .map(|r| {
            let store = pools[r % 2].clone();
            let (requests, barriers) = (requests.clone(), barriers.clone());
            tokio::spawn(async move {
                let mut out = Vec::with_capacity(KEYS);
                for (i, req) in requests.iter().enumerate() {
                    barriers[i].wait().await;
                    out.push((i, r % 2, store.reserve(req).await.expect("reserve")));
                }
                out
            })
        })
        .collect();

    let mut winners = HashMap::new();
    let mut in_progress = 0;
    for t in tasks {
        for (i, pool, res) in t.await.unwrap() {
            match res {
                Reservation::Acquired(lease) => {
                    assert_eq!(lease.attempt, 1);
                    let earlier = winners.insert(i, (pool, lease));
                    assert!(earlier.is_none(), "key {i} acquired twice");
                }
                Reservation::InProgress { .. } => in_progress += 1,
                other => panic!("key {i}: unexpected {other:?}"),
            }
        }
    }
    assert_eq!(winners.len(), KEYS, "every key acquired exactly once");
    assert_eq!(in_progress, KEYS * (RESERVERS - 1));
    let won_by_b = winners.values().filter(|(p, _)| *p == 1).count();
    println!("pool A won {} keys, pool B won {won_by_b}", KEYS - won_by_b);
    assert!(
        won_by_b > 0 && won_by_b < KEYS,
        "both pools should win some races"
    );

    // The stored rows are the winners', one per key.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(pools[0].pool())
        .await
        .unwrap();
    assert_eq!(rows, KEYS as i64);
    for (i, (_, lease)) in &winners {
        let record = pools[1].get(&requests[*i].scope).await.unwrap().unwrap();
        assert_eq!(record.token, lease.token, "key {i}");
    }

    // Each winner completes through its own pool; the other pool replays.
    for (i, (pool, lease)) in &winners {
        let resp = StoredResponse::new(201, format!("order {i}"));
        pools[*pool].complete(lease, &resp).await.unwrap();
        assert_eq!(
            pools[1 - *pool].reserve(&requests[*i]).await.unwrap(),
            Reservation::Replay(resp)
        );
    }
}
