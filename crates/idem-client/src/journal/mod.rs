//! The durable journal (SPEC S11, feature `journal`): an operation is written to SQLite
//! before its first attempt, so that after a crash the application finds it, and its
//! key, and resumes it. The server's record then answers with a replay if the first
//! process's attempt executed, or executes it now if it did not.
//!
//! What is stored: method, URL, the operation's own headers, body, key, state, attempt
//! count and the final status. Credentials are not: put them in the HTTP client's
//! default headers (see [`ClientBuilder::http`](crate::ClientBuilder::http)); an
//! operation with an `Authorization`, `Proxy-Authorization` or `Cookie` header, or any
//! value marked sensitive, is refused with [`Error::CredentialInJournal`].
//!
//! A resumed operation must reach the server before its record expires (24 h by
//! default, SPEC S8); after that a resume executes it again.
//!
//! # At most once per business id
//!
//! A server that keeps no record of keys (a provider without idempotency support)
//! executes every attempt that reaches it; the key protects nothing there. The second
//! layer is the journal's own: [`Journal::persist_unique`] persists an operation under a
//! [`BusinessId`] (an order number, a payout batch) that a unique index lets in once.
//! Any later operation with that id, from any task or process sharing the file, gets
//! the first one's state ([`Persisted`]): still pending, with its key; or its answer,
//! as recorded when its send finished. Only the first is ever handed out to send.
//!
//! What a business id entry adds: the id as a keyed hash (never the value, which may
//! be personal data: see [`BusinessId`]), and the answer's headers and body. Retries
//! that gave up leave the entry pending, as for any entry; resuming it
//! ([`Journal::pending`]) sends again with the same key, and a provider that ignores
//! the key executes again if an earlier attempt reached it. Before resuming such an
//! entry, ask the provider (by your own reference in the request) whether it arrived.
//! Entries under a business id outlive [`purge_finished`](Journal::purge_finished):
//! they are the guard; [`purge_guarded`](Journal::purge_guarded) removes them.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{SharedClock, SystemClock, duration_millis};
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::{BusinessId, Client, Error, Operation, Outcome, Result};

mod entry;
mod operation;
mod request;
mod schema;

pub use entry::{Entry, EntryState};
use entry::{entry, parse_key, parse_method, recorded_answer};
pub use operation::{JournaledOperation, Persisted};
use request::{corrupt, decode_header_map, encode_header_map, journalable, same_request};
use schema::{create_private, migrate};

macro_rules! entry_select {
    () => {
        "SELECT id, idempotency_key, business_id, method, url, state, attempts, status,
             replayed, last_error, created_at, updated_at
         FROM idem_client_operations"
    };
}

/// A SQLite journal of operations. Cheap to clone; clones share the pool.
///
/// ```no_run
/// # async fn run() -> Result<(), idem_client::Error> {
/// use idem_client::{Client, Journal};
///
/// let client = Client::new();
/// let journal = Journal::open("payments-journal.db").await?;
///
/// // At start-up: finish what the last process left pending, with the same keys.
/// for op in journal.pending(&client).await? {
///     let _ = op.send().await;
/// }
///
/// // A new operation: persisted before its first attempt.
/// let op = journal
///     .persist(client.post("http://127.0.0.1:8080/v1/payouts").json(&serde_json::json!({"amount": 500})))
///     .await?;
/// let outcome = op.send().await?;
/// # let _ = outcome;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Journal {
    pool: SqlitePool,
    clock: SharedClock,
}

impl Journal {
    /// Opens (creating if needed) the journal in the SQLite file at `path`.
    ///
    /// Writes are synchronous (`synchronous = FULL`): once
    /// [`persist`](Self::persist) returns, the operation survives a power cut, not only
    /// a crash.
    ///
    /// A journal holds request bodies and keys (and, under a business id, answers), so
    /// a new file is created with mode 0600 before SQLite opens it, and SQLite gives its
    /// `-wal` and `-shm` the same mode, whatever the umask. A file that exists keeps its mode; if every user may read
    /// or write it, a warning says so.
    pub async fn open(path: impl AsRef<Path>) -> Result<Journal> {
        let path = path.as_ref();
        create_private(path);
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        Journal::with_pool(pool).await
    }

    /// A journal in memory: for tests and for trying the API; it survives nothing.
    pub async fn in_memory() -> Result<Journal> {
        // One connection that never closes: each in-memory connection is its own
        // database.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(SqliteConnectOptions::new().in_memory(true))
            .await?;
        Journal::with_pool(pool).await
    }

    /// A journal in an existing pool. Its table is created if missing, and a table made
    /// by an earlier release gains the business id columns; the entries in it are kept.
    pub async fn with_pool(pool: SqlitePool) -> Result<Journal> {
        migrate(&pool).await?;
        Ok(Journal {
            pool,
            clock: std::sync::Arc::new(SystemClock),
        })
    }

    /// Replaces the system clock that timestamps entries.
    pub fn with_clock(mut self, clock: SharedClock) -> Journal {
        self.clock = clock;
        self
    }

