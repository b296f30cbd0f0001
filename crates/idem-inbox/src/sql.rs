//! [`SqlInbox`]: the processed-message table over sqlx, one implementation for SQLite,
//! PostgreSQL and MySQL. What differs between them (a column type, a table option, the
//! placeholders, the migration lock) is their dialect, [`SqlDatabase`] (`idem-sql`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use idem_core::{Namespace, SharedClock, SystemClock};
use idem_sql::{MigrationLock, SqlDatabase};
use sqlx::{AssertSqlSafe, Encode, Executor, Pool, Transaction, Type};

use crate::inbox::{MAX_ID_LEN, validate_id};
use crate::retention::DEFAULT_RETENTION;
use crate::{Error, Inbox, Outcome, Result};

/// The processed-message table's default name.
pub const DEFAULT_TABLE: &str = "idem_inbox";

/// An [`Inbox`] whose processed-message table lives in a SQL database next to the
/// consumer's own tables: the effects run inside the transaction that records the
/// message, so both commit or neither does. Used through its aliases,
/// [`SqliteInbox`](crate::SqliteInbox), [`PgInbox`](crate::PgInbox) and `MySqlInbox`
/// (feature `mysql`).
#[derive(Debug)]
pub struct SqlInbox<DB: SqlDatabase> {
    pool: Pool<DB>,
    settings: SqlSettings,
    sql: Arc<Statements>,
}

impl<DB: SqlDatabase> Clone for SqlInbox<DB> {
    fn clone(&self) -> Self {
        SqlInbox {
            pool: self.pool.clone(),
            settings: self.settings.clone(),
            sql: self.sql.clone(),
        }
    }
}

/// Settings of a SQL inbox.
#[derive(Debug, Clone)]
struct SqlSettings {
    consumer: Arc<str>,
    table: Arc<str>,
    retention: Duration,
    clock: SharedClock,
}

impl SqlSettings {
    /// The purge cutoff: rows processed before it are past retention.
    fn cutoff(&self) -> i64 {
        let now = self.clock.now().as_millis();
        now.saturating_sub(idem_core::duration_millis(self.retention))
    }
}

#[derive(Debug)]
struct Statements {
    create: [String; 2],
    insert: String,
    contains: String,
    purge: String,
}

impl Statements {
    fn new<DB: SqlDatabase>(t: &str) -> Statements {
        let (text, millis) = (DB::byte_key(MAX_ID_LEN), DB::INTEGER);
        let insert =
            format!("INSERT INTO {t} (consumer, message_id, processed_at) VALUES ($1, $2, $3)");
        Statements {
            create: [
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     consumer {text} NOT NULL, \
                     message_id {text} NOT NULL, \
                     processed_at {millis} NOT NULL, \
                     PRIMARY KEY (consumer, message_id)){}",
                    DB::KEYED_TABLE
                ),
                DB::create_index(
                    &format!("{t}{INDEX_SUFFIX}"),
                    t,
                    "consumer, processed_at",
                    None,
                ),
            ],
            insert: DB::insert_if_absent(&DB::statement(&insert), "consumer, message_id"),
            contains: DB::statement(&format!(
                "SELECT 1 FROM {t} WHERE consumer = $1 AND message_id = $2"
            )),
            purge: DB::statement(&DB::delete_limited(
                t,
                "(consumer, message_id)",
                "consumer = $1 AND processed_at < $2",
                "$3",
            )),
        }
    }
}

