//! SQLite's dialect.

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqliteQueryResult};

use crate::{MigrationLock, Placeholders, SqlDatabase, sealed, standard};

impl sealed::Sealed for Sqlite {}

impl SqlDatabase for Sqlite {
    const PLACEHOLDERS: Placeholders = Placeholders::Numbered;
    const INTEGER: &'static str = "INTEGER";
    const BYTES: &'static str = "BLOB";
    const KEY_TEXT: &'static str = "TEXT";
    const SERIAL_KEY: &'static str = "INTEGER PRIMARY KEY AUTOINCREMENT";
    const KEYED_TABLE: &'static str = " WITHOUT ROWID";
    const MATERIALIZED: &'static str = "";
    const SKIP_LOCKED: &'static str = "";
    const RETURNING: bool = true;

    fn insert_if_absent(insert: &str, key: &str) -> String {
        standard::insert_if_absent(insert, key)
    }

    fn upsert(insert: &str, key: &str, columns: &[&str]) -> String {
        standard::upsert(insert, key, columns)
    }

    fn delete_limited(table: &str, key: &str, filter: &str, limit: &str) -> String {
        standard::delete_limited(table, key, filter, limit)
    }

    fn create_index(name: &str, table: &str, columns: &str, filter: Option<&str>) -> String {
        standard::create_index(name, table, columns, filter)
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    /// Nothing: SQLite's writers take turns on the database's write lock already.
    async fn lock_migrations<'c>(
        _: &'c mut SqliteConnection,
        _: MigrationLock<'c>,
    ) -> Result<(), sqlx::Error> {
        Ok(())
    }
}
