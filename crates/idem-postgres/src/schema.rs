//! The embedded migration: the records table and its indexes, created on first
//! connect and versioned per table in `idem_schema_migrations`.
//!
//! # Indexes, and why
//!
//! - **Primary key `(tenant, endpoint, idem_key)`** (a B-tree). It is the scope's
//!   unique constraint (SPEC S3): `reserve`'s `INSERT … ON CONFLICT` arbitrates on it,
//!   and every fenced statement finds its row through it, so each is one O(log n)
//!   descent. The key columns use the `"C"` collation: bytewise comparison is cheaper
//!   than a locale's, and the order (irrelevant here) does not depend on the
//!   database's locale.
//! - **`expires_at`** (a B-tree). The sweeper's bounded `DELETE` reads the oldest
//!   expired rows from the start of this index and stops after its batch, so a purge
//!   costs O(log n + batch) instead of a scan of the table.
//!
//! - **`ambiguity`**, partial: only rows whose column is set (an answer recorded with an
//!   ambiguity reason, or an attempt that left its record in progress with one), few,
//!   for a query on the reason alone. The listing of ambiguous records
//!   (`/keys?ambiguous=true`), which also lists records by their attempt and lease,
//!   pages in primary-key order and tests the column on each row, where it used to
//!   search the headers' bytes.
//!
//! Nothing else is indexed: each extra index is one more write on every reserve, and
//! neither the token nor the state is ever searched without the primary key. The table
//! is created with `fillfactor = 90` so that `complete` (which changes no indexed
//! column, unless it records an ambiguity reason) can usually update its row in place
//! on the same page (a HOT update), without touching any index.

use idem_core::{Namespace, SetupError};
use idem_sql::{MigrationLock, SqlDatabase};
use sqlx::{AssertSqlSafe, Executor, PgPool, Postgres};

use crate::error::{KIND, setup_error};

/// The table records live in unless configured otherwise.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The longest suffix the schema adds to the table's name (`TABLE_expires`, the
/// index); with it, the name must still be a [`Namespace`], which
/// keeps it within the 63 bytes PostgreSQL keeps of an identifier.
pub const MAX_TABLE_SUFFIX: &str = "_expires";

/// The table `name` names, folded to lower case as PostgreSQL folds an unquoted name
/// (so that the migrations table records the name the server uses), if the
/// [`Namespace`] rule admits it and, with [`MAX_TABLE_SUFFIX`], the names derived
/// from it: at most 55 bytes. The name is spliced into SQL text, so nothing else is
/// accepted.
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

/// The table that records which migrations ran on which records table.
pub const MIGRATIONS_TABLE: &str = "idem_schema_migrations";

/// Serialises migrations across processes: two instances starting together must not
/// both run `CREATE TABLE` (the loser would fail on the catalog's unique index).
const MIGRATION_LOCK: i64 = 0x6964_656d_5f70_6731; // "idem_pg1"