impl<DB: SqlDatabase> SqlInbox<DB> {
    /// An inbox for `consumer` on `pool`, with the default table
    /// ([`DEFAULT_TABLE`]), retention
    /// ([`DEFAULT_RETENTION`](crate::DEFAULT_RETENTION)) and the system clock. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: Pool<DB>, consumer: impl Into<String>) -> Result<SqlInbox<DB>> {
        let consumer = consumer.into();
        validate_id("consumer name", &consumer)?;
        Ok(SqlInbox {
            pool,
            settings: SqlSettings {
                consumer: consumer.into(),
                table: DEFAULT_TABLE.into(),
                retention: DEFAULT_RETENTION,
                clock: Arc::new(SystemClock),
            },
            sql: Arc::new(Statements::new::<DB>(DEFAULT_TABLE)),
        })
    }

    /// Uses the table `table` (a plain SQL identifier).
    pub fn with_table(mut self, table: &str) -> Result<SqlInbox<DB>> {
        validate_table(table)?;
        self.settings.table = table.into();
        self.sql = Arc::new(Statements::new::<DB>(table));
        Ok(self)
    }

    /// Keeps processed-message rows for `retention`.
    pub fn with_retention(mut self, retention: Duration) -> SqlInbox<DB> {
        self.settings.retention = retention;
        self
    }

    /// Reads the time from `clock` (tests use a `ManualClock`).
    pub fn with_clock(mut self, clock: SharedClock) -> SqlInbox<DB> {
        self.settings.clock = clock;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The processed-message table's name.
    pub fn table(&self) -> &str {
        &self.settings.table
    }
}

impl<DB: SqlDatabase> SqlInbox<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
{
    /// Creates the processed-message table and its index if they do not exist. In
    /// PostgreSQL, consumers starting together serialise on an advisory lock, since
    /// concurrent `CREATE TABLE IF NOT EXISTS` can still collide in its catalog.
    pub async fn migrate(&self) -> Result<()> {
        let lock = format!("idem-inbox:{}", self.settings.table);
        idem_sql::migrate(&self.pool, MigrationLock::Named(&lock), &self.sql.create).await?;
        Ok(())
    }
}

impl<DB: SqlDatabase> Inbox for SqlInbox<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
{
    type Tx = Transaction<'static, DB>;

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
        // runs the effects. The others wait for it (on SQLite's write lock, on
        // PostgreSQL's lock of the uncommitted row), then see its row (DO NOTHING) or,
        // if it rolled back, insert their own.
        let done = sqlx::query(AssertSqlSafe(self.sql.insert.as_str()))
            .bind(&*self.settings.consumer)
            .bind(message_id)
            .bind(self.settings.clock.now().as_millis())
            .execute(&mut *tx)
            .await
            .map_err(Error::from)?;
        if DB::rows_affected(&done) == 0 {
            tx.rollback().await.map_err(Error::from)?;
            return Ok(Outcome::Duplicate);
        }
        // An error here drops `tx`, which rolls back the row with the effects.
        let value = effects(&mut tx).await?;
        tx.commit().await.map_err(Error::from)?;
        Ok(Outcome::Processed(value))
    }

    async fn contains(&self, message_id: &str) -> Result<bool> {
        let row = sqlx::query(AssertSqlSafe(self.sql.contains.as_str()))
            .bind(&*self.settings.consumer)
            .bind(message_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize> {
        let done = sqlx::query(AssertSqlSafe(self.sql.purge.as_str()))
            .bind(&*self.settings.consumer)
            .bind(self.settings.cutoff())
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await?;
        Ok(usize::try_from(DB::rows_affected(&done)).unwrap_or(usize::MAX))
    }
}

/// Table names are spliced into SQL, so only a [`Namespace`] is accepted, and one
/// that leaves room for the index name (`TABLE_processed_at`) within the same rule.
fn validate_table(name: &str) -> Result<()> {
    Namespace::new(name)
        .and_then(|table| table.suffixed(INDEX_SUFFIX))
        .map(drop)
        .map_err(|e| Error::Invalid {
            what: "table name",
            reason: e.to_string(),
        })
}

/// What the processed-message index's name adds to the table's.
const INDEX_SUFFIX: &str = "_processed_at";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_must_be_plain_identifiers() {
        for good in ["idem_inbox", "_x", "Inbox2", &"t".repeat(50)] {
            assert!(validate_table(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a;drop table x",
            "sch.tbl",
            "\"q\"",
            &"t".repeat(51),
        ] {
            assert!(
                matches!(validate_table(bad), Err(Error::Invalid { .. })),
                "{bad}"
            );
        }
    }
}
