//! The embedded migration and the SQL text of every statement the store runs.
//!
//! Table names cannot be bound as parameters, so the statements are built once per
//! store from a name that the [`Namespace`](idem_core::Namespace) rule has admitted;
//! every value is bound.

use std::sync::Arc;

use idem_core::SetupError;
use idem_sql::SqlDatabase;
use sqlx::{AssertSqlSafe, Connection, Sqlite, SqliteConnection};

use crate::error::{KIND, setup_error};

/// The table idem keeps records in unless told otherwise.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: i64 = 3;

/// The table that records, per records table, which schema version it has. One
/// database may hold several records tables (one per service, say), so SQLite's single
/// `user_version` would not do.
pub const VERSIONS_TABLE: &str = "idem_schema_versions";

/// Version 1. `endpoint` is `Scope::endpoint_str()`: the empty string in internal mode,
/// so the primary key is always the three columns. Times are milliseconds since the
/// Unix epoch from the store's clock, never SQLite's. Headers are
/// `idem_core::codec::encode_headers`. A rowid table rather than `WITHOUT ROWID`: bodies
/// may be a megabyte, which rowid tables keep in overflow pages off the key's b-tree.
fn v1(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
            tenant       TEXT    NOT NULL,
            endpoint     TEXT    NOT NULL,
            idem_key     TEXT    NOT NULL,
            fingerprint  BLOB    NOT NULL,
            created_at   INTEGER NOT NULL,
            expires_at   INTEGER NOT NULL,
            attempt      INTEGER NOT NULL,
            token        INTEGER NOT NULL,
            state        TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
            lease_until  INTEGER,
            status       INTEGER,
            headers      BLOB,
            body         BLOB,
            completed_at INTEGER,
            PRIMARY KEY (tenant, endpoint, idem_key)
        );
        CREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at);"
    )
}

/// Version 2: tombstones (SPEC S16). A `tombstone_until` column (when the tombstone of
/// a completed record ends, if it keeps one), and a third state, `tombstone`: a
/// completed record past its expiry, compacted by the purge into its fingerprint,
/// status and completion time (no headers, no body) and living until its
/// `expires_at`, which is then the tombstone's end. SQLite cannot change a `CHECK`, so
/// the table is rebuilt under the migration's write lock: once, and in one
/// transaction, which rolls back whole if anything fails.
fn v2(table: &str) -> String {
    let columns = "tenant, endpoint, idem_key, fingerprint, created_at, expires_at, attempt, \
                   token, state, lease_until, status, headers, body, completed_at";
    format!(
        "CREATE TABLE {table}_v2 (
            tenant          TEXT    NOT NULL,
            endpoint        TEXT    NOT NULL,
            idem_key        TEXT    NOT NULL,
            fingerprint     BLOB    NOT NULL,
            created_at      INTEGER NOT NULL,
            expires_at      INTEGER NOT NULL,
            attempt         INTEGER NOT NULL,
            token           INTEGER NOT NULL,
            state           TEXT    NOT NULL
                CHECK (state IN ('in_progress', 'completed', 'tombstone')),
            lease_until     INTEGER,
            status          INTEGER,
            headers         BLOB,
            body            BLOB,
            completed_at    INTEGER,
            tombstone_until INTEGER,
            PRIMARY KEY (tenant, endpoint, idem_key)
        );
        INSERT INTO {table}_v2 ({columns}) SELECT {columns} FROM {table};
        DROP TABLE {table};
        ALTER TABLE {table}_v2 RENAME TO {table};
        CREATE INDEX {table}_expires_at ON {table} (expires_at);"
    )
}

/// Version 3: typed record metadata. An `ambiguity` column holds why a record's outcome
/// is ambiguous ([`idem_core::Ambiguity::as_str`]): a completed answer's reason, or the
/// reason an attempt left its record in progress; NULL otherwise. A partial index on it
/// serves the listing of ambiguous records. The answers of older rows kept their reason
/// among the headers (`idem_core::codec::encoded_ambiguity`): it is carried into the
/// column here, and such a row still reads as it did (the column wins when set).
fn v3(table: &str) -> String {
    let mut carry = String::new();
    for reason in idem_core::Ambiguity::ALL {
        let entry = hex::encode(idem_core::codec::encoded_ambiguity(reason));
        carry.push_str(&format!(
            " WHEN instr(headers, X'{entry}') > 0 THEN '{}'",
            reason.as_str()
        ));
    }
    format!(
        "ALTER TABLE {table} ADD COLUMN ambiguity TEXT;
        CREATE INDEX {table}_ambiguity ON {table} (ambiguity) WHERE ambiguity IS NOT NULL;
        UPDATE {table} SET ambiguity = CASE{carry} END
         WHERE state = 'completed' AND headers IS NOT NULL;"
    )
}

