//! `postgres://…`: the store opens itself from its URL ([`OpenStore`]).

use std::sync::Arc;

use idem_core::open::refuse_unknown_parameters;
use idem_core::{MigrationPlan, OpenError, OpenStore, StoreOptions};

use crate::PgStore;
use crate::builder::DEFAULT_MAX_CONNECTIONS;
use crate::durability::durability_risk;
use crate::schema;

/// The query parameters a PostgreSQL URL may carry: those the driver reads. It skips
/// any other with no more than a log line, so a misspelt `sslmode` would connect
/// without the TLS it asked for.
const PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "options[…]",
];

/// The store `url` names, with one connection made first, so that a server that is
/// not there is told apart from one that answers and refuses; nothing is read or
/// written yet.
async fn connect(url: &str, options: &StoreOptions) -> Result<PgStore, OpenError> {
    let kind = PgStore::KIND;
    refuse_unknown_parameters(url, PARAMETERS)
        .map_err(|reason| OpenError::invalid_url(kind, url, reason))?;
    let mut builder = PgStore::builder();
    if let Some(n) = options.pool {
        builder = builder.max_connections(n);
    }
    if let Some(table) = options.sql_table(kind)? {
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

/// `postgres://…` or `postgresql://…`, as the driver reads it, with only the query
/// parameters it reads. A namespace `NAME` is the table `NAME_records`. The store
/// connects, migrates its table and reads the server's durability settings before it
/// is handed out.
impl OpenStore for PgStore {
    const KIND: &'static str = crate::error::KIND;
    const SCHEMES: &'static [&'static str] = &["postgres", "postgresql"];
    const OPERATION_TIMEOUT: Option<std::time::Duration> = Some(crate::DEFAULT_OPERATION_TIMEOUT);

    /// One per pooled connection.
    fn descriptors(options: &StoreOptions) -> u64 {
        u64::from(options.pool.unwrap_or(DEFAULT_MAX_CONNECTIONS))
    }

    async fn open(url: &str, options: &StoreOptions) -> Result<PgStore, OpenError> {
        let mut store = connect(url, options).await?;
        let ready = match options.schema {
            idem_core::Schema::Migrate => store.migrate().await,
            idem_core::Schema::Existing => schema::check(store.pool(), store.table()).await,
        };
        if let Err(e) = ready {
            store.pool().close().await;
            return Err(OpenError::setup(url, options, e));
        }
        store.durability = durability_risk(store.pool()).await.map(Arc::new);
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
            table,
            from: found.map(version),
            to: version(schema::SCHEMA_VERSION),
            statements,
        }))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::Store;
    use idem_core::open::checks;
    use idem_core::testing::unique_namespace;
    use idem_test_support::{service_unavailable, service_url};

    use super::*;
    use crate::schema;

    async fn open(url: String) -> Result<PgStore, OpenError> {
        PgStore::open(&url, &StoreOptions::default()).await
    }

    #[tokio::test]
    async fn parameters_the_driver_would_skip_are_an_invalid_url() {
        let cases = [
            (
                "postgres://u@127.0.0.1/test?ssl_mode=require",
                "unknown parameter \"ssl_mode\"",
            ),
            (
                "postgres://127.0.0.1/test?sslmode=require&prefix=x",
                "unknown parameter \"prefix\"",
            ),
            ("postgres://host:notaport/db", "invalid postgres store URL"),
        ];
        checks::invalid_urls("postgres", &cases, open).await;
    }

    #[test]
    fn the_parameters_the_driver_reads_are_kept() {
        for url in [
            "postgres://u@127.0.0.1/test?sslmode=require&application_name=idem",
            "postgresql://127.0.0.1/test?options=-c%20synchronous_commit%3Doff",
            "postgres://127.0.0.1/test?options[statement_timeout]=5s",
        ] {
            assert_eq!(refuse_unknown_parameters(url, PARAMETERS), Ok(()), "{url}");
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_and_may_pass() {
        let url = |port| format!("postgres://postgres:secret@127.0.0.1:{port}/test");
        checks::unreachable_at_a_closed_port("postgres", url, open).await;
    }

    /// `url` with its user (and password) replaced by `user`.
    fn as_user(url: &str, user: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let rest = rest.split_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://{user}@{rest}")
    }

    /// PostgreSQL's refusal reads as the server's message and SQLSTATE, without the
    /// line of the server's C source that sqlx's text ends with ("at line 768"), which
    /// would read as a line of the user's configuration.
    #[tokio::test]
    async fn a_refusal_names_no_line_of_the_servers_source() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let role = unique_namespace("no_such_role");
        let e = match open(as_user(&url, &role)).await {
            Err(e @ OpenError::Unreachable { .. }) => {
                return service_unavailable("PostgreSQL", &url, &e).unwrap_or(());
            }
            Err(e) => e,
            Ok(_) => panic!("role {role} was let in"),
        };
        let text = e.to_string();
        assert!(matches!(e, OpenError::Refused { .. }), "{e:?}");
        assert!(
            text.contains(&format!("role \"{role}\" does not exist")),
            "{text}"
        );
        assert!(text.contains("SQLSTATE 28000"), "{text}");
        assert!(!text.contains(" at line "), "{text}");
    }

    /// The same for a server error met after connecting, as the store reports it.
    #[tokio::test]
    async fn a_server_error_after_connecting_names_no_source_line() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let pool = match sqlx::PgPool::connect(&url).await {
            Ok(pool) => pool,
            Err(e) => return service_unavailable("PostgreSQL", &url, &e).unwrap_or(()),
        };
        let table = unique_namespace("no_such_table");
        let failed = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT * FROM {table}")))
            .execute(&pool)
            .await
            .unwrap_err();
        // sqlx's own text carries the line: the case this guards against.
        assert!(failed.to_string().contains(" at line "), "{failed}");
        let text = crate::error::store_error(failed).to_string();
        assert!(
            text.contains(&format!(
                "relation \"{table}\" does not exist (SQLSTATE 42P01)"
            )),
            "{text}"
        );
        assert!(!text.contains(" at line "), "{text}");
        pool.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_namespace_is_a_table_and_records_do_not_expire_natively() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let name = unique_namespace("open");
        let options = StoreOptions {
            pool: Some(2),
            ..checks::namespaced(&name)
        };
        let store = match PgStore::open(&url, &options).await {
            Ok(store) => store,
            Err(e @ OpenError::Unreachable { .. }) => {
                return service_unavailable("PostgreSQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(store.table(), format!("{name}_records"));
        assert!(!store.expires_natively());
        // The kind says so before any store is open, and the store agrees.
        assert_eq!(store.expires_natively(), PgStore::EXPIRES_NATIVELY);
        store.ping().await.unwrap();
        schema::drop_table(store.pool(), store.table())
            .await
            .expect("drop table");
        store.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plan_writes_nothing_and_is_what_migrating_runs() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let name = unique_namespace("plan");
        let options = StoreOptions {
            pool: Some(2),
            ..checks::namespaced(&name)
        };
        let fresh = match PgStore::plan(&url, &options).await {
            Ok(plan) => plan.expect("a SQL store has a plan"),
            Err(e @ OpenError::Unreachable { .. }) => {
                return service_unavailable("PostgreSQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(fresh.table, format!("{name}_records"));
        assert_eq!(
            (fresh.from, fresh.to),
            (None, crate::schema::SCHEMA_VERSION as u32)
        );
        // Planning made no table: opening without migrating finds none.
        let existing = StoreOptions {
            schema: idem_core::Schema::Existing,
            ..options.clone()
        };
        let e = PgStore::open(&url, &existing).await.unwrap_err();
        assert!(matches!(e, OpenError::NoSchema { .. }), "{e:?}");
        // Run by hand, as a database administrator would, in one transaction.
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        for statement in &fresh.statements {
            sqlx::Executor::execute(&mut *tx, sqlx::AssertSqlSafe(statement.clone()))
                .await
                .unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
        tx.commit().await.unwrap();
        let store = PgStore::open(&url, &existing).await.unwrap();
        store.ping().await.unwrap();
        let current = PgStore::plan(&url, &options).await.unwrap().unwrap();
        let v = crate::schema::SCHEMA_VERSION as u32;
        assert_eq!((current.from, current.to), (Some(v), v));
        assert!(current.is_current());
        schema::drop_table(store.pool(), store.table())
            .await
            .expect("drop table");
        store.close().await;
        pool.close().await;
    }

    #[tokio::test]
    async fn an_unreachable_server_is_named_with_its_cause() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let e = open(format!("postgres://postgres@127.0.0.1:{port}/test"))
            .await
            .unwrap_err();
        assert!(matches!(e, OpenError::Unreachable { .. }), "{e:?}");
        assert!(e.to_string().contains("Connection refused"), "{e}");
        assert!(!e.to_string().contains("pool timed out"), "{e}");
    }

    #[test]
    fn one_descriptor_per_pooled_connection() {
        assert_eq!(
            PgStore::descriptors(&StoreOptions::default()),
            u64::from(DEFAULT_MAX_CONNECTIONS)
        );
        let three = StoreOptions {
            pool: Some(3),
            ..StoreOptions::default()
        };
        assert_eq!(PgStore::descriptors(&three), 3);
    }
}
