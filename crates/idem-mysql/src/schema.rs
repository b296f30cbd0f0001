//! The embedded migration: the records table, its secrets table and their indexes,
//! created on first connect and versioned per table in `idem_schema_migrations`.
//!
//! # Keys and indexes, and why
//!
//! - **Primary key `id`, `BINARY(32)`**: the SHA-256 of the scope
//!   ([`Scope::digest`](idem_core::Scope::digest)), so that every key has the same 32
//!   bytes whatever the lengths of its tenant, endpoint and key, and no index can pass
//!   InnoDB's 3072-byte limit. The scope's parts are kept beside it, unindexed, to give
//!   the record back. InnoDB keeps the rows in the primary key's order: a fixed, short
//!   key keeps that index small.
//! - **`expires_at`**: the purge's bounded `DELETE … ORDER BY expires_at LIMIT n` reads
//!   the oldest rows from the start of this index and stops after its batch.
//! - **`TABLE_rate`** (migration 2): the tenants' key-rate buckets, apart from the
//!   records, keyed by the SHA-256 of the bucket's name (32 bytes, whatever the tenant's
//!   length), with an index on `keep_until_ms` for the purge of full buckets.
//!
//! Every table is `ENGINE=InnoDB` (row locks, crash-safe commits) in `utf8mb4` with its
//! binary collation, so that text compares as its bytes do; answers are `LONGBLOB`.
//! A migration runs under the session's `GET_LOCK`, never inside a transaction (MySQL
//! commits one at each DDL statement): every statement is written to be run again.

use idem_core::{Namespace, SetupError};
use idem_sql::{MigrationLock, SqlDatabase};
use sqlx::mysql::MySqlConnection;
use sqlx::{AssertSqlSafe, MySql, MySqlPool};

use crate::error::{KIND, setup_error};

/// The default table name.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The longest suffix the store adds to its table's name (its index), which the name
/// must leave room for.
pub const MAX_TABLE_SUFFIX: &str = "_expires";

/// The table that records which migrations each records table has had.
pub const MIGRATIONS_TABLE: &str = "idem_schema_migrations";

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i32 = 2;

/// The migration lock's name, one for every table of the database: `GET_LOCK` names
/// are the server's, not the database's.
const MIGRATION_LOCK: &str = "idem_schema_migrations";

/// Checks and lowercases a table name: a plain identifier that leaves room for
/// [`MAX_TABLE_SUFFIX`].
pub fn table_name(name: &str) -> Result<Namespace, SetupError> {
    let refused = |source| SetupError::Namespace {
        kind: KIND,
        name: name.to_owned(),
        source,
    };
    let table = Namespace::new(&name.to_ascii_lowercase()).map_err(refused)?;
    table.suffixed(MAX_TABLE_SUFFIX).map_err(refused)?;
    Ok(table)
}

/// The table of the store's secrets, beside its records table `table`.
pub fn meta_table(table: &str) -> String {
    format!("{table}_meta")
}

/// The table of the key-rate buckets beside the records table `table`
/// ([`idem_core::Store::take_rate_token`]): one row per bucket that gave a token lately;
/// a row past its `keep_until_ms` is a full bucket, which the purge deletes.
pub fn rate_table(table: &str) -> String {
    format!("{table}_rate")
}

/// The statements of each migration, in order, for the table `t`.
fn migration(version: i32, t: &str) -> Vec<String> {
    match version {
        1 => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    id              BINARY(32)  NOT NULL,
                    tenant          TEXT        NOT NULL,
                    endpoint        TEXT        NOT NULL,
                    idem_key        TEXT        NOT NULL,
                    fingerprint     VARBINARY(64) NOT NULL,
                    created_at      BIGINT      NOT NULL,
                    expires_at      BIGINT      NOT NULL,
                    attempt         INT         NOT NULL,
                    token           BIGINT      NOT NULL,
                    state           VARCHAR(16) NOT NULL,
                    lease_until     BIGINT,
                    status          INT,
                    headers         {bytes},
                    body            {bytes},
                    completed_at    BIGINT,
                    tombstone_until BIGINT,
                    ambiguity       VARCHAR(64),
                    PRIMARY KEY (id),
                    INDEX {t}_expires (expires_at)
                ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
                bytes = MySql::BYTES,
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {meta} (
                    name  {key} NOT NULL PRIMARY KEY,
                    value {bytes} NOT NULL
                ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
                meta = meta_table(t),
                key = MySql::KEY_TEXT,
                bytes = MySql::BYTES,
            ),
        ],
        // Key-rate buckets shared by every instance on the table: a row per bucket, its
        // tokens as of `at_ms` (the store's clock), and when it is full again.
        2 => vec![format!(
            "CREATE TABLE IF NOT EXISTS {rate} (
                id              BINARY(32)  NOT NULL,
                tokens          DOUBLE      NOT NULL,
                at_ms           BIGINT      NOT NULL,
                keep_until_ms   BIGINT      NOT NULL,
                PRIMARY KEY (id),
                INDEX keep_until (keep_until_ms)
            ) ENGINE=InnoDB",
            rate = rate_table(t),
        )],
        _ => Vec::new(),
    }
}