/// The table of `table`'s secrets ([`idem_core::Store::init_secret`]): `TABLE_meta`,
/// one row per name, apart from the records, so that no purge or removal of records
/// can reach it.
pub fn meta_table(table: &str) -> String {
    format!("{table}_meta")
}

fn meta(table: &str) -> String {
    let meta = meta_table(table);
    format!(
        "CREATE TABLE IF NOT EXISTS {meta} (
            name  TEXT PRIMARY KEY,
            value BLOB NOT NULL
        )"
    )
}

/// Brings `table` to [`SCHEMA_VERSION`]; running it again changes nothing.
///
/// It runs under `BEGIN IMMEDIATE`, which takes SQLite's write lock up front (waiting
/// out `busy_timeout`), so two processes opening one file at once migrate one after the
/// other instead of both creating the table.
pub(crate) async fn migrate(conn: &mut SqliteConnection, table: &str) -> Result<(), SetupError> {
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(setup_error)?;
    sqlx::query(VERSIONS_DDL)
        .execute(&mut *tx)
        .await
        .map_err(setup_error)?;
    let found: Option<i64> =
        sqlx::query_scalar("SELECT version FROM idem_schema_versions WHERE table_name = ?1")
            .bind(table)
            .fetch_optional(&mut *tx)
            .await
            .map_err(setup_error)?;
    let found = found.unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(version_error(table, found));
    }
    apply(&mut tx, table, found).await.map_err(setup_error)?;
    tx.commit().await.map_err(setup_error)
}

/// The steps that bring `table` from version `found` to [`SCHEMA_VERSION`], in the
/// migration's transaction.
async fn apply(conn: &mut SqliteConnection, table: &str, found: i64) -> sqlx::Result<()> {
    if found < 1 {
        sqlx::raw_sql(AssertSqlSafe(v1(table)))
            .execute(&mut *conn)
            .await?;
    }
    if found < 2 {
        sqlx::raw_sql(AssertSqlSafe(v2(table)))
            .execute(&mut *conn)
            .await?;
    }
    if found < 3 {
        sqlx::raw_sql(AssertSqlSafe(v3(table)))
            .execute(&mut *conn)
            .await?;
    }
    if found < SCHEMA_VERSION {
        sqlx::query(AssertSqlSafe(record_version("?1, ?2")))
            .bind(table)
            .bind(SCHEMA_VERSION)
            .execute(&mut *conn)
            .await?;
    }
    // Whatever the version: the secrets table came after version 1's first files.
    sqlx::raw_sql(AssertSqlSafe(meta(table)))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// `table` at schema version `found`, which is not this build's.
fn version_error(table: &str, found: i64) -> SetupError {
    SetupError::SchemaVersion {
        kind: KIND,
        at: format!("table {table}"),
        found,
        supported: SCHEMA_VERSION,
    }
}

/// The schema version of `table`, reading only: `None` when none was ever recorded
/// (no versions table, or no row for it).
pub(crate) async fn applied_version(
    conn: &mut SqliteConnection,
    table: &str,
) -> sqlx::Result<Option<i64>> {
    let versions: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'idem_schema_versions'",
    )
    .fetch_optional(&mut *conn)
    .await?;
    if versions.is_none() {
        return Ok(None);
    }
    sqlx::query_scalar("SELECT version FROM idem_schema_versions WHERE table_name = ?1")
        .bind(table)
        .fetch_optional(&mut *conn)
        .await
}

/// The SQL [`migrate`] runs on `table` at schema version `from` (0: none), as text a
/// database administrator can read and run, in one `BEGIN IMMEDIATE` transaction:
/// empty when `from` is current or newer.
pub(crate) fn migration_sql(table: &str, from: i64) -> Vec<String> {
    if from >= SCHEMA_VERSION {
        return Vec::new();
    }
    let mut statements = vec![VERSIONS_DDL.to_owned()];
    if from < 1 {
        statements.push(v1(table));
    }
    if from < 2 {
        statements.push(v2(table));
    }
    statements.push(v3(table));
    statements.push(record_version(&format!("'{table}', {SCHEMA_VERSION}")));
    statements.push(meta(table));
    statements
}