/// One migration step: its version, what it does, and its statements for `table`.
struct Migration {
    version: i32,
    description: &'static str,
    statements: fn(&str) -> Vec<String>,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "records table, primary key on the scope, index on expires_at",
        statements: |t| {
            vec![
                format!(
                    "CREATE TABLE {t} (
                    tenant       TEXT COLLATE \"C\" NOT NULL,
                    endpoint     TEXT COLLATE \"C\" NOT NULL,
                    idem_key     TEXT COLLATE \"C\" NOT NULL,
                    fingerprint  BYTEA   NOT NULL,
                    created_at   BIGINT  NOT NULL,
                    expires_at   BIGINT  NOT NULL,
                    attempt      INTEGER NOT NULL,
                    token        BIGINT  NOT NULL,
                    state        TEXT    NOT NULL,
                    lease_until  BIGINT,
                    status       INTEGER,
                    headers      BYTEA,
                    body         BYTEA,
                    completed_at BIGINT,
                    CONSTRAINT {t}_pkey PRIMARY KEY (tenant, endpoint, idem_key),
                    CONSTRAINT {t}_state CHECK (
                        (state = 'in_progress' AND lease_until IS NOT NULL
                            AND status IS NULL AND completed_at IS NULL)
                        OR (state = 'completed' AND lease_until IS NULL
                            AND status IS NOT NULL AND headers IS NOT NULL
                            AND body IS NOT NULL AND completed_at IS NOT NULL))
                ) WITH (fillfactor = 90)"
                ),
                format!("CREATE INDEX {t}_expires ON {t} (expires_at)"),
            ]
        },
    },
    Migration {
        version: 2,
        description: "secrets table, apart from the records",
        statements: |t| {
            let meta = meta_table(t);
            vec![format!(
                "CREATE TABLE {meta} (
                    name  TEXT COLLATE \"C\" PRIMARY KEY,
                    value BYTEA NOT NULL
                )"
            )]
        },
    },
    Migration {
        version: 3,
        description: "notify waiting duplicates when a record is completed or released",
        statements: |t| {
            let function = notify_function(t);
            // The payload is the table and `Scope::digest` of the row: the SHA-256 of
            // each part's UTF-8 length (8 bytes, big-endian) and bytes, in hex. A
            // trigger, not the statements, so that every path notifies: the single-row
            // and batched statements, `complete_in`'s transaction (at its commit, and
            // not at all if it rolls back), an operator's removal.
            vec![
                format!(
                    "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN
                        PERFORM pg_notify('{NOTIFY_CHANNEL}', '{t} ' || encode(sha256(
                            int8send(octet_length(convert_to(OLD.tenant, 'UTF8'))::int8)
                            || convert_to(OLD.tenant, 'UTF8')
                            || int8send(octet_length(convert_to(OLD.endpoint, 'UTF8'))::int8)
                            || convert_to(OLD.endpoint, 'UTF8')
                            || int8send(octet_length(convert_to(OLD.idem_key, 'UTF8'))::int8)
                            || convert_to(OLD.idem_key, 'UTF8')), 'hex'));
                        RETURN NULL;
                    END $$"
                ),
                format!(
                    "CREATE TRIGGER {t}_done AFTER UPDATE OF state ON {t} FOR EACH ROW
                     WHEN (OLD.state = 'in_progress' AND NEW.state = 'completed')
                     EXECUTE FUNCTION {function}()"
                ),
                format!(
                    "CREATE TRIGGER {t}_gone AFTER DELETE ON {t} FOR EACH ROW
                     WHEN (OLD.state = 'in_progress')
                     EXECUTE FUNCTION {function}()"
                ),
            ]
        },
    },
    Migration {
        version: 4,
        description: "tombstones: a tombstone_until column and a third state",
        statements: |t| {
            // A tombstone (SPEC S16) is a completed record past its expiry, compacted by
            // the purge into its fingerprint, status and completion time, living until
            // its expires_at. Adding a column without a default rewrites nothing. The
            // new check admits every row the old one did, so it is added NOT VALID: no
            // scan of the table under the migration's lock, and every write from now
            // on is checked.
            vec![
                format!("ALTER TABLE {t} ADD COLUMN tombstone_until BIGINT"),
                format!("ALTER TABLE {t} DROP CONSTRAINT {t}_state"),
                format!(
                    "ALTER TABLE {t} ADD CONSTRAINT {t}_state CHECK (
                        (state = 'in_progress' AND lease_until IS NOT NULL
                            AND status IS NULL AND completed_at IS NULL)
                        OR (state = 'completed' AND lease_until IS NULL
                            AND status IS NOT NULL AND headers IS NOT NULL
                            AND body IS NOT NULL AND completed_at IS NOT NULL)
                        OR (state = 'tombstone' AND lease_until IS NULL
                            AND status IS NOT NULL AND headers IS NULL
                            AND body IS NULL AND completed_at IS NOT NULL)) NOT VALID"
                ),
            ]
        },
    },
    Migration {
        version: 5,
        description: "tenant key-rate buckets, apart from the records",
        statements: |t| {
            // Unlogged: a bucket's update writes no WAL, so the statement commits
            // without waiting for a WAL flush (a new key costs no third synced commit).
            // A crash empties the table, and a standby has none: the buckets then
            // start full, which a limit can afford.
            let rate = rate_table(t);
            vec![format!(
                "CREATE UNLOGGED TABLE {rate} (
                    bucket          TEXT COLLATE \"C\" PRIMARY KEY,
                    tokens          DOUBLE PRECISION NOT NULL,
                    at_ms           BIGINT NOT NULL,
                    keep_until_ms   BIGINT NOT NULL
                )"
            )]
        },
    },
    Migration {
        version: 6,
        description: "typed record metadata: an indexed ambiguity column",
        statements: |t| {
            // Why a record's outcome is ambiguous (`idem_core::Ambiguity::as_str`), where
            // a listing finds it by an index. Answers recorded before kept the reason
            // among their headers (`idem_core::codec::encoded_ambiguity`): it is carried
            // into the column, one scan of the completed rows under the migration's
            // lock, and such a row still reads as it did (the column wins when set).
            let mut carry = String::new();
            for reason in idem_core::Ambiguity::ALL {
                let entry = hex::encode(idem_core::codec::encoded_ambiguity(reason));
                carry.push_str(&format!(
                    " WHEN position(decode('{entry}', 'hex') IN headers) > 0 THEN '{}'",
                    reason.as_str()
                ));
            }
            vec![
                format!("ALTER TABLE {t} ADD COLUMN ambiguity TEXT"),
                format!("CREATE INDEX {t}_ambig ON {t} (ambiguity) WHERE ambiguity IS NOT NULL"),
                format!(
                    "UPDATE {t} SET ambiguity = CASE{carry} END
                      WHERE state = 'completed' AND headers IS NOT NULL"
                ),
            ]
        },
    },
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = 6;

