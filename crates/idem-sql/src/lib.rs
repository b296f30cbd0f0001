//! What idem knows about each SQL database's dialect, in one place: how a statement
//! names its parameters, how it inserts a row only if its key is free or updates it if
//! not, how it locks the rows it chooses, which column types hold a 64-bit integer or a
//! byte string, and how concurrent migrations take turns.
//!
//! The SQL stores (`idem-sqlite`, `idem-postgres`), the inbox's `SqlInbox` and the
//! outbox's `SqlOutbox` build their statements from a [`SqlDatabase`]'s items, once,
//! when they are made: nothing here runs on a request's path but
//! [`rows_affected`](SqlDatabase::rows_affected). A statement shared by several
//! databases is written once, with PostgreSQL's `$1`, `$2`… parameters, and
//! [`SqlDatabase::statement`] spells it in each dialect.
//!
//! | database | feature | type |
//! |---|---|---|
//! | SQLite | `sqlite` | `sqlx::Sqlite` |
//! | PostgreSQL | `postgres` | `sqlx::Postgres` |
//! | MySQL, MariaDB | `mysql` | `sqlx::MySql` |
//!
//! With the feature `record`, [`record_from_row`] reads an idem record from the row a
//! store keeps it in, in any of these databases.
//!
//! A new database is one more implementation of [`SqlDatabase`] in this crate, behind a
//! feature of its own; the trait's documentation says what each item must give, and
//! where MySQL differs.
//!
//! # Examples
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use idem_sql::SqlDatabase;
//! use sqlx::Sqlite;
//!
//! let insert = Sqlite::statement("INSERT INTO seen (id, at) VALUES ($1, $2)");
//! assert_eq!(
//!     Sqlite::insert_if_absent(&insert, "id"),
//!     "INSERT INTO seen (id, at) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING"
//! );
//! # }
//! ```

use std::future::Future;

use sqlx::{AssertSqlSafe, Connection, Database, Executor, IntoArguments, Pool};

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(feature = "mysql")]
mod mysql;
mod placeholders;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "record")]
mod record;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod standard;

#[cfg(feature = "mysql")]
pub use mysql::MIGRATION_LOCK_WAIT;
pub use placeholders::Placeholders;
#[cfg(feature = "record")]
pub use record::record_from_row;

/// A SQL database idem keeps tables in, as sqlx names it: `sqlx::Sqlite` (feature
/// `sqlite`), `sqlx::Postgres` (feature `postgres`) or `sqlx::MySql` (feature `mysql`,
/// MySQL and MariaDB alike). Sealed: a database is added
/// here, in a module of its own.
///
/// Every item is read when a table's statements are built, except
/// [`rows_affected`](Self::rows_affected); none allocates on a request's path.
pub trait SqlDatabase: Database<Arguments: IntoArguments<Self>> + sealed::Sealed {
    /// How a statement names its parameters: `$1` in PostgreSQL, `?1` in SQLite; `?`,
    /// one per value in the order bound, in MySQL ([`Placeholders::Positional`]).
    const PLACEHOLDERS: Placeholders;

    /// The column type of a 64-bit signed integer: a time in milliseconds, a count.
    /// `BIGINT` in PostgreSQL and MySQL, `INTEGER` in SQLite.
    const INTEGER: &'static str;

    /// The column type of a byte string of any length (a message body, a
    /// fingerprint). `BYTEA` in PostgreSQL, `BLOB` in SQLite; MySQL's `BLOB` stops at
    /// 64 KiB, so it gives `LONGBLOB`.
    const BYTES: &'static str;

    /// The column type of a text of any length (a message's headers, an error).
    /// `TEXT` in PostgreSQL and SQLite by default; MySQL's `TEXT` stops at 64 KiB, so it
    /// gives `LONGTEXT`.
    const LONG_TEXT: &'static str = "TEXT";

    /// The column type of a text that is part of a primary key or a unique
    /// constraint. `TEXT` in PostgreSQL and SQLite; MySQL cannot index a `TEXT` whole,
    /// so it gives a `VARCHAR` of a length its index limit (3072 bytes in InnoDB)
    /// admits in its character set, with a binary collation.
    const KEY_TEXT: &'static str;