/// The statement that records a table's schema version, `values` its name and version.
fn record_version(values: &str) -> String {
    Sqlite::upsert(
        &format!("INSERT INTO {VERSIONS_TABLE} (table_name, version) VALUES ({values})"),
        "table_name",
        &["version"],
    )
}

/// The table of schema versions, one row per records table.
const VERSIONS_DDL: &str = "CREATE TABLE IF NOT EXISTS idem_schema_versions (
            table_name TEXT PRIMARY KEY,
            version    INTEGER NOT NULL
        )";

/// Checks, writing nothing, that `table` (in the database file `path`) is at
/// [`SCHEMA_VERSION`].
pub(crate) async fn check(
    conn: &mut SqliteConnection,
    table: &str,
    path: &str,
) -> Result<(), SetupError> {
    match applied_version(conn, table).await.map_err(setup_error)? {
        None => Err(SetupError::NoSchema {
            kind: KIND,
            missing: format!("{path} has no table {table}"),
            migrate: true,
        }),
        Some(found) if found != SCHEMA_VERSION => Err(version_error(table, found)),
        Some(_) => Ok(()),
    }
}

/// The store's statements for one table, built once.
#[derive(Debug)]
pub(crate) struct Statements {
    pub insert: Arc<str>,
    pub reserve: Arc<str>,
    pub select: Arc<str>,
    pub complete: Arc<str>,
    pub completed_by: Arc<str>,
    pub renew: Arc<str>,
    pub release: Arc<str>,
    pub mark: Arc<str>,
    pub remove: Arc<str>,
    pub expired: Arc<str>,
    pub compact: Arc<str>,
    pub purge: Arc<str>,
    pub init_secret: Arc<str>,
    pub secret: Arc<str>,
}

/// The columns [`Statements::select`] returns, in order.
pub(crate) const RECORD_COLUMNS: &str = "fingerprint, created_at, expires_at, attempt, token, \
     state, lease_until, status, headers, body, completed_at, tombstone_until, ambiguity";