/// The channel every store's table notifies on (migration 3): a payload is the table's
/// name, a space, and the [`Scope::digest`](idem_core::Scope::digest) of a record that
/// was completed, released or removed while in progress.
pub const NOTIFY_CHANNEL: &str = "idem_changes";

/// The trigger function of `table` (migration 3).
fn notify_function(table: &str) -> String {
    format!("{table}_notify")
}

/// The table of `table`'s key-rate buckets ([`idem_core::Store::take_rate_token`]):
/// `TABLE_rate`, one row per tenant that took a token lately; a row past its
/// `keep_until_ms` is a full bucket, deleted by the purge.
pub fn rate_table(table: &str) -> String {
    format!("{table}_rate")
}

/// The table of `table`'s secrets ([`idem_core::Store::init_secret`]): `TABLE_meta`,
/// one row per name, apart from the records, so that no purge or removal of records
/// can reach it. Within PostgreSQL's 63 bytes for any admitted table name.
pub fn meta_table(table: &str) -> String {
    format!("{table}_meta")
}

/// The schema version `table` was migrated to, reading only: `None` when no
/// migration of it was ever recorded here (no `idem_schema_migrations` table, or no row
/// for it), which is what a mistyped namespace or database finds.
pub async fn applied_version(pool: &PgPool, table: &str) -> Result<Option<i32>, SetupError> {
    let table = table_name(table)?;
    let exists: bool =
        sqlx::query_scalar("SELECT to_regclass('idem_schema_migrations') IS NOT NULL")
            .fetch_one(pool)
            .await
            .map_err(|e| setup_error(pool, e))?;
    if !exists {
        return Ok(None);
    }
    sqlx::query_scalar("SELECT max(version) FROM idem_schema_migrations WHERE table_name = $1")
        .bind(table.as_str())
        .fetch_one(pool)
        .await
        .map_err(|e| setup_error(pool, e))
}

/// Checks, writing nothing, that `table` is at [`SCHEMA_VERSION`]: none recorded is
/// [`SetupError::NoSchema`], another one [`SetupError::SchemaVersion`].
pub async fn check(pool: &PgPool, table: &str) -> Result<(), SetupError> {
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

/// `table` at schema version `found`, which is not this build's.
fn version_error(table: &str, found: i32) -> SetupError {
    SetupError::SchemaVersion {
        kind: KIND,
        at: format!("table {table}"),
        found: found.into(),
        supported: SCHEMA_VERSION.into(),
    }
}

/// The SQL [`migrate`] runs to bring `table` from schema version `from` (0: no table
/// yet) to [`SCHEMA_VERSION`], as text a database administrator can read and run
/// (`idem migrate --dry-run`): the lock, the bookkeeping table, each step's
/// statements and the row recording it, with values inlined. Empty when `from` is
/// current or newer.
pub fn migration_statements(table: &str, from: i32) -> Result<Vec<String>, SetupError> {
    let table = table_name(table)?;
    let table = table.as_str();
    let steps: Vec<&Migration> = MIGRATIONS.iter().filter(|m| m.version > from).collect();
    if steps.is_empty() {
        return Ok(Vec::new());
    }
    let mut statements = vec![
        format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"),
        MIGRATIONS_DDL.to_owned(),
    ];
    for m in steps {
        statements.extend((m.statements)(table));
        statements.push(format!(
            "INSERT INTO {MIGRATIONS_TABLE} (table_name, version, description) \
             VALUES ('{table}', {}, '{}')",
            m.version,
            m.description.replace('\'', "''")
        ));
    }
    Ok(statements)
}

/// The bookkeeping table of migrations, made by the first one.
const MIGRATIONS_DDL: &str = "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
            table_name  TEXT    NOT NULL,
            version     INTEGER NOT NULL,
            description TEXT    NOT NULL,
            applied_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (table_name, version)
        )";

