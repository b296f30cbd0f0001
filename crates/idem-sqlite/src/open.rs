//! `sqlite://FILE`: the store opens itself from its URL ([`OpenStore`]).

use idem_core::{MigrationPlan, OpenError, OpenStore, StoreOptions};

use crate::{DEFAULT_MAX_CONNECTIONS, SqliteStore, SqliteStoreBuilder};

/// `sqlite://FILE` or `sqlite:///absolute/path`, relative to the working directory
/// unless the path starts with `/`, with the parameters
/// [`connect_options`](crate::SqliteStoreBuilder::connect_options) reads
/// (`synchronous`, `page_size`, SQLite's own). A namespace `NAME` is the table
/// `NAME_records`.
impl OpenStore for SqliteStore {
    const KIND: &'static str = crate::error::KIND;
    const SCHEMES: &'static [&'static str] = &["sqlite"];
    /// A write waits this long for another's lock.
    const OPERATION_TIMEOUT: Option<std::time::Duration> = Some(crate::DEFAULT_BUSY_TIMEOUT);

    /// Three per connection of the pool: the database, its WAL and its shared-memory
    /// index.
    fn descriptors(options: &StoreOptions) -> u64 {
        3 * u64::from(options.pool.unwrap_or(DEFAULT_MAX_CONNECTIONS))
    }

    async fn open(url: &str, options: &StoreOptions) -> Result<SqliteStore, OpenError> {
        builder(url, options)?
            .migrate(options.schema == idem_core::Schema::Migrate)
            .connect(url)
            .await
            .map_err(|e| OpenError::setup(url, options, e))
    }

    async fn plan(url: &str, options: &StoreOptions) -> Result<Option<MigrationPlan>, OpenError> {
        let plan = builder(url, options)?.migration_plan(url).await;
        plan.map(Some)
            .map_err(|e| OpenError::setup(url, options, e))
    }
}

/// The builder for `url` and `options`, before the schema setting.
fn builder(url: &str, options: &StoreOptions) -> Result<SqliteStoreBuilder, OpenError> {
    let path = url.split_once("://").map_or("", |(_, rest)| rest);
    if path.split('?').next().unwrap_or_default().is_empty() {
        return Err(OpenError::invalid_url(
            SqliteStore::KIND,
            url,
            "no database file; write sqlite://FILE",
        ));
    }
    let mut builder = SqliteStore::builder();
    if let Some(n) = options.pool {
        builder = builder.max_connections(n);
    }
    if let Some(table) = options.sql_table(SqliteStore::KIND)? {
        builder = builder.table(table.as_str());
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use idem_core::Store;
    use idem_core::open::checks;

    use super::*;

    async fn open(url: String) -> Result<SqliteStore, OpenError> {
        SqliteStore::open(&url, &StoreOptions::default()).await
    }

    #[tokio::test]
    async fn a_url_without_a_file_or_with_a_bad_parameter_is_an_invalid_url() {
        let dir = tempfile::tempdir().unwrap();
        let bad_page = format!("sqlite://{}/idem.db?page_size=1000", dir.path().display());
        let bad_sync = format!(
            "sqlite://{}/idem.db?synchronous=sometimes",
            dir.path().display()
        );
        let cases = [
            ("sqlite://", "no database file"),
            ("sqlite://?mode=rwc", "no database file"),
            (&bad_page, "invalid page_size"),
            (&bad_sync, "synchronous"),
        ];
        checks::invalid_urls("sqlite", &cases, open).await;
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_made_fails_and_is_not_retried() {
        let dir = tempfile::tempdir().unwrap();
        // Its "directory" is a file.
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"not a directory").unwrap();
        let url = format!("sqlite://{}/idem.db", file.display());
        let e = checks::open_error(&url, open).await;
        assert!(
            matches!(e, OpenError::Failed { kind: "sqlite", .. }),
            "{e:?}"
        );
        assert!(!e.may_pass());
        assert!(
            e.to_string().starts_with("cannot open the sqlite store at"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_missing_directory_is_wrong_as_written_and_makes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/missing/dir/idem.db", dir.path().display());
        let e = checks::open_error(&url, open).await;
        assert!(e.is_configuration(), "{e:?}");
        assert!(
            e.to_string().ends_with(&format!(
                "the directory {}/missing/dir of the database file does not exist",
                dir.path().display()
            )),
            "{e}"
        );
        let e = SqliteStore::plan(&url, &StoreOptions::default())
            .await
            .unwrap_err();
        assert!(e.is_configuration(), "{e:?}");
        assert!(!dir.path().join("missing").exists());
    }

    #[tokio::test]
    async fn a_plan_reads_the_version_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("idem.db");
        let url = format!("sqlite://{}", db.display());
        let options = StoreOptions::default();
        let fresh = SqliteStore::plan(&url, &options).await.unwrap().unwrap();
        assert_eq!(fresh.table, crate::DEFAULT_TABLE);
        assert_eq!((fresh.from, fresh.to), (None, 3));
        assert!(!fresh.is_current());
        let files = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert!(files().is_empty(), "{:?}", files());
        // The plan is what migrating runs: applied by hand, it makes a store this
        // build opens without migrating.
        {
            use sqlx::{Connection, Executor};
            let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
                .await
                .unwrap();
            let script = format!(
                "BEGIN IMMEDIATE;\n{};\nCOMMIT;",
                fresh.statements.join(";\n")
            );
            conn.execute(sqlx::AssertSqlSafe(script)).await.unwrap();
            conn.close().await.unwrap();
        }
        let existing = StoreOptions {
            schema: idem_core::Schema::Existing,
            ..StoreOptions::default()
        };
        let store = SqliteStore::open(&url, &existing).await.unwrap();
        store.ping().await.unwrap();
        store.close().await;
        let current = SqliteStore::plan(&url, &options).await.unwrap().unwrap();
        assert_eq!((current.from, current.to), (Some(3), 3));
        assert!(current.is_current());
        assert_eq!(files(), ["idem.db"]);
    }

    #[tokio::test]
    async fn a_namespace_is_a_table_of_its_own_that_must_fit() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/idem.db", dir.path().display());
        let store = SqliteStore::open(&url, &checks::namespaced("payments"))
            .await
            .unwrap();
        assert_eq!(store.table(), "payments_records");
        store.close().await;
        let store = open(url.clone()).await.unwrap();
        assert_eq!(store.table(), crate::DEFAULT_TABLE);
        store.close().await;
        let long = checks::namespaced(&"n".repeat(56));
        let e = checks::open_error(
            &url,
            |url| async move { SqliteStore::open(&url, &long).await },
        )
        .await;
        assert!(
            matches!(e, OpenError::Namespace { kind: "sqlite", .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("is too long"), "{e}");
    }

    #[tokio::test]
    async fn a_sqlite_store_does_not_expire_natively() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(format!("sqlite://{}/idem.db", dir.path().display()))
            .await
            .unwrap();
        assert!(!store.expires_natively());
        // The kind says so before any store is open, and the store agrees.
        assert_eq!(store.expires_natively(), SqliteStore::EXPIRES_NATIVELY);
        store.close().await;
    }

    #[test]
    fn three_descriptors_per_pooled_connection() {
        assert_eq!(
            SqliteStore::descriptors(&StoreOptions::default()),
            3 * u64::from(DEFAULT_MAX_CONNECTIONS)
        );
        let four = StoreOptions {
            pool: Some(4),
            ..StoreOptions::default()
        };
        assert_eq!(SqliteStore::descriptors(&four), 12);
    }
}
