//! `mysql://…` and `mariadb://…`: the store opens itself from its URL ([`OpenStore`]).

use idem_core::{MigrationPlan, OpenError, OpenStore, Schema, StoreOptions};

use crate::builder::{DEFAULT_MAX_CONNECTIONS, SCHEMES};
use crate::{MySqlStore, schema};

/// The store `url` names, with one connection made first, so that a server that is
/// not there is told apart from one that answers and refuses; nothing is read or
/// written yet.
async fn connect(url: &str, options: &StoreOptions) -> Result<MySqlStore, OpenError> {
    let mut builder = MySqlStore::builder();
    if let Some(n) = options.pool {
        builder = builder.max_connections(n);
    }
    if let Some(table) = options.sql_table(MySqlStore::KIND)? {
        builder = builder.table(table.as_str());
    }
    let store = builder
        .connect_lazy(url)
        .map_err(|e| OpenError::setup(url, options, e))?;
    store
        .reach()
        .await
        .map_err(|e| OpenError::setup(url, options, e))?;
    Ok(store)
}

/// `mysql://…` or `mariadb://…`, with only the query parameters the store reads. A
/// namespace `NAME` is the table `NAME_records`. The store connects and migrates its
/// table (or, told not to, checks it without writing) before it is handed out.
impl OpenStore for MySqlStore {
    const KIND: &'static str = crate::error::KIND;
    const SCHEMES: &'static [&'static str] = SCHEMES;
    const OPERATION_TIMEOUT: Option<std::time::Duration> = Some(crate::DEFAULT_OPERATION_TIMEOUT);

    /// One per pooled connection.
    fn descriptors(options: &StoreOptions) -> u64 {
        u64::from(options.pool.unwrap_or(DEFAULT_MAX_CONNECTIONS))
    }

    async fn open(url: &str, options: &StoreOptions) -> Result<MySqlStore, OpenError> {
        let store = connect(url, options).await?;
        let ready = match options.schema {
            Schema::Migrate => store.migrate().await,
            Schema::Existing => schema::check(store.pool(), store.table()).await,
        };
        if let Err(e) = ready {
            store.pool().close().await;
            return Err(OpenError::setup(url, options, e));
        }
        Ok(store)
    }

    async fn plan(url: &str, options: &StoreOptions) -> Result<Option<MigrationPlan>, OpenError> {
        let store = connect(url, options).await?;
        let table = store.table().to_owned();
        let found = schema::applied_version(store.pool(), &table).await;
        store.pool().close().await;
        let found = found.map_err(|e| OpenError::setup(url, options, e))?;
        let statements = schema::migration_statements(&table, found.unwrap_or(0))
            .map_err(|e| OpenError::setup(url, options, e))?;
        let version = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(Some(MigrationPlan {
            statements,
            table,
            from: found.map(version),
            to: version(schema::SCHEMA_VERSION),
        }))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::Store;
    use idem_core::open::checks;
    use idem_core::testing::unique_namespace;
    use idem_test_support::service_unavailable;
    use idem_test_support::services::mysql_url;

    use super::*;

    async fn open(url: String) -> Result<MySqlStore, OpenError> {
        MySqlStore::open(&url, &StoreOptions::default()).await
    }

    #[tokio::test]
    async fn parameters_the_driver_would_skip_are_an_invalid_url() {
        let cases = [
            (
                "mysql://root@127.0.0.1/test?ssl_mode=DISABLED",
                "unknown parameter \"ssl_mode\"",
            ),
            (
                "mariadb://127.0.0.1/test?prefix=x",
                "unknown parameter \"prefix\"",
            ),
            ("mysql://host:notaport/db", "invalid mysql store URL"),
        ];
        checks::invalid_urls("mysql", &cases, open).await;
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_and_may_pass() {
        let url = |port| format!("mysql://root:secret@127.0.0.1:{port}/test");
        checks::unreachable_at_a_closed_port("mysql", url, open).await;
    }

    /// A namespace is a table of its own; planning writes nothing, and opening without
    /// migrating a table no migration made is [`OpenError::NoSchema`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_namespace_is_a_table_and_a_plan_writes_nothing() {
        let url = mysql_url();
        let name = unique_namespace("open");
        let options = StoreOptions {
            pool: Some(2),
            ..checks::namespaced(&name)
        };
        let fresh = match MySqlStore::plan(&url, &options).await {
            Ok(plan) => plan.expect("a SQL store has a plan"),
            Err(e @ OpenError::Unreachable { .. }) => {
                return service_unavailable("MySQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(fresh.table, format!("{name}_records"));
        assert_eq!(
            (fresh.from, fresh.to),
            (None, schema::SCHEMA_VERSION as u32)
        );
        let existing = StoreOptions {
            schema: Schema::Existing,
            ..options.clone()
        };
        let e = MySqlStore::open(&url, &existing).await.unwrap_err();
        assert!(matches!(e, OpenError::NoSchema { .. }), "{e:?}");
        let store = MySqlStore::open(&url, &options).await.expect("open");
        assert_eq!(store.table(), format!("{name}_records"));
        assert!(!store.expires_natively());
        store.ping().await.unwrap();
        MySqlStore::open(&url, &existing)
            .await
            .expect("the migrated table");
        let current = MySqlStore::plan(&url, &options).await.unwrap().unwrap();
        assert!(current.is_current(), "{current:?}");
        schema::drop_table(store.pool(), store.table())
            .await
            .expect("drop table");
    }

    #[test]
    fn one_descriptor_per_pooled_connection() {
        assert_eq!(
            MySqlStore::descriptors(&StoreOptions::default()),
            u64::from(DEFAULT_MAX_CONNECTIONS)
        );
    }
}