    /// The column type of a text of at most `max_bytes` bytes that is part of a primary
    /// key or a unique constraint, compared byte for byte, and never read back as text
    /// (the inbox's message ids). [`KEY_TEXT`](Self::KEY_TEXT) by default. MySQL's
    /// `KEY_TEXT` holds 255 characters, past which `INSERT IGNORE` would cut a longer
    /// value short where it should refuse it, and its collation pads with spaces (`'a'`
    /// equals `'a '`): MySQL gives `VARBINARY(max_bytes)`, which holds every byte and
    /// compares them exactly.
    fn byte_key(max_bytes: usize) -> String {
        let _ = max_bytes;
        Self::KEY_TEXT.to_owned()
    }

    /// The definition of a 64-bit primary key that the database numbers in insertion
    /// order, after the column's name: `BIGSERIAL PRIMARY KEY` in PostgreSQL,
    /// `INTEGER PRIMARY KEY AUTOINCREMENT` in SQLite (never reusing a deleted number),
    /// `BIGINT AUTO_INCREMENT PRIMARY KEY` in MySQL.
    const SERIAL_KEY: &'static str;

    /// What follows the column list of a table whose rows are little more than their
    /// primary key, so that the rows live in the key's own index: ` WITHOUT ROWID` in
    /// SQLite; nothing in PostgreSQL, which has no such tables, nor in MySQL, whose
    /// InnoDB tables always are.
    const KEYED_TABLE: &'static str;

    /// What follows `AS` in `WITH name AS (…)` so that the query is evaluated once and
    /// the rows it locked are the rows its users see: ` MATERIALIZED` in PostgreSQL
    /// (12 and later inline a CTE otherwise); nothing in SQLite, which has no row
    /// locks. MySQL does not take a locking clause inside a CTE: a statement that needs
    /// one there locks in a statement of its own in the same transaction.
    const MATERIALIZED: &'static str;

    /// What ends a `SELECT` that locks the rows it chose until the transaction ends,
    /// passing over the rows another transaction holds instead of waiting for them:
    /// ` FOR UPDATE SKIP LOCKED` in PostgreSQL, MySQL 8.0 and MariaDB 10.6 and later.
    /// Nothing in SQLite, whose writers take turns on one lock of the whole database.
    const SKIP_LOCKED: &'static str;

    /// Whether an `INSERT` or a `DELETE` may end with `RETURNING`, which gives back
    /// the rows it wrote in the same round trip. PostgreSQL and SQLite (3.35 and
    /// later) may, `UPDATE` included; MariaDB 10.5 and later may for `INSERT` and
    /// `DELETE` only, MySQL never. A statement shared by every dialect reads its row
    /// back in a second statement of the same transaction where this is false.
    const RETURNING: bool;

    /// `template`, a statement whose parameters are written `$1`, `$2`…, in this
    /// dialect's [`PLACEHOLDERS`](Self::PLACEHOLDERS). Panics where the dialect's
    /// parameters are positional and `template` does not use each once and in order:
    /// a shared statement is written so (binding a value twice where it needs it
    /// twice), and a test building it finds out at once.
    fn statement(template: &str) -> String {
        Self::PLACEHOLDERS.render(template)
    }

    /// `insert`, a plain `INSERT … VALUES (…)`, made to insert nothing where a row with
    /// the same `key` (a primary key's or unique constraint's columns, `a, b`) exists,
    /// reporting no row affected then and one when it inserted. PostgreSQL and SQLite:
    /// `ON CONFLICT (key) DO NOTHING`. MySQL: `INSERT IGNORE`, since sqlx sets the
    /// `CLIENT_FOUND_ROWS` flag, under which `ON DUPLICATE KEY UPDATE` of a key column
    /// to itself reports the existing row it found as one row affected (and it takes
    /// next-key locks that concurrent duplicates deadlock on). `INSERT IGNORE` also
    /// turns other errors of the statement (a value too long, a `NOT NULL` column given
    /// none) into warnings: its callers bind only values that fit their columns.
    fn insert_if_absent(insert: &str, key: &str) -> String;

