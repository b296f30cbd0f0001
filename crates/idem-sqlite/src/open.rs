//! `sqlite://FILE`: the store opens itself from its URL ([`OpenStore`]).

use idem_core::{OpenError, OpenStore, StoreOptions};

use crate::{DEFAULT_MAX_CONNECTIONS, Error, SqliteStore};

/// `sqlite://FILE` or `sqlite:///absolute/path`, relative to the working directory
/// unless the path starts with `/`, with the parameters
/// [`connect_options`](crate::SqliteStoreBuilder::connect_options) reads
/// (`synchronous`, `page_size`, SQLite's own). A namespace `NAME` is the table
/// `NAME_records`.
impl OpenStore for SqliteStore {
    const KIND: &'static str = "sqlite";
    const SCHEMES: &'static [&'static str] = &["sqlite"];

    /// Three per connection of the pool: the database, its WAL and its shared-memory
    /// index.
    fn descriptors(options: &StoreOptions) -> u64 {
        3 * u64::from(options.pool.unwrap_or(DEFAULT_MAX_CONNECTIONS))
    }

    async fn open(url: &str, options: &StoreOptions) -> Result<SqliteStore, OpenError> {
        let path = url.split_once("://").map_or("", |(_, rest)| rest);
        if path.split('?').next().unwrap_or_default().is_empty() {
            return Err(OpenError::invalid_url(
                Self::KIND,
                url,
                "no database file; write sqlite://FILE",
            ));
        }
        let mut builder = SqliteStore::builder();
        if let Some(n) = options.pool {
            builder = builder.max_connections(n);
        }
        if let Some(table) = options.sql_table(Self::KIND)? {
            builder = builder.table(table.as_str());
        }
        builder = builder.migrate(options.schema == idem_core::Schema::Migrate);
        builder.connect(url).await.map_err(|e| match e {
            Error::NoSchema { .. } => OpenError::no_schema(Self::KIND, url, e.to_string()),
            Error::InvalidPageSize(_) => OpenError::invalid_url(Self::KIND, url, e.to_string()),
            Error::InvalidTableName(source) => OpenError::Namespace {
                kind: Self::KIND,
                source,
            },
            Error::Database(sqlx::Error::Configuration(_)) => {
                OpenError::invalid_url(Self::KIND, url, e.to_string())
            }
            other => OpenError::failed(Self::KIND, url, other),
        })
    }
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
        let url = format!("sqlite://{}/missing/dir/idem.db", dir.path().display());
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
