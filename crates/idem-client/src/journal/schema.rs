//! The journal's table, made or brought up to date when a journal opens, and its file,
//! made readable by its owner only.

use std::path::Path;

use sqlx::sqlite::SqlitePool;

use crate::Result;

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

/// What business ids add to a journal made before them: the keyed hash of the id, under
/// a unique index (which, in SQLite, lets any number of entries have none), and the
/// answer, so that a later operation with the same id gets it instead of a send.
const BUSINESS_ID_COLUMNS: &str = "
ALTER TABLE idem_client_operations ADD COLUMN business_id BLOB;
ALTER TABLE idem_client_operations ADD COLUMN response_headers BLOB;
ALTER TABLE idem_client_operations ADD COLUMN response_body BLOB;
CREATE UNIQUE INDEX IF NOT EXISTS idem_client_operations_business_id
    ON idem_client_operations (business_id);
";

/// Creates the journal's file with mode 0600 if it is missing (SPEC S14: files holding
/// records are readable by their owner only); warns of one that exists and that every
/// user can read or write. An error creating it is left for SQLite to report.
pub(super) fn create_private(path: &Path) {
    // SQLite's own names (":memory:") are no files.
    if path.as_os_str().is_empty() || path.to_string_lossy().starts_with(':') {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
        if created.is_ok() {
            return;
        }
        idem_core::private_file::warn_if_exposed(
            path,
            "a journal of operations: bodies and keys; and its -wal and -shm",
            idem_core::private_file::Exposure::Group,
        );
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Creates the table, or brings one made by an earlier release up to date, in one
/// write transaction so that processes opening the file at once migrate it once.
pub(super) async fn migrate(pool: &SqlitePool) -> Result<()> {
    sqlx::raw_sql(SCHEMA).execute(pool).await?;
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    // The table's columns, not `user_version`: a pool given to `with_pool` may be the
    // application's database, whose version is its own.
    let has_business_ids: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pragma_table_info('idem_client_operations')
         WHERE name = 'business_id'",
    )
    .fetch_one(&mut *tx)
    .await?;
    if has_business_ids == 0 {
        sqlx::raw_sql(BUSINESS_ID_COLUMNS).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}
