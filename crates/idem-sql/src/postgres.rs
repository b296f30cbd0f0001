//! PostgreSQL's dialect.

use sqlx::postgres::{PgConnection, PgQueryResult};
use sqlx::{Executor, Postgres};

use crate::{MigrationLock, Placeholders, SqlDatabase, sealed, standard};

impl sealed::Sealed for Postgres {}

impl SqlDatabase for Postgres {
    const PLACEHOLDERS: Placeholders = Placeholders::Dollar;
    const INTEGER: &'static str = "BIGINT";
    const BYTES: &'static str = "BYTEA";
    const KEY_TEXT: &'static str = "TEXT";
    const SERIAL_KEY: &'static str = "BIGSERIAL PRIMARY KEY";
    const KEYED_TABLE: &'static str = "";
    const MATERIALIZED: &'static str = " MATERIALIZED";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
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

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    async fn lock_migrations<'c>(
        conn: &'c mut PgConnection,
        lock: MigrationLock<'c>,
    ) -> Result<(), sqlx::Error> {
        let query = match lock {
            MigrationLock::Named(name) => {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))").bind(name)
            }
            MigrationLock::Numbered(key) => {
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(key)
            }
        };
        conn.execute(query).await.map(drop)
    }
}