    /// Writes `op` as pending and returns it journaled; send it with
    /// [`JournaledOperation::send`].
    ///
    /// Persisting the same operation (same key, method, URL, headers and body) again
    /// returns the existing entry, so a step that crashed between persisting and
    /// recording that it did can run again. The same key with a different request, or
    /// with an entry persisted under a business id
    /// ([`persist_unique`](Self::persist_unique)), is [`Error::JournalConflict`].
    ///
    /// An operation that cannot be sent is refused before anything is written, with
    /// the error its send would give: [`Error::Build`] (built wrong, an invalid URL or
    /// scheme) or [`Error::TlsDisabled`].
    pub async fn persist(&self, op: Operation) -> Result<JournaledOperation> {
        let headers = journalable(&op)?;
        let now = self.clock.now().as_millis();
        sqlx::query(
            "INSERT INTO idem_client_operations
                 (idempotency_key, method, url, headers, body, state, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6)
             ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(op.key().as_str())
        .bind(op.method().as_str())
        .bind(op.url())
        .bind(&headers[..])
        .bind(&op.body_bytes()[..])
        .bind(now)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query(
            "SELECT id, business_id, method, url, headers, body FROM idem_client_operations
             WHERE idempotency_key = ?1",
        )
        .bind(op.key().as_str())
        .fetch_one(&self.pool)
        .await?;
        // An entry under a business id is reached through persist_unique only, which
        // never hands it out twice.
        let guarded = row.try_get::<Option<Vec<u8>>, _>("business_id")?.is_some();
        if guarded || !same_request(&row, &op, &headers)? {
            return Err(Error::JournalConflict {
                key: op.key().clone(),
            });
        }
        Ok(JournaledOperation {
            id: row.try_get("id")?,
            op,
            journal: self.clone(),
        })
    }

    /// Persists `op` under `business_id` unless an operation was persisted under it
    /// before; this is how an operation is sent at most once per business id, even to a
    /// provider that ignores `Idempotency-Key`.
    ///
    /// * [`Persisted::New`]: `op` is written as pending, as [`persist`](Self::persist)
    ///   does; send it. When the send finishes its answer is recorded against the id.
    /// * [`Persisted::Pending`]: an operation for this id was persisted and has no
    ///   answer yet: it is being sent, or its retries gave up, or its process died.
    ///   Nothing is sent; the variant carries its key. Resume it from
    ///   [`pending`](Self::pending) (at start-up, say), never by sending `op`.
    /// * [`Persisted::Completed`]: it was answered; the variant carries the answer as
    ///   recorded (status, headers, body).
    /// * [`Persisted::Failed`]: it was refused in a way a resume would not change; the
    ///   variant carries the refusal, if one came.
    ///
    /// A unique index on the id decides, so this holds for any number of tasks and
    /// processes sharing the journal file, and across restarts. The id is the
    /// operation's identity: `op`'s method, URL, headers and body must be those of the
    /// operation first persisted under it, or the answer is
    /// [`Error::BusinessIdConflict`] (a different amount for the same order is a bug,
    /// or a new operation that needs its own id). `op`'s key does not matter: an
    /// existing entry keeps its own. An `op` whose key the journal holds under no or
    /// another business id is [`Error::JournalConflict`]; one that cannot be sent, or
    /// carries a credential, is refused as [`persist`](Self::persist) refuses it, and
    /// takes no id.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idem_client::Error> {
    /// use idem_client::{Client, Journal, KeyDeriver, Persisted};
    ///
    /// let client = Client::new();
    /// let journal = Journal::open("payouts-journal.db").await?;
    /// // The secret keeps order numbers out of the journal file; keep it stable.
    /// let ids = KeyDeriver::new(b"a 32-byte secret from your vault".to_vec());
    ///
    /// let op = client
    ///     .post("http://127.0.0.1:8080/v1/payouts")
    ///     .json(&serde_json::json!({"order": "order-4711", "amount": 500}));
    /// match journal.persist_unique(&ids.business_id("payout", b"order-4711"), op).await? {
    ///     Persisted::New(op) => println!("sent: {}", op.send().await?.status()),
    ///     Persisted::Pending { key, .. } => println!("in flight or to resume, key {key}"),
    ///     Persisted::Completed { outcome, .. } => println!("paid before: {}", outcome.text()),
    ///     Persisted::Failed { entry, .. } => println!("refused before: {:?}", entry.last_error),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn persist_unique(
        &self,
        business_id: &BusinessId,
        op: Operation,
    ) -> Result<Persisted> {
        let headers = journalable(&op)?;
        let now = self.clock.now().as_millis();
        // No conflict target: a clash on the business id or on the key inserts nothing,
        // and the lookup below tells which.
        let inserted = sqlx::query(
            "INSERT INTO idem_client_operations
                 (idempotency_key, business_id, method, url, headers, body, state,
                  created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?7)
             ON CONFLICT DO NOTHING",
        )
        .bind(op.key().as_str())
        .bind(&business_id.digest()[..])
        .bind(op.method().as_str())
        .bind(op.url())
        .bind(&headers[..])
        .bind(&op.body_bytes()[..])
        .bind(now)
        .execute(&self.pool)
        .await?
        .rows_affected()
            == 1;
        let row = sqlx::query(
            "SELECT id, idempotency_key, business_id, method, url, headers, body, state,
                 attempts, status, replayed, last_error, created_at, updated_at,
                 response_headers, response_body
             FROM idem_client_operations WHERE business_id = ?1",
        )
        .bind(&business_id.digest()[..])
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            // Nothing under this id, so the key clashed with another entry.
            return Err(Error::JournalConflict {
                key: op.key().clone(),
            });
        };
        let entry = entry(&row)?;
        if inserted {
            return Ok(Persisted::New(JournaledOperation {
                id: entry.id,
                op,
                journal: self.clone(),
            }));
        }
        if !same_request(&row, &op, &headers)? {
            return Err(Error::BusinessIdConflict { key: entry.key });
        }
        let answer = recorded_answer(&row, &entry)?;
        Ok(match entry.state {
            EntryState::Pending => Persisted::Pending {
                key: entry.key.clone(),
                entry,
            },
            EntryState::Completed => Persisted::Completed {
                outcome: answer
                    .ok_or_else(|| corrupt("a completed entry without its answer".into()))?,
                entry,
            },
            EntryState::Failed => Persisted::Failed { answer, entry },
        })
    }

    /// Every pending operation, oldest first, rebuilt on `client` with its stored key.
    pub async fn pending(&self, client: &Client) -> Result<Vec<JournaledOperation>> {
        let rows = sqlx::query(
            "SELECT id, idempotency_key, method, url, headers, body
             FROM idem_client_operations WHERE state = 'pending' ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let key = parse_key(row)?;
                let method = parse_method(row)?;
                let map = decode_header_map(&row.try_get::<Vec<u8>, _>("headers")?)?;
                let op = Operation::restore(
                    client.clone(),
                    method,
                    row.try_get("url")?,
                    map,
                    Bytes::from(row.try_get::<Vec<u8>, _>("body")?),
                    key,
                );
                Ok(JournaledOperation {
                    id: row.try_get("id")?,
                    op,
                    journal: self.clone(),
                })
            })
            .collect()
    }

    /// The entry with this id.
    pub async fn entry(&self, id: i64) -> Result<Option<Entry>> {
        sqlx::query(concat!(entry_select!(), " WHERE id = ?1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(entry)
            .transpose()
    }

    /// Every entry, oldest first.
    pub async fn entries(&self) -> Result<Vec<Entry>> {
        sqlx::query(concat!(entry_select!(), " ORDER BY id"))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(entry)
            .collect()
    }

    /// Deletes at most `limit` completed or failed entries last changed `older_than`
    /// ago or earlier; returns how many. Pending entries are never purged, nor entries
    /// with a business id: those are the guard that
    /// [`persist_unique`](Self::persist_unique) checks (see
    /// [`purge_guarded`](Self::purge_guarded)).
    pub async fn purge_finished(&self, older_than: Duration, limit: u32) -> Result<u64> {
        self.purge(older_than, limit, "business_id IS NULL").await
    }

    /// Deletes at most `limit` completed or failed entries with a business id, last
    /// changed `older_than` ago or earlier; returns how many. Pending entries are never
    /// purged.
    ///
    /// After this an operation persisted under one of their ids is new and is sent:
    /// purge only what the business can no longer ask for again (orders closed for
    /// longer than any retry, replay or re-run of a batch could reach back).
    pub async fn purge_guarded(&self, older_than: Duration, limit: u32) -> Result<u64> {
        self.purge(older_than, limit, "business_id IS NOT NULL")
            .await
    }

    async fn purge(&self, older_than: Duration, limit: u32, which: &str) -> Result<u64> {
        let cutoff = self
            .clock
            .now()
            .as_millis()
            .saturating_sub(duration_millis(older_than));
        let sql = format!(
            "DELETE FROM idem_client_operations WHERE id IN (
                 SELECT id FROM idem_client_operations
                 WHERE state IN ('completed', 'failed') AND updated_at <= ?1 AND {which}
                 ORDER BY updated_at LIMIT ?2)"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(cutoff)
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn record(
        &self,
        id: i64,
        state: EntryState,
        attempts: u32,
        answer: Option<&Outcome>,
        error: Option<String>,
    ) -> Result<()> {
        // The answer's headers and body are what a later operation with the same
        // business id gets instead of a send; entries without one do not need them.
        sqlx::query(
            "UPDATE idem_client_operations
             SET state = ?2, attempts = attempts + ?3, status = ?4, replayed = ?5,
                 last_error = ?6, updated_at = ?7,
                 response_headers = CASE WHEN business_id IS NULL THEN NULL ELSE ?8 END,
                 response_body = CASE WHEN business_id IS NULL THEN NULL ELSE ?9 END
             WHERE id = ?1",
        )
        .bind(id)
        .bind(state.as_str())
        .bind(i64::from(attempts))
        .bind(answer.map(|o| i64::from(o.status().as_u16())))
        .bind(answer.map(Outcome::replayed))
        .bind(error)
        .bind(self.clock.now().as_millis())
        .bind(answer.map(|o| encode_header_map(o.headers())))
        .bind(answer.map(|o| o.body().to_vec()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