const MIGRATIONS_DDL: &str = "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
            table_name  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
            version     INT          NOT NULL,
            applied_at  TIMESTAMP    NOT NULL DEFAULT CURRENT_TIMESTAMP,
            PRIMARY KEY (table_name, version)
        ) ENGINE=InnoDB";

/// The newest migration applied to `table`, or `None` when the database has no
/// migrations table. Reads only.
pub async fn applied_version(pool: &MySqlPool, table: &str) -> Result<Option<i32>, SetupError> {
    let table = table_name(table)?;
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables
          WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(MIGRATIONS_TABLE)
    .fetch_one(pool)
    .await
    .map_err(setup_error)?;
    if exists == 0 {
        return Ok(None);
    }
    sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_migrations WHERE table_name = ?")
        .bind(table.as_str())
        .fetch_one(pool)
        .await
        .map_err(setup_error)
}

/// Checks, without writing, that `table` has this build's schema: no table is
/// [`SetupError::NoSchema`], another version [`SetupError::SchemaVersion`].
pub async fn check(pool: &MySqlPool, table: &str) -> Result<(), SetupError> {
    match applied_version(pool, table).await? {
        None => Err(SetupError::NoSchema {
            kind: KIND,
            missing: format!("this database has no table {table}"),
            migrate: true,
        }),
        Some(found) if found != SCHEMA_VERSION => Err(version_error(table, found)),
        Some(_) => Ok(()),
    }
}

fn version_error(table: &str, found: i32) -> SetupError {
    SetupError::SchemaVersion {
        kind: KIND,
        at: format!("table {table}"),
        found: found.into(),
        supported: SCHEMA_VERSION.into(),
    }
}

/// What migrating `table` from version `from` (0 for none) runs, for `idem migrate` to
/// show: the migrations table, each migration's statements and its row. Run by hand,
/// they need no lock if nothing else migrates meanwhile. A table name that does not
/// fit is [`SetupError::Namespace`].
pub fn migration_statements(table: &str, from: i32) -> Result<Vec<String>, SetupError> {
    let table = table_name(table)?;
    let table = table.as_str();
    let mut statements = Vec::new();
    for version in from + 1..=SCHEMA_VERSION {
        if statements.is_empty() {
            statements.push(MIGRATIONS_DDL.to_owned());
        }
        statements.extend(migration(version, table));
        statements.push(format!(
            "INSERT INTO {MIGRATIONS_TABLE} (table_name, version) VALUES ('{table}', {version})"
        ));
    }
    Ok(statements)
}

/// Creates or brings `table` up to [`SCHEMA_VERSION`], under the migration lock, so that
/// several processes starting at once take turns. A table of a newer build's schema is
/// [`SetupError::SchemaVersion`], and left as it is.
pub async fn migrate(pool: &MySqlPool, table: &str) -> Result<(), SetupError> {
    let table = table_name(table)?;
    let mut conn = pool.acquire().await.map_err(setup_error)?;
    let lock = MigrationLock::Named(MIGRATION_LOCK);
    MySql::lock_migrations(&mut conn, lock)
        .await
        .map_err(setup_error)?;
    let ran = migrate_locked(&mut conn, table.as_str()).await;
    let unlocked = MySql::unlock_migrations(&mut conn, lock)
        .await
        .map_err(setup_error);
    ran.and(unlocked)
}

async fn migrate_locked(conn: &mut MySqlConnection, table: &str) -> Result<(), SetupError> {
    sqlx::query(MIGRATIONS_DDL)
        .execute(&mut *conn)
        .await
        .map_err(setup_error)?;
    let applied: Option<i32> =
        sqlx::query_scalar("SELECT MAX(version) FROM idem_schema_migrations WHERE table_name = ?")
            .bind(table)
            .fetch_one(&mut *conn)
            .await
            .map_err(setup_error)?;
    let applied = applied.unwrap_or(0);
    if applied > SCHEMA_VERSION {
        return Err(version_error(table, applied));
    }
    for version in applied + 1..=SCHEMA_VERSION {
        for statement in migration(version, table) {
            sqlx::query(AssertSqlSafe(statement))
                .execute(&mut *conn)
                .await
                .map_err(setup_error)?;
        }
        sqlx::query("INSERT INTO idem_schema_migrations (table_name, version) VALUES (?, ?)")
            .bind(table)
            .bind(version)
            .execute(&mut *conn)
            .await
            .map_err(setup_error)?;
    }
    Ok(())
}

/// Drops `table`, its secrets and buckets tables and its migration rows (tests, and an operator
/// removing a namespace).
pub async fn drop_table(pool: &MySqlPool, table: &str) -> Result<(), SetupError> {
    let table = table_name(table)?;
    let t = table.as_str();
    for statement in [
        format!("DROP TABLE IF EXISTS {t}"),
        format!("DROP TABLE IF EXISTS {}", meta_table(t)),
        format!("DROP TABLE IF EXISTS {}", rate_table(t)),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(pool)
            .await
            .map_err(setup_error)?;
    }
    sqlx::query("DELETE FROM idem_schema_migrations WHERE table_name = ?")
        .bind(t)
        .execute(pool)
        .await
        .map(drop)
        .or_else(|e| match crate::error::number(&e) {
            // No migrations table: nothing to forget.
            Some(1146) => Ok(()),
            _ => Err(setup_error(e)),
        })
}
