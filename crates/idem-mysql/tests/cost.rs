//! What a reserve costs the server, counted by the server: the statements and pings one
//! reserve sends, for a new key, a key in progress, a completed key and a takeover.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{ManualClock, Reservation, ReserveRequest, Store, StoredResponse};
use idem_mysql::MySqlStore;
use sqlx::Executor;

/// The session's counters a reserve moves: the statements by kind, and the
/// administrative commands (`COM_PING` is one).
const COUNTERS: &str = "SHOW SESSION STATUS WHERE Variable_name IN ('Com_admin_commands',
     'Com_select', 'Com_insert', 'Com_update', 'Com_delete', 'Com_begin', 'Com_commit',
     'Com_rollback')";

/// One reserve's cost: statements (inserts, updates, selects, transaction boundaries),
/// and pings.
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    statements: i64,
    pings: i64,
}

async fn counters(store: &MySqlStore) -> Vec<(String, i64)> {
    let mut conn = store.pool().acquire().await.expect("the one connection");
    let rows = conn.fetch_all(COUNTERS).await.expect("status");
    rows.iter()
        .map(|r| {
            let name: String = sqlx::Row::get(r, 0);
            let value: String = sqlx::Row::get(r, 1);
            (name, value.parse().expect("a count"))
        })
        .collect()
}

/// What `op` cost on the store's one connection, less what reading the counters costs
/// (measured the same way with nothing between).
async fn cost_of(store: &MySqlStore, op: impl Future<Output = ()>) -> Cost {
    let figure =
        |c: &[(String, i64)], name: &str| c.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
    let statements = |c: &[(String, i64)]| {
        [
            "Com_select",
            "Com_insert",
            "Com_update",
            "Com_delete",
            "Com_begin",
            "Com_commit",
            "Com_rollback",
        ]
        .iter()
        .map(|n| figure(c, n))
        .sum::<i64>()
    };
    let a = counters(store).await;
    let b = counters(store).await;
    op.await;
    let c = counters(store).await;
    let pings = |c: &[(String, i64)]| figure(c, "Com_admin_commands");
    let idle = (statements(&b) - statements(&a), pings(&b) - pings(&a));
    Cost {
        statements: statements(&c) - statements(&b) - idle.0,
        pings: pings(&c) - pings(&b) - idle.1,
    }
}

/// Counted on a store of one connection (so that every command of the reserve is on
/// the session counted), the statements warmed up (prepared once) first, without
/// batching. A new key is its insert; a key in progress or completed, the refused
/// insert and a read; a takeover, those and the fenced update. The pool pings a
/// connection as it returns (sqlx does, whatever the options): once for the insert,
/// once for the read and the takeover, which share a connection; and no ping before use
/// of a connection that was in use a moment before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_reserve_costs_the_server() {
    let Some(costs) = costs(false).await else {
        return;
    };
    let cost = |statements, pings| Cost { statements, pings };
    assert_eq!(costs, [cost(1, 1), cost(2, 2), cost(2, 2), cost(3, 2)]);
}

/// The same through the batch queue (a batch of one): the same statements, on the
/// drainer's connection, which goes back to the pool (one ping) once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_batched_reserve_costs_the_server() {
    let Some(costs) = costs(true).await else {
        return;
    };
    let cost = |statements, pings| Cost { statements, pings };
    assert_eq!(costs, [cost(1, 1), cost(2, 1), cost(2, 1), cost(3, 1)]);
}

/// A new key's, a key in progress's, a completed key's and a takeover's costs.
async fn costs(batching: bool) -> Option<[Cost; 4]> {
    let clock = ManualClock::starting_now();
    let ns = unique_namespace("cost");
    let options = MySqlStore::builder()
        .clock(Arc::new(clock.clone()))
        .max_connections(1)
        .batching(batching)
        .wait_poll(Duration::ZERO);
    let store = common::connect(options, &ns).await?;
    let request =
        |key: &str| ReserveRequest::new(test_scope("/v1/charges", key), test_fingerprint("{}"));
    let reserve = async |req: &ReserveRequest| store.reserve(req).await.expect("reserve");
    // Warm-up: every statement prepared once on the connection.
    let warm = request("warm");
    let Reservation::Acquired(lease) = reserve(&warm).await else {
        panic!("a new key");
    };
    reserve(&warm).await;
    store
        .complete(&lease, &StoredResponse::new(201, "made"))
        .await
        .unwrap();
    reserve(&warm).await;
    let lapsed = request("warm-lapsed");
    reserve(&lapsed).await;
    clock.advance(lapsed.lease + Duration::from_secs(1));
    reserve(&lapsed).await;

    let fresh = request("fresh");
    let new = cost_of(&store, async {
        assert!(matches!(reserve(&fresh).await, Reservation::Acquired(_)));
    })
    .await;
    let in_progress = cost_of(&store, async {
        assert!(matches!(
            reserve(&fresh).await,
            Reservation::InProgress { .. }
        ));
    })
    .await;
    let done = request("done");
    let Reservation::Acquired(lease) = reserve(&done).await else {
        panic!("a new key");
    };
    store
        .complete(&lease, &StoredResponse::new(201, "made"))
        .await
        .unwrap();
    let completed = cost_of(&store, async {
        let answer = reserve(&done).await;
        assert!(matches!(answer, Reservation::Replay(_)), "{answer:?}");
    })
    .await;
    clock.advance(fresh.lease + Duration::from_secs(1));
    let takeover = cost_of(&store, async {
        match reserve(&fresh).await {
            Reservation::Acquired(lease) => assert_eq!(lease.attempt, 2),
            other => panic!("a takeover, not {other:?}"),
        }
    })
    .await;
    eprintln!(
        "reserve cost (batching {batching}): new {new:?}, in progress \
         {in_progress:?}, completed {completed:?}, takeover {takeover:?}"
    );
    Some([new, in_progress, completed, takeover])
}
