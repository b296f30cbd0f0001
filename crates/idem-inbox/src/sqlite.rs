//! `SqliteInbox`: the processed-message table in SQLite.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use idem_core::SharedClock;
use sqlx::{AssertSqlSafe, Sqlite, SqlitePool, Transaction};

use crate::inbox::validate_id;
use crate::sql::{SqlSettings, affected, limit, validate_table};
use crate::{Error, Inbox, Outcome, Result};

/// An [`Inbox`] whose processed-message table lives in SQLite, next to the consumer's
/// own tables: the effects run inside the transaction that records the message, so
/// both commit or neither does.
///
/// Give the pool a busy timeout (sqlx's default is 5 s): concurrent deliveries of one
/// message wait on each other's write lock.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), idem_inbox::Error> {
/// use idem_inbox::{Inbox, Outcome, SqliteInbox};
///
/// let inbox = SqliteInbox::new(pool, "points")?;
/// inbox.migrate().await?;
/// let outcome = inbox
///     .process("msg-1", |tx| {
///         Box::pin(async move {
///             sqlx::query("UPDATE balances SET points = points + 10 WHERE account = 'a'")
///                 .execute(&mut **tx)
///                 .await?;
///             Ok::<_, idem_inbox::Error>(())
///         })
///     })
///     .await?;
/// assert_eq!(outcome, Outcome::Processed(()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteInbox {
    pool: SqlitePool,
    settings: SqlSettings,
    sql: Arc<Statements>,
}

#[derive(Debug)]
struct Statements {
    create: Vec<Arc<str>>,
    insert: Arc<str>,
    contains: Arc<str>,
    purge: Arc<str>,
}

impl Statements {
    fn new(t: &str) -> Statements {
        Statements {
            create: vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     consumer TEXT NOT NULL, \
                     message_id TEXT NOT NULL, \
                     processed_at INTEGER NOT NULL, \
                     PRIMARY KEY (consumer, message_id)) WITHOUT ROWID"
                )
                .into(),
                format!(
                    "CREATE INDEX IF NOT EXISTS {t}_processed_at ON {t} (consumer, processed_at)"
                )
                .into(),
            ],
            insert: format!(
                "INSERT INTO {t} (consumer, message_id, processed_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (consumer, message_id) DO NOTHING"
            )
            .into(),
            contains: format!("SELECT 1 FROM {t} WHERE consumer = ?1 AND message_id = ?2").into(),
            purge: format!(
                "DELETE FROM {t} WHERE (consumer, message_id) IN (SELECT consumer, message_id \
                 FROM {t} WHERE consumer = ?1 AND processed_at < ?2 LIMIT ?3)"
            )
            .into(),
        }
    }
}

impl SqliteInbox {
    /// An inbox for `consumer` on `pool`, with the default table
    /// ([`DEFAULT_TABLE`](crate::DEFAULT_TABLE)), retention
    /// ([`DEFAULT_RETENTION`](crate::DEFAULT_RETENTION)) and the system clock. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: SqlitePool, consumer: impl Into<String>) -> Result<SqliteInbox> {
        let settings = SqlSettings::new(consumer.into())?;
        let sql = Arc::new(Statements::new(&settings.table));
        Ok(SqliteInbox {
            pool,
            settings,
            sql,
        })
    }

    /// Uses the table `table` (a plain SQL identifier).
    pub fn with_table(mut self, table: &str) -> Result<SqliteInbox> {
        validate_table(table)?;
        self.settings.table = table.into();
        self.sql = Arc::new(Statements::new(table));
        Ok(self)
    }

    /// Keeps processed-message rows for `retention`.
    pub fn with_retention(mut self, retention: Duration) -> SqliteInbox {
        self.settings.retention = retention;
        self
    }

    /// Reads the time from `clock` (tests use a `ManualClock`).
    pub fn with_clock(mut self, clock: SharedClock) -> SqliteInbox {
        self.settings.clock = clock;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The processed-message table's name.
    pub fn table(&self) -> &str {
        &self.settings.table
    }

    /// Creates the processed-message table and its index if they do not exist.
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for stmt in &self.sql.create {
            sqlx::query(AssertSqlSafe(stmt.clone()))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

impl Inbox for SqliteInbox {
    type Tx = Transaction<'static, Sqlite>;

    fn consumer(&self) -> &str {
        &self.settings.consumer
    }

    fn retention(&self) -> Duration {
        self.settings.retention
    }

    async fn process<T, E, F>(&self, message_id: &str, effects: F) -> Result<Outcome<T>, E>
    where
        T: Send,
        E: From<Error> + Send,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<T, E>> + Send,
    {
        validate_id("message id", message_id)?;
        let mut tx = self.pool.begin().await.map_err(Error::from)?;
        // The insert decides: of any number of deliveries, the one whose row lands
        // runs the effects; the others wait on its write lock and then see the row.
        let inserted = sqlx::query(AssertSqlSafe(self.sql.insert.clone()))
            .bind(&*self.settings.consumer)
            .bind(message_id)
            .bind(self.settings.clock.now().as_millis())
            .execute(&mut *tx)
            .await
            .map_err(Error::from)?
            .rows_affected();
        if inserted == 0 {
            tx.rollback().await.map_err(Error::from)?;
            return Ok(Outcome::Duplicate);
        }
        // An error here drops `tx`, which rolls back the row with the effects.
        let value = effects(&mut tx).await?;
        tx.commit().await.map_err(Error::from)?;
        Ok(Outcome::Processed(value))
    }

    async fn contains(&self, message_id: &str) -> Result<bool> {
        let row = sqlx::query(AssertSqlSafe(self.sql.contains.clone()))
            .bind(&*self.settings.consumer)
            .bind(message_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        let done = sqlx::query(AssertSqlSafe(self.sql.purge.clone()))
            .bind(&*self.settings.consumer)
            .bind(self.settings.cutoff())
            .bind(limit(batch))
            .execute(&self.pool)
            .await?;
        Ok(affected(done.rows_affected()))
    }
}
