//! MySQL's and MariaDB's dialect (one wire protocol, one sqlx type).

use std::time::Duration;

use sqlx::mysql::{MySqlConnection, MySqlQueryResult};
use sqlx::{Executor, MySql};

use crate::{MigrationLock, Placeholders, SqlDatabase, sealed};

/// How long [`SqlDatabase::lock_migrations`] waits for another process's migration
/// before it gives up: long enough for any of idem's migrations, short enough that a
/// process stuck holding the lock is reported rather than waited on for ever.
pub const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(60);

impl sealed::Sealed for MySql {}

impl SqlDatabase for MySql {
    const PLACEHOLDERS: Placeholders = Placeholders::Positional;
    const INTEGER: &'static str = "BIGINT";
    const BYTES: &'static str = "LONGBLOB";
    // 255 four-byte characters are 1020 bytes, under InnoDB's 3072-byte key limit even
    // in a key of three such columns.
    const KEY_TEXT: &'static str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
    const LONG_TEXT: &'static str = "LONGTEXT";
    const SERIAL_KEY: &'static str = "BIGINT AUTO_INCREMENT PRIMARY KEY";
    const KEYED_TABLE: &'static str = "";
    const MATERIALIZED: &'static str = "";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const RETURNING: bool = false;

    fn byte_key(max_bytes: usize) -> String {
        format!("VARBINARY({max_bytes})")
    }

    /// `INSERT IGNORE`: sqlx asks the server for found rows (`CLIENT_FOUND_ROWS`),
    /// under which `ON DUPLICATE KEY UPDATE` of a column to itself counts the row it
    /// found, so could not tell an insert from a taken key.
    fn insert_if_absent(insert: &str, _key: &str) -> String {
        let rest = insert
            .trim_start()
            .strip_prefix("INSERT ")
            .expect("insert_if_absent takes an INSERT statement");
        format!("INSERT IGNORE {rest}")
    }

    fn upsert(insert: &str, _key: &str, columns: &[&str]) -> String {
        let set: Vec<String> = columns
            .iter()
            .map(|c| format!("{c} = VALUES({c})"))
            .collect();
        format!("{insert} ON DUPLICATE KEY UPDATE {}", set.join(", "))
    }

    /// `ORDER BY` takes the key's columns, not a row of them: `(a, b)` is ordered by
    /// `a, b`.
    fn delete_limited(table: &str, key: &str, filter: &str, limit: &str) -> String {
        let columns = key.trim_start_matches('(').trim_end_matches(')');
        format!("DELETE FROM {table} WHERE {filter} ORDER BY {columns} LIMIT {limit}")
    }

    /// Every row is indexed (no partial indexes); `IF NOT EXISTS` is MariaDB's, which
    /// MySQL 8 refuses.
    fn create_index(name: &str, table: &str, columns: &str, _filter: Option<&str>) -> String {
        format!("CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns})")
    }

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    /// `GET_LOCK`, a lock of the session (DDL commits the transaction it runs in, so
    /// no lock of the transaction would hold across the migration), waiting at most
    /// [`MIGRATION_LOCK_WAIT`]; a timeout is an error naming the lock.
    async fn lock_migrations<'c>(
        conn: &'c mut MySqlConnection,
        lock: MigrationLock<'c>,
    ) -> Result<(), sqlx::Error> {
        let name = lock_name(lock);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(&name)
            .bind(MIGRATION_LOCK_WAIT.as_secs())
            .fetch_one(&mut *conn)
            .await?;
        match got {
            Some(1) => Ok(()),
            _ => Err(sqlx::Error::Protocol(format!(
                "the migration lock {name:?} was not free within {} s",
                MIGRATION_LOCK_WAIT.as_secs()
            ))),
        }
    }

    async fn unlock_migrations<'c>(
        conn: &'c mut MySqlConnection,
        lock: MigrationLock<'c>,
    ) -> Result<(), sqlx::Error> {
        let query = sqlx::query("SELECT RELEASE_LOCK(?)").bind(lock_name(lock));
        conn.execute(query).await.map(drop)
    }
}

/// A lock's name as `GET_LOCK` takes it: the text, or a number's decimal digits.
fn lock_name(lock: MigrationLock<'_>) -> String {
    match lock {
        MigrationLock::Named(name) => name.to_owned(),
        MigrationLock::Numbered(key) => key.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_spelled_for_mysql() {
        let insert = MySql::statement("INSERT INTO seen (id, at) VALUES ($1, $2)");
        assert_eq!(insert, "INSERT INTO seen (id, at) VALUES (?, ?)");
        assert_eq!(
            MySql::insert_if_absent(&insert, "id, at"),
            "INSERT IGNORE INTO seen (id, at) VALUES (?, ?)"
        );
        assert_eq!(
            MySql::upsert(&insert, "id", &["at"]),
            "INSERT INTO seen (id, at) VALUES (?, ?) ON DUPLICATE KEY UPDATE at = VALUES(at)"
        );
        assert_eq!(
            MySql::delete_limited("seen", "id", "at < ?", "?"),
            "DELETE FROM seen WHERE at < ? ORDER BY id LIMIT ?"
        );
        assert_eq!(
            MySql::delete_limited("seen", "(consumer, id)", "at < ?", "?"),
            "DELETE FROM seen WHERE at < ? ORDER BY consumer, id LIMIT ?"
        );
        assert_eq!(
            MySql::create_index("seen_at", "seen", "at", Some("at > 0")),
            "CREATE INDEX IF NOT EXISTS seen_at ON seen (at)"
        );
        assert_eq!(MySql::byte_key(512), "VARBINARY(512)");
        assert_eq!(lock_name(MigrationLock::Numbered(42)), "42");
        assert_eq!(lock_name(MigrationLock::Named("idem_seen")), "idem_seen");
    }
}