/// Brings `table` up to [`SCHEMA_VERSION`], running each missing step in one
/// transaction under a cluster-wide advisory lock. Safe to call from many instances at
/// once and on every start.
pub async fn migrate(pool: &PgPool, table: &str) -> Result<(), SetupError> {
    let table = table_name(table)?;
    let table = table.as_str();
    let failed = |e| setup_error(pool, e);
    let mut tx = pool.begin().await.map_err(failed)?;
    // `CREATE … IF NOT EXISTS` of what is there says so in a notice, which the driver
    // would log at every start.
    tx.execute("SET LOCAL client_min_messages TO warning")
        .await
        .map_err(failed)?;
    Postgres::lock_migrations(&mut tx, MigrationLock::Numbered(MIGRATION_LOCK))
        .await
        .map_err(failed)?;
    tx.execute(MIGRATIONS_DDL).await.map_err(failed)?;
    let applied: Option<i32> =
        sqlx::query_scalar("SELECT max(version) FROM idem_schema_migrations WHERE table_name = $1")
            .bind(table)
            .fetch_one(&mut *tx)
            .await
            .map_err(failed)?;
    let applied = applied.unwrap_or(0);
    if applied > SCHEMA_VERSION {
        return Err(version_error(table, applied));
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > applied) {
        for statement in (m.statements)(table) {
            tx.execute(AssertSqlSafe(statement)).await.map_err(failed)?;
        }
        sqlx::query(
            "INSERT INTO idem_schema_migrations (table_name, version, description) \
             VALUES ($1, $2, $3)",
        )
        .bind(table)
        .bind(m.version)
        .bind(m.description)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
        tracing::info!(
            table,
            version = m.version,
            "applied idempotency schema migration"
        );
    }
    tx.commit().await.map_err(failed)?;
    Ok(())
}

/// Drops `table` and forgets its migrations: for tests and for an operator retiring a
/// table. Every record in it is lost.
pub async fn drop_table(pool: &PgPool, table: &str) -> Result<(), SetupError> {
    let table = table_name(table)?;
    let table = table.as_str();
    let failed = |e| setup_error(pool, e);
    let mut tx = pool.begin().await.map_err(failed)?;
    // `CREATE … IF NOT EXISTS` of what is there says so in a notice, which the driver
    // would log at every start.
    tx.execute("SET LOCAL client_min_messages TO warning")
        .await
        .map_err(failed)?;
    Postgres::lock_migrations(&mut tx, MigrationLock::Numbered(MIGRATION_LOCK))
        .await
        .map_err(failed)?;
    tx.execute(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .await
        .map_err(failed)?;
    tx.execute(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {}",
        meta_table(table)
    )))
    .await
    .map_err(failed)?;
    tx.execute(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {}",
        rate_table(table)
    )))
    .await
    .map_err(failed)?;
    tx.execute(AssertSqlSafe(format!(
        "DROP FUNCTION IF EXISTS {}()",
        notify_function(table)
    )))
    .await
    .map_err(failed)?;
    let tracked: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('idem_schema_migrations')::text")
            .fetch_one(&mut *tx)
            .await
            .map_err(failed)?;
    if tracked.is_some() {
        sqlx::query("DELETE FROM idem_schema_migrations WHERE table_name = $1")
            .bind(table)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_must_be_plain_identifiers() {
        for ok in ["idem_records", "idem_records_case_0a1b2c3d7", "t", "_x9"] {
            assert_eq!(table_name(ok).unwrap().as_str(), ok);
        }
        // PostgreSQL would fold it, unquoted; the store folds it first.
        assert_eq!(table_name("Idem").unwrap().as_str(), "idem");
        let long = "a".repeat(56);
        for bad in [
            "",
            "9lives",
            "idem-records",
            "idem records",
            "x;DROP TABLE y",
            "\"quoted\"",
            "schema.table",
            "pg_records",
            long.as_str(),
        ] {
            assert!(
                matches!(
                    table_name(bad),
                    Err(SetupError::Namespace {
                        kind: "postgres",
                        ..
                    })
                ),
                "{bad:?} must be rejected"
            );
        }
        assert!(table_name(&"a".repeat(55)).is_ok());
    }

    #[test]
    fn migrations_are_numbered_in_order_up_to_the_schema_version() {
        let versions: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
        let expected: Vec<i32> = (1..=SCHEMA_VERSION).collect();
        assert_eq!(versions, expected);
        for m in MIGRATIONS {
            for s in (m.statements)("t_x") {
                assert!(s.contains("t_x"), "{s}");
            }
        }
    }
}