    /// `insert`, a plain `INSERT … VALUES (…)`, made to update `columns` to the values
    /// it proposed where a row with the same `key` exists. PostgreSQL and SQLite:
    /// `ON CONFLICT (key) DO UPDATE SET c = excluded.c, …`; MySQL: `ON DUPLICATE KEY
    /// UPDATE c = VALUES(c), …` (MariaDB's spelling, which MySQL 8.0 still reads).
    fn upsert(insert: &str, key: &str, columns: &[&str]) -> String;

    /// A statement that deletes at most `limit` (a parameter, `$3`) rows of `table`
    /// matching `filter`, found by their primary key `key` (`a` or `(a, b)`).
    /// PostgreSQL and SQLite have no `LIMIT` on a `DELETE`: theirs delete the keys a
    /// limited sub-select chose. MySQL refuses a `LIMIT` in such a sub-select, and
    /// takes one on the `DELETE` itself.
    fn delete_limited(table: &str, key: &str, filter: &str, limit: &str) -> String;

    /// A statement that creates the index `name` of `table` on `columns`, if it does
    /// not exist, over the rows matching `filter` only where one is given.
    /// PostgreSQL and SQLite: a partial index, `CREATE INDEX IF NOT EXISTS … WHERE`.
    /// MySQL and MariaDB have no partial indexes: theirs index every row. MariaDB takes
    /// `IF NOT EXISTS` on an index, MySQL 8 does not: there a migration checks the
    /// catalog (or its version table) before creating one.
    fn create_index(name: &str, table: &str, columns: &str, filter: Option<&str>) -> String;

    /// The rows an `INSERT`, `UPDATE` or `DELETE` touched (sqlx has no trait for it).
    /// MySQL counts the rows an `UPDATE` matched, as the others do, because sqlx asks
    /// for found rows (`CLIENT_FOUND_ROWS`): without it, the rows it changed.
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// Takes the migration lock `lock` on `conn`, inside the migration's transaction,
    /// waiting for whoever holds it: two processes migrating one table at once then
    /// run one after the other, and neither meets the other's half-made catalog.
    /// PostgreSQL: an advisory lock held until the transaction ends
    /// (`pg_advisory_xact_lock`). SQLite: nothing, since its writers already take
    /// turns on the database's one write lock; a migration that reads before it writes
    /// begins with `BEGIN IMMEDIATE` to hold that lock from the start. MySQL: `DDL`
    /// commits the transaction it runs in, so the lock is the session's `GET_LOCK`
    /// (with a timeout, failing when it returns 0), which
    /// [`unlock_migrations`](Self::unlock_migrations) releases.
    fn lock_migrations<'c>(
        conn: &'c mut Self::Connection,
        lock: MigrationLock<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c;

    /// Releases what [`lock_migrations`](Self::lock_migrations) took, once the
    /// migration committed or failed. Nothing where the lock ends with the transaction
    /// (PostgreSQL, SQLite); MySQL: `RELEASE_LOCK`, or the pooled connection would keep
    /// the lock after the migration.
    fn unlock_migrations<'c>(
        conn: &'c mut Self::Connection,
        lock: MigrationLock<'c>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'c {
        let _ = (conn, lock);
        async { Ok(()) }
    }
}

/// The name of a migration lock ([`SqlDatabase::lock_migrations`]): one per table, or
/// one for every table of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationLock<'a> {
    /// A lock named by text; PostgreSQL turns it into its advisory lock's 64-bit key
    /// with `hashtext`.
    Named(&'a str),
    /// A lock named by a 64-bit number, PostgreSQL's advisory lock key itself; a
    /// database whose locks are named by text names it by its decimal digits.
    Numbered(i64),
}

/// Runs `statements` in one transaction of a connection of `pool`, under the migration
/// lock `lock`, and commits them. Statements are written to be run again
/// (`CREATE … IF NOT EXISTS`): a migration that finds its tables changes nothing.
pub async fn migrate<DB: SqlDatabase>(
    pool: &Pool<DB>,
    lock: MigrationLock<'_>,
    statements: &[String],
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await?;
    let ran = async {
        let mut tx = conn.begin().await?;
        DB::lock_migrations(&mut tx, lock).await?;
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement.as_str()))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }
    .await;
    let unlocked = DB::unlock_migrations(&mut conn, lock).await;
    ran.and(unlocked)
}

mod sealed {
    /// Keeps [`SqlDatabase`](super::SqlDatabase) to the databases this crate knows.
    pub trait Sealed {}
}
