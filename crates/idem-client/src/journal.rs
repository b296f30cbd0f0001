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

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, COOKIE, HeaderName, HeaderValue, PROXY_AUTHORIZATION};
use http::{HeaderMap, Method};
use idem_core::codec::{decode_headers, encode_headers};
use idem_core::{Key, SharedClock, SystemClock, Timestamp, duration_millis};
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use crate::{Client, Error, Operation, Outcome, Result};

const SCHEMA: &str = "
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

macro_rules! entry_select {
    () => {
        "SELECT id, idempotency_key, method, url, state, attempts, status, replayed,
             last_error, created_at, updated_at
         FROM idem_client_operations"
    };
}

/// Where a journaled operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Not yet answered: resume it.
    Pending,
    /// Answered (success or not, replayed or not); kept until purged.
    Completed,
    /// Refused in a way a resume would not change (key reused, invalid request).
    Failed,
}

impl EntryState {
    fn as_str(self) -> &'static str {
        match self {
            EntryState::Pending => "pending",
            EntryState::Completed => "completed",
            EntryState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<EntryState> {
        match s {
            "pending" => Ok(EntryState::Pending),
            "completed" => Ok(EntryState::Completed),
            "failed" => Ok(EntryState::Failed),
            other => Err(corrupt(format!("unknown journal state {other:?}"))),
        }
    }
}

/// One journaled operation as stored (without its body and headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The journal's id for the operation.
    pub id: i64,
    /// The operation's key.
    pub key: Key,
    /// The method.
    pub method: Method,
    /// The URL.
    pub url: String,
    /// Pending, completed or failed.
    pub state: EntryState,
    /// Attempts made by every process that sent it, as far as they recorded.
    pub attempts: u32,
    /// The final status, once completed (or failed with an answer).
    pub status: Option<u16>,
    /// Whether the final answer was a replay, once completed.
    pub replayed: Option<bool>,
    /// The last error, for a failed entry or a pending one whose retries gave up.
    pub last_error: Option<String>,
    /// When it was persisted.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
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

/// Creates the journal's file with mode 0600 if it is missing (SPEC S14: files holding
/// records are readable by their owner only); warns of one that exists and that every
/// user can read or write. An error creating it is left for SQLite to report.
fn create_private(path: &Path) {
    // SQLite's own names (":memory:") are no files.
    if path.as_os_str().is_empty() || path.to_string_lossy().starts_with(':') {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
        if created.is_ok() {
            return;
        }
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o007 != 0
        {
            tracing::warn!(
                path = %path.display(),
                mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
                "every local user can read or write this journal of operations (bodies \
                 and keys); chmod 600 it and its -wal and -shm"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

impl Journal {
    /// Opens (creating if needed) the journal in the SQLite file at `path`.
    ///
    /// Writes are synchronous (`synchronous = FULL`): once
    /// [`persist`](Self::persist) returns, the operation survives a power cut, not only
    /// a crash.
    ///
    /// A journal holds request bodies and keys, so a new file is created with mode 0600
    /// before SQLite opens it, and SQLite gives its `-wal` and `-shm` the same mode,
    /// whatever the umask. A file that exists keeps its mode; if every user may read
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

    /// A journal in an existing pool (its table is created if missing).
    pub async fn with_pool(pool: SqlitePool) -> Result<Journal> {
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
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
    /// recording that it did can run again. The same key with a different request is
    /// [`Error::JournalConflict`].
    pub async fn persist(&self, op: Operation) -> Result<JournaledOperation> {
        if let Some(e) = op.build_error() {
            return Err(Error::Build(e.to_owned()));
        }
        refuse_credentials(op.header_map())?;
        let headers = encode_headers(
            &op.header_map()
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), Bytes::copy_from_slice(v.as_bytes())))
                .collect::<Vec<_>>(),
        );
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
            "SELECT id, method, url, headers, body FROM idem_client_operations
             WHERE idempotency_key = ?1",
        )
        .bind(op.key().as_str())
        .fetch_one(&self.pool)
        .await?;
        let same = row.try_get::<String, _>("method")? == op.method().as_str()
            && row.try_get::<String, _>("url")? == op.url()
            && row.try_get::<Vec<u8>, _>("headers")? == headers
            && row.try_get::<Vec<u8>, _>("body")?[..] == op.body_bytes()[..];
        if !same {
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
                let headers = decode_headers(&row.try_get::<Vec<u8>, _>("headers")?)
                    .map_err(|e| corrupt(e.to_string()))?;
                let mut map = HeaderMap::with_capacity(headers.len());
                for (name, value) in headers {
                    let name = HeaderName::from_str(&name).map_err(|e| corrupt(e.to_string()))?;
                    let value = HeaderValue::from_maybe_shared(value)
                        .map_err(|e| corrupt(e.to_string()))?;
                    map.append(name, value);
                }
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
    /// ago or earlier; returns how many. Pending entries are never purged.
    pub async fn purge_finished(&self, older_than: Duration, limit: u32) -> Result<u64> {
        let cutoff = self
            .clock
            .now()
            .as_millis()
            .saturating_sub(duration_millis(older_than));
        let done = sqlx::query(
            "DELETE FROM idem_client_operations WHERE id IN (
                 SELECT id FROM idem_client_operations
                 WHERE state IN ('completed', 'failed') AND updated_at <= ?1
                 ORDER BY updated_at LIMIT ?2)",
        )
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
        sqlx::query(
            "UPDATE idem_client_operations
             SET state = ?2, attempts = attempts + ?3, status = ?4, replayed = ?5,
                 last_error = ?6, updated_at = ?7
             WHERE id = ?1",
        )
        .bind(id)
        .bind(state.as_str())
        .bind(i64::from(attempts))
        .bind(answer.map(|o| i64::from(o.status().as_u16())))
        .bind(answer.map(Outcome::replayed))
        .bind(error)
        .bind(self.clock.now().as_millis())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

fn entry(row: &SqliteRow) -> Result<Entry> {
    Ok(Entry {
        id: row.try_get("id")?,
        key: parse_key(row)?,
        method: parse_method(row)?,
        url: row.try_get("url")?,
        state: EntryState::parse(&row.try_get::<String, _>("state")?)?,
        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(u32::MAX),
        status: row
            .try_get::<Option<i64>, _>("status")?
            .and_then(|s| u16::try_from(s).ok()),
        replayed: row.try_get("replayed")?,
        last_error: row.try_get("last_error")?,
        created_at: Timestamp::from_millis(row.try_get("created_at")?),
        updated_at: Timestamp::from_millis(row.try_get("updated_at")?),
    })
}

fn parse_key(row: &SqliteRow) -> Result<Key> {
    Key::new(row.try_get::<String, _>("idempotency_key")?).map_err(|e| corrupt(e.to_string()))
}

fn parse_method(row: &SqliteRow) -> Result<Method> {
    Method::from_str(&row.try_get::<String, _>("method")?).map_err(|e| corrupt(e.to_string()))
}

fn corrupt(reason: String) -> Error {
    Error::Journal(sqlx::Error::Decode(reason.into()))
}

fn refuse_credentials(headers: &HeaderMap) -> Result<()> {
    for (name, value) in headers {
        if name == AUTHORIZATION
            || name == PROXY_AUTHORIZATION
            || name == COOKIE
            || value.is_sensitive()
        {
            return Err(Error::CredentialInJournal {
                header: name.as_str().to_owned(),
            });
        }
    }
    Ok(())
}

/// An operation with its journal entry. [`send`](Self::send) sends it and records the
/// result.
#[derive(Debug, Clone)]
pub struct JournaledOperation {
    id: i64,
    op: Operation,
    journal: Journal,
}

impl JournaledOperation {
    /// The journal's id for it.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The operation.
    pub fn operation(&self) -> &Operation {
        &self.op
    }

    /// The key.
    pub fn key(&self) -> &Key {
        self.op.key()
    }

    /// Sends the operation (see [`Operation::send`]) and records what came of it:
    /// an answer marks the entry completed; a refusal that a resume would not change
    /// (key reused, invalid request) marks it failed; retries that gave up leave it
    /// pending, for a later resume.
    ///
    /// If recording fails the result is still returned and the entry stays pending; a
    /// later resume then gets the server's replay. The failure is logged.
    pub async fn send(&self) -> Result<Outcome> {
        let result = self.op.send().await;
        let recorded = match &result {
            Ok(outcome) => {
                self.journal
                    .record(
                        self.id,
                        EntryState::Completed,
                        outcome.attempts(),
                        Some(outcome),
                        None,
                    )
                    .await
            }
            Err(e) => {
                let state = if e.is_retryable_later() {
                    EntryState::Pending
                } else {
                    EntryState::Failed
                };
                let answer = match e {
                    Error::KeyReused { answer, .. }
                    | Error::InvalidKey { answer, .. }
                    | Error::Rejected { answer, .. } => Some(&**answer),
                    _ => None,
                };
                self.journal
                    .record(self.id, state, e.attempts(), answer, Some(e.to_string()))
                    .await
            }
        };
        if let Err(e) = recorded {
            tracing::warn!(id = self.id, key = %self.op.key(), error = %e,
                "could not record an operation's result in the journal; it stays pending");
        }
        result
    }
}
