//! The journal's second layer on the sending side: an operation persisted under a
//! business id (an order number, a payout batch) is sent at most once per id, enforced
//! by a unique constraint in the journal's SQLite, under concurrency and across a
//! restart. For a provider that ignores `Idempotency-Key`, this is the only guard.

#![cfg(feature = "journal")]

use std::sync::Arc;
use std::time::Duration;

use idem_client::{
    BusinessId, Client, EntryState, Error, Journal, KeyDeriver, ManualSleeper, Persisted,
    RetryPolicy,
};
use idem_core::{ManualClock, Timestamp};
use idem_test_support::upstream::{Reply, Upstream};
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

fn client(max_attempts: u32) -> Client {
    Client::builder()
        .policy(RetryPolicy::default().max_attempts(max_attempts))
        .sleeper(ManualSleeper::new(ManualClock::starting_now()))
        .build()
        .unwrap()
}

fn deriver() -> KeyDeriver {
    KeyDeriver::new(b"a stable 32-byte secret for tests".to_vec())
}

fn order(n: &str) -> BusinessId {
    deriver().business_id("payout", n.as_bytes())
}

/// A second connection to the journal file, to read the rows as stored.
async fn raw(path: &std::path::Path) -> SqlitePool {
    SqlitePool::connect_with(SqliteConnectOptions::new().filename(path))
        .await
        .unwrap()
}

async fn rows_for(pool: &SqlitePool, id: &BusinessId) -> i64 {
    sqlx::query("SELECT COUNT(*) AS n FROM idem_client_operations WHERE business_id = ?1")
        .bind(&id.digest()[..])
        .fetch_one(pool)
        .await
        .unwrap()
        .get("n")
}