impl Statements {
    pub(crate) fn new(t: &str) -> Statements {
        const PK: &str = "tenant = ?1 AND endpoint = ?2 AND idem_key = ?3";
        // Fenced: the caller's token holds a record that has not expired (?4 token,
        // ?5 now). Expiry fences too: an expired record counts as absent (SPEC S8).
        const FENCE: &str = "token = ?4 AND expires_at > ?5";
        // The expiry of a record completed now (?9 the TTL in ms), from the old row.
        const COMPLETED_EXPIRY: &str =
            "(CASE WHEN ?9 < expires_at - created_at THEN created_at + ?9 ELSE expires_at END)";
        // A fresh in-progress record, attempt 1: the start of `insert` and `reserve`.
        // ?1–?3 the scope, ?4 fingerprint, ?5 now, ?6 expires_at, ?7 token,
        // ?8 lease_until.
        let meta = meta_table(t);
        let fresh = format!(
            "INSERT INTO {t} (tenant, endpoint, idem_key, fingerprint, created_at,
                 expires_at, attempt, token, state, lease_until)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, 'in_progress', ?8)"
        );
        Statements {
            // A fresh key, the common case: a plain insert. The upsert below does the
            // same and more, but SQLite runs it with a statement journal and buffers
            // its RETURNING row in an ephemeral table, which cost more than the insert
            // itself. Same parameters as `reserve`.
            insert: Sqlite::insert_if_absent(&fresh, "tenant, endpoint, idem_key").into(),
            // The S5 table's Execute rows, as the WHERE of the conflict branch, which
            // must say exactly what `idem_core::decide` says:
            //   expired, no live tombstone follows it       -> attempt 1, a fresh record
            //   in progress, lease lapsed, same fingerprint -> attempt n+1, created_at
            //       kept, expires_at pushed to cover the new lease
            // Otherwise nothing is written and nothing returned, and the store reads the
            // row to learn which other answer applies. SET expressions see the old row.
            // ?4 fingerprint, ?5 now, ?6 expires_at of a fresh record, ?7 token,
            // ?8 lease_until.
            reserve: format!(
                "{fresh}
                 ON CONFLICT (tenant, endpoint, idem_key) DO UPDATE SET
                     fingerprint  = excluded.fingerprint,
                     created_at   = CASE WHEN expires_at <= ?5 THEN ?5 ELSE created_at END,
                     expires_at   = CASE WHEN expires_at <= ?5 THEN ?6
                                         ELSE max(expires_at, ?8) END,
                     attempt      = CASE WHEN expires_at <= ?5 THEN 1
                                         ELSE min(attempt + 1, 4294967295) END,
                     token        = ?7,
                     state        = 'in_progress',
                     lease_until  = ?8,
                     status       = NULL,
                     headers      = NULL,
                     body         = NULL,
                     completed_at = NULL,
                     tombstone_until = NULL,
                     ambiguity    = NULL
                 WHERE (expires_at <= ?5
                        AND NOT (state = 'completed' AND COALESCE(tombstone_until, 0) > ?5))
                    OR (state = 'in_progress' AND lease_until <= ?5 AND fingerprint = ?4)
                 RETURNING attempt"
            )
            .into(),
            select: format!("SELECT {RECORD_COLUMNS} FROM {t} WHERE {PK}").into(),
            // ?6 status, ?7 headers, ?8 body, ?9 the TTL in ms, ?10 the tombstone TTL
            // in ms (0 for none), ?11 the answer's ambiguity or NULL. A completed record expires at creation + TTL, as
            // `Lease::completed_expires_at` says: the lease may have kept it alive
            // longer while in progress; its tombstone ends the tombstone TTL later
            // (`Lease::tombstone_until`). Written as CASEs so that no sum overflows.
            complete: format!(
                "UPDATE {t} SET state = 'completed', status = ?6, headers = ?7, body = ?8,
                     completed_at = ?5, lease_until = NULL, ambiguity = ?11,
                     expires_at = {COMPLETED_EXPIRY},
                     tombstone_until = CASE
                         WHEN ?10 = 0 THEN NULL
                         WHEN {COMPLETED_EXPIRY} > 9223372036854775807 - ?10
                             THEN 9223372036854775807
                         ELSE {COMPLETED_EXPIRY} + ?10 END
                 WHERE {PK} AND {FENCE} AND state = 'in_progress'"
            )
            .into(),
            // Tells a repeated completion by the same attempt (success, first response
            // kept) from a fenced one, after `complete` changed no row.
            completed_by: format!(
                "SELECT 1 FROM {t} WHERE {PK} AND {FENCE} AND state = 'completed'"
            )
            .into(),
            // ?6 new lease_until. Expiry never falls before the lease it covers.
            renew: format!(
                "UPDATE {t} SET lease_until = ?6, expires_at = max(expires_at, ?6)
                 WHERE {PK} AND {FENCE} AND state = 'in_progress'"
            )
            .into(),
            release: format!("DELETE FROM {t} WHERE {PK} AND {FENCE} AND state = 'in_progress'")
                .into(),
            // ?6 the reason the attempt leaves its record in progress.
            mark: format!(
                "UPDATE {t} SET ambiguity = ?6 WHERE {PK} AND {FENCE} AND state = 'in_progress'"
            )
            .into(),
            remove: format!("DELETE FROM {t} WHERE {PK}").into(),
            // ?1 now, ?2 limit: the first expired rows, through the expires_at index,
            // each with whether it is a completed record whose tombstone outlives it
            // (SPEC S16). Such a row is compacted into its tombstone (`compact`, ?1 the
            // rowid), which the index then finds at its own end; the rest are deleted
            // (`purge`, ?1 the rowid).
            expired: format!(
                "SELECT rowid, state = 'completed' AND COALESCE(tombstone_until, 0) > ?1
                   FROM {t} WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2"
            )
            .into(),
            compact: format!(
                "UPDATE {t} SET state = 'tombstone', headers = NULL, body = NULL,
                     ambiguity = NULL, expires_at = tombstone_until
                 WHERE rowid = ?1"
            )
            .into(),
            purge: format!("DELETE FROM {t} WHERE rowid = ?1").into(),
            // ?1 name, ?2 candidate.
            init_secret: Sqlite::insert_if_absent(
                &format!("INSERT INTO {meta} (name, value) VALUES (?1, ?2)"),
                "name",
            )
            .into(),
            secret: format!("SELECT value FROM {meta} WHERE name = ?1").into(),
        }
    }
}