fn payout(client: &Client, server: &Upstream) -> idem_client::Operation {
    client
        .post(server.url_for("/v1/payouts"))
        .header("content-type", "application/json")
        .body(r#"{"amount":500}"#)
}

#[tokio::test]
async fn second_persist_of_a_business_id_gets_the_first_outcome_and_one_send() {
    let server = Upstream::scripted([Reply::Status(
        201,
        vec![("content-type", "application/json".into())],
        r#"{"payout":"po_1"}"#.into(),
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = Journal::open(&path).await.unwrap();
    let client = client(3);

    let Persisted::New(first) = journal
        .persist_unique(&order("order-4711"), payout(&client, &server))
        .await
        .unwrap()
    else {
        panic!("the first persist of an id is new");
    };
    assert_eq!(first.send().await.unwrap().status(), 201);

    // Another operation (its own random key) for the same business id.
    let second = payout(&client, &server);
    assert_ne!(second.key(), first.key());
    let persisted = journal
        .persist_unique(&order("order-4711"), second)
        .await
        .unwrap();

    let Persisted::Completed { outcome, entry } = persisted else {
        panic!("expected the first's outcome, got {persisted:?}");
    };
    assert_eq!(outcome.status(), 201);
    assert_eq!(outcome.key(), first.key());
    assert_eq!(outcome.text(), r#"{"payout":"po_1"}"#);
    assert_eq!(outcome.headers()["content-type"], "application/json");
    assert_eq!(entry.id, first.id());
    assert_eq!(entry.state, EntryState::Completed);
    assert_eq!(server.total(), 1, "the provider saw one send");

    // One row, and the business id is not in it: only its keyed hash.
    let pool = raw(&path).await;
    assert_eq!(rows_for(&pool, &order("order-4711")).await, 1);
    let stored: Vec<u8> = sqlx::query("SELECT business_id FROM idem_client_operations")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get("business_id");
    assert_eq!(stored.len(), 32);
    assert!(!stored.windows(4).any(|w| w == b"4711"));
    let file = std::fs::read(&path).unwrap();
    assert!(!file.windows(10).any(|w| w == b"order-4711"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_persists_of_one_business_id_send_exactly_once() {
    const TASKS: usize = 16;
    let server = Upstream::scripted([]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    // Two journals on one file, as two processes would have: their own pools and
    // connections, only the file in common.
    let journals = [
        Journal::open(&path).await.unwrap(),
        Journal::open(&path).await.unwrap(),
    ];
    let client = client(3);
    let url = server.url_for("/v1/payouts");
    let start = Arc::new(tokio::sync::Barrier::new(TASKS));

    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (journal, client, url, start) = (
                journals[i % 2].clone(),
                client.clone(),
                url.clone(),
                start.clone(),
            );
            tokio::spawn(async move {
                let op = client.post(url).body("amount=500");
                start.wait().await;
                match journal.persist_unique(&order("order-9"), op).await.unwrap() {
                    Persisted::New(op) => {
                        op.send().await.unwrap();
                        (true, op.key().clone())
                    }
                    other => (false, other.key().clone()),
                }
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a task hung")
                .unwrap(),
        );
    }

    let winners: Vec<_> = results.iter().filter(|(new, _)| *new).collect();
    assert_eq!(winners.len(), 1, "exactly one task got a new operation");
    let key = &winners[0].1;
    assert!(results.iter().all(|(_, k)| k == key), "all see the one key");
    assert_eq!(server.total(), 1, "exactly one send");
    assert_eq!(rows_for(&raw(&path).await, &order("order-9")).await, 1);
    assert_eq!(journals[1].entries().await.unwrap().len(), 1);
}

#[tokio::test]
async fn pending_business_id_survives_a_restart_and_resumes_with_its_key() {
    let server = Upstream::scripted([Reply::status(503)]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = Journal::open(&path).await.unwrap();

    let Persisted::New(first) = journal
        .persist_unique(&order("order-77"), payout(&client(1), &server))
        .await
        .unwrap()
    else {
        panic!("the first persist of an id is new");
    };
    let err = first.send().await.unwrap_err();
    assert!(err.is_retryable_later(), "{err:?}");
    drop(journal);

    // A new process: the journal reopened, a new client.
    let journal = Journal::open(&path).await.unwrap();
    let fresh = client(1);
    let again = journal
        .persist_unique(&order("order-77"), payout(&fresh, &server))
        .await
        .unwrap();
    let Persisted::Pending { key, entry } = &again else {
        panic!("expected still pending, got {again:?}");
    };
    assert_eq!(key, first.key());
    assert_eq!(entry.state, EntryState::Pending);
    assert_eq!(
        server.total(),
        1,
        "a pending id is not sent again by persisting"
    );

    let pending = journal.pending(&fresh).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].key(), first.key());
    assert_eq!(pending[0].send().await.unwrap().status(), 200);

    assert_eq!(server.total(), 2);
    assert!(
        server
            .keys()
            .iter()
            .all(|k| k.as_deref() == Some(first.key().as_str())),
        "the resume carried the first key"
    );
    let done = journal
        .persist_unique(&order("order-77"), payout(&fresh, &server))
        .await
        .unwrap();
    assert!(
        matches!(&done, Persisted::Completed { outcome, .. } if outcome.status() == 200),
        "{done:?}"
    );
    assert_eq!(server.total(), 2);
}

#[tokio::test]
async fn different_business_ids_send_normally() {
    let server = Upstream::scripted([]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let journal = Journal::open(&path).await.unwrap();
    let client = client(1);

    for id in ["order-1", "order-2"] {
        let persisted = journal
            .persist_unique(&order(id), payout(&client, &server))
            .await
            .unwrap();
        let Persisted::New(op) = persisted else {
            panic!("{id} is new, got {persisted:?}");
        };
        op.send().await.unwrap();
    }
    // The same value under another purpose is another business id.
    let refund = deriver().business_id("refund", b"order-1");
    assert!(matches!(
        journal
            .persist_unique(&refund, payout(&client, &server))
            .await
            .unwrap(),
        Persisted::New(_)
    ));

    assert_eq!(server.total(), 2);
    let pool = raw(&path).await;
    assert_eq!(rows_for(&pool, &order("order-1")).await, 1);
    assert_eq!(rows_for(&pool, &order("order-2")).await, 1);
    assert_eq!(rows_for(&pool, &refund).await, 1);
}

#[tokio::test]
async fn failed_for_good_is_recorded_against_the_business_id() {
    let server = Upstream::scripted([Reply::problem(422, "validation", "amount too large")]).await;
    let journal = Journal::in_memory().await.unwrap();
    let client = client(3);

    let Persisted::New(first) = journal
        .persist_unique(&order("order-5"), payout(&client, &server))
        .await
        .unwrap()
    else {
        panic!("the first persist of an id is new");
    };
    assert!(matches!(
        first.send().await.unwrap_err(),
        Error::Rejected { .. }
    ));

    let again = journal
        .persist_unique(&order("order-5"), payout(&client, &server))
        .await
        .unwrap();
    let Persisted::Failed { answer, entry } = &again else {
        panic!("expected the recorded failure, got {again:?}");
    };
    assert_eq!(answer.as_ref().map(|a| a.status().as_u16()), Some(422));
    assert!(answer.as_ref().unwrap().text().contains("amount too large"));
    assert_eq!(entry.state, EntryState::Failed);
    assert!(
        entry
            .last_error
            .as_deref()
            .unwrap()
            .contains("amount too large")
    );
    assert_eq!(again.key(), first.key());
    assert_eq!(server.total(), 1);
}

#[tokio::test]
async fn same_business_id_with_another_request_is_a_conflict() {
    let server = Upstream::scripted([]).await;
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);
    let Persisted::New(first) = journal
        .persist_unique(&order("order-6"), payout(&client, &server))
        .await
        .unwrap()
    else {
        panic!("the first persist of an id is new");
    };

    let other = client
        .post(server.url_for("/v1/payouts"))
        .header("content-type", "application/json")
        .body(r#"{"amount":900}"#);
    let err = journal
        .persist_unique(&order("order-6"), other)
        .await
        .unwrap_err();

    assert!(
        matches!(&err, Error::BusinessIdConflict { key } if key == first.key()),
        "{err:?}"
    );
    assert_eq!(server.total(), 0);
    assert_eq!(journal.entries().await.unwrap().len(), 1);
}

#[tokio::test]
async fn persisting_one_operation_twice_under_its_business_id_is_pending() {
    // A step that crashed between persisting and sending runs again with the same
    // operation: it learns the entry is pending, and resumes it from the journal.
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);
    let op = client.post("http://127.0.0.1:9/v1/x").body("same");

    let first = journal
        .persist_unique(&order("o"), op.clone())
        .await
        .unwrap();
    let second = journal
        .persist_unique(&order("o"), op.clone())
        .await
        .unwrap();

    assert!(matches!(first, Persisted::New(_)));
    assert!(
        matches!(&second, Persisted::Pending { key, .. } if key == op.key()),
        "{second:?}"
    );
    assert_eq!(journal.entries().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_key_journaled_without_a_business_id_is_a_journal_conflict() {
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);
    let op = client.post("http://127.0.0.1:9/v1/x").body("same");
    journal.persist(op.clone()).await.unwrap();

    let err = journal.persist_unique(&order("o"), op).await.unwrap_err();

    assert!(matches!(err, Error::JournalConflict { .. }), "{err:?}");
    assert_eq!(journal.entries().await.unwrap().len(), 1);
}

#[tokio::test]
async fn purge_keeps_the_business_id_guard_until_purge_guarded() {
    let server = Upstream::scripted([]).await;
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let journal = Journal::in_memory()
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let client = client(1);
    let Persisted::New(op) = journal
        .persist_unique(&order("order-8"), payout(&client, &server))
        .await
        .unwrap()
    else {
        panic!("the first persist of an id is new");
    };
    op.send().await.unwrap();
    let plain = journal.persist(payout(&client, &server)).await.unwrap();
    plain.send().await.unwrap();
    clock.advance(Duration::from_secs(2 * 3600));

    let purged = journal
        .purge_finished(Duration::from_secs(3600), 100)
        .await
        .unwrap();

    assert_eq!(purged, 1, "only the entry without a business id");
    assert!(matches!(
        journal
            .persist_unique(&order("order-8"), payout(&client, &server))
            .await
            .unwrap(),
        Persisted::Completed { .. }
    ));
    assert_eq!(
        journal
            .purge_guarded(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        1
    );
    assert!(matches!(
        journal
            .persist_unique(&order("order-8"), payout(&client, &server))
            .await
            .unwrap(),
        Persisted::New(_)
    ));
    assert_eq!(server.total(), 2);
}

/// The schema `Journal::open` wrote before business ids, verbatim.
const SCHEMA_BEFORE_BUSINESS_IDS: &str = "
CREATE TABLE IF NOT EXISTS idem_client_operations (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT    NOT NULL UNIQUE,
    method          TEXT    NOT NULL,
    url             TEXT    NOT NULL,
    headers         BLOB    NOT NULL,
    body            BLOB    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('pending', 'completed', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    status          INTEGER,
    replayed        INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idem_client_operations_state
    ON idem_client_operations (state, updated_at);
";

#[tokio::test]
async fn journal_made_before_business_ids_opens_and_migrates() {
    let server = Upstream::scripted([]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    {
        // As the old Journal::open left it: in WAL mode.
        let old = SqlitePool::connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal),
        )
        .await
        .unwrap();
        sqlx::raw_sql(SCHEMA_BEFORE_BUSINESS_IDS)
            .execute(&old)
            .await
            .unwrap();
        // A pending operation as the old code wrote it, with one header
        // (`content-type: text/plain`: a count, then length-prefixed name and value).
        sqlx::query(
            "INSERT INTO idem_client_operations
                 (idempotency_key, method, url, headers, body, state, created_at, updated_at)
             VALUES ('old-key-1', 'POST', ?1,
                     X'0001000c636f6e74656e742d747970650000000a746578742f706c61696e',
                     'amount=1', 'pending', 1, 1)",
        )
        .bind(server.url_for("/v1/old"))
        .execute(&old)
        .await
        .unwrap();
        old.close().await;
    }

    // Two processes starting at once migrate it once.
    let (journal, other) = tokio::join!(Journal::open(&path), Journal::open(&path));
    let (journal, other) = (journal.unwrap(), other.unwrap());
    drop(other);
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('idem_client_operations')")
            .fetch_all(&raw(&path).await)
            .await
            .unwrap();
    for added in ["business_id", "response_headers", "response_body"] {
        assert_eq!(columns.iter().filter(|c| *c == added).count(), 1, "{added}");
    }
    let client = client(1);
    let pending = journal.pending(&client).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].key().as_str(), "old-key-1");
    assert_eq!(
        pending[0].operation().header_map()["content-type"],
        "text/plain"
    );
    assert_eq!(pending[0].send().await.unwrap().status(), 200);
    assert_eq!(server.keys(), [Some("old-key-1".to_owned())]);

    // The migrated file takes business ids, and plain entries beside them.
    assert!(matches!(
        journal
            .persist_unique(&order("order-1"), payout(&client, &server))
            .await
            .unwrap(),
        Persisted::New(_)
    ));
    journal.persist(payout(&client, &server)).await.unwrap();
    journal.persist(payout(&client, &server)).await.unwrap();
    drop(journal);

    // Opening a migrated file again changes nothing.
    let journal = Journal::open(&path).await.unwrap();
    assert_eq!(journal.entries().await.unwrap().len(), 4);
    assert!(matches!(
        journal
            .persist_unique(&order("order-1"), payout(&client, &server))
            .await
            .unwrap(),
        Persisted::Pending { .. }
    ));
    let old = journal.entries().await.unwrap().remove(0);
    assert_eq!(old.state, EntryState::Completed);
    assert_eq!(old.status, Some(200));
}

#[tokio::test]
async fn unsendable_operation_is_refused_before_it_takes_the_business_id() {
    let server = Upstream::scripted([]).await;
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);

    for bad in ["not a url", "ftp://127.0.0.1/v1/payouts"] {
        let err = journal
            .persist_unique(&order("order-3"), client.post(bad).body("x"))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Build(_)), "{bad}: {err:?}");
    }
    assert!(journal.entries().await.unwrap().is_empty());

    let Persisted::New(op) = journal
        .persist_unique(&order("order-3"), payout(&client, &server))
        .await
        .unwrap()
    else {
        panic!("the id was not taken by the refused operations");
    };
    op.send().await.unwrap();
    assert_eq!(server.total(), 1);
}

#[tokio::test]
async fn plain_persist_cannot_reach_an_entry_under_a_business_id() {
    // `persist` of the same operation again returns its entry, to be sent; for an
    // entry under a business id that would be a second send beside the first.
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);
    let op = client.post("http://127.0.0.1:9/v1/x").body("same");
    let Persisted::New(first) = journal
        .persist_unique(&order("o"), op.clone())
        .await
        .unwrap()
    else {
        panic!("the first persist of an id is new");
    };

    let err = journal.persist(op).await.unwrap_err();

    assert!(
        matches!(&err, Error::JournalConflict { key } if key == first.key()),
        "{err:?}"
    );
    assert_eq!(journal.entries().await.unwrap().len(), 1);
}
