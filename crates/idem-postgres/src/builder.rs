//! [`PgStoreBuilder`]: the settings a [`PgStore`] is built with, and its pool's.

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{SetupError, SharedClock, SystemClock};
use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::batch::{BatchConfig, Batcher, DEFAULT_MAX_BATCH};
use crate::durability::durability_risk;
use crate::error::{KIND, setup_error};
use crate::listen;
use crate::schema::{self, DEFAULT_TABLE};
use crate::statements::Statements;
use crate::store::PgStore;
use crate::tls;

/// The former name of [`PgStoreBuilder`].
#[deprecated(since = "0.1.0", note = "renamed `PgStoreBuilder`")]
pub type PgStoreOptions = PgStoreBuilder;

/// Connections in the pool a [`PgStore`] builds unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// The bound on one operation of a [`PgStore`], its retries included, unless configured
/// otherwise ([`PgStoreBuilder::operation_timeout`]).
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings for a [`PgStore`]; start from [`PgStore::builder`].
#[derive(Clone)]
pub struct PgStoreBuilder {
    table: String,
    clock: SharedClock,
    acquire_timeout: Duration,
    operation_timeout: Duration,
    max_connections: u32,
    migrate: bool,
    batching: bool,
    max_batch: usize,
    batches_in_flight: Option<usize>,
}

impl fmt::Debug for PgStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStoreBuilder")
            .field("table", &self.table)
            .field("clock", &self.clock)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("max_connections", &self.max_connections)
            .field("migrate", &self.migrate)
            .field("batching", &self.batching)
            .field("max_batch", &self.max_batch)
            .field("batches_in_flight", &self.batches_in_flight)
            .finish()
    }
}

impl Default for PgStoreBuilder {
    fn default() -> Self {
        PgStoreBuilder {
            table: DEFAULT_TABLE.to_owned(),
            clock: Arc::new(SystemClock),
            acquire_timeout: Duration::from_secs(2),
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            migrate: true,
            batching: true,
            max_batch: DEFAULT_MAX_BATCH,
            batches_in_flight: None,
        }
    }
}

impl PgStoreBuilder {
    /// The table records live in (default `idem_records`). Checked when the store is
    /// built, by [`schema::table_name`].
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The clock every statement's "now" comes from (default: the system clock). The
    /// server's own `now()` is never used, so tests move time by hand and several
    /// instances agree as far as their clocks do.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long an operation waits for a pooled connection, including opening a new
    /// one, before failing with [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) (default 2 s). Only used
    /// when this crate builds the pool ([`connect`](Self::connect)).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// The bound on one store operation, round trips and retries included (default
    /// 5 s). A server that accepts connections but stops answering yields
    /// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) after this long instead of a hung request.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The pool size when this crate builds the pool (default 10).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Whether to run the embedded migration when the store is built (default true).
    /// Turn it off where the application's role may not create tables, and run
    /// [`PgStore::migrate`] from a role that may.
    pub fn migrate(mut self, run: bool) -> Self {
        self.migrate = run;
        self
    }

    /// Whether reserves, completions and releases that queue while others are being
    /// written go to the server together, one statement and one commit per kind of
    /// operation for the whole batch (default true). A lone operation is written at
    /// once either way; off, every operation is a statement and a commit of its own.
    /// See [`PgStore::batch_stats`].
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// The most operations one batch carries (default [`DEFAULT_MAX_BATCH`]); more
    /// wait for the next.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// The most batches written at once, each on a pooled connection of its own
    /// (default: half the pool, at least one). Fewer make larger batches and fewer
    /// commits; more overlap the round trips of several.
    pub fn batches_in_flight(mut self, n: usize) -> Self {
        self.batches_in_flight = Some(n.max(1));
        self
    }

    /// Connects to `url` (`postgres://user@host:port/db`), builds a pool and runs the
    /// migration (unless it is turned off), then reads the server's durability settings
    /// ([`PgStore::durability_risk`]). One connection is made first, so that a server
    /// that is not there ([`SetupError::Unreachable`], naming the cause) is told from
    /// one that refuses the store ([`SetupError::Refused`]: its role, its database, its
    /// TLS handshake); a URL whose TLS files cannot work is [`SetupError::Invalid`],
    /// naming the parameter, before anything is tried.
    pub async fn connect(self, url: &str) -> Result<PgStore, SetupError> {
        let migrate = self.migrate;
        let mut store = self.connect_lazy(url)?;
        store.reach().await?;
        if migrate {
            store.migrate().await?;
        }
        store.durability = durability_risk(&store.pool).await.map(Arc::new);
        store.listening(LISTEN_WITHIN).await;
        Ok(store)
    }

    /// Like [`connect`](Self::connect) but touches neither the server nor the schema:
    /// the first operation connects. For processes that must start while the database
    /// is down; operations fail with [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) until it is up.
    pub fn connect_lazy(self, url: &str) -> Result<PgStore, SetupError> {
        let pool = self.pool_options().connect_lazy_with(parse_url(url)?);
        self.build(pool)
    }

    /// Uses an existing pool (its own acquire timeout and size apply) and, unless
    /// turned off, runs the migration and reads the server's durability settings
    /// ([`PgStore::durability_risk`]); with the migration off, nothing is sent to the
    /// server yet.
    pub async fn from_pool(self, pool: PgPool) -> Result<PgStore, SetupError> {
        let run = self.migrate;
        let mut store = self.build(pool)?;
        if run {
            store.migrate().await?;
            store.durability = durability_risk(&store.pool).await.map(Arc::new);
            store.listening(LISTEN_WITHIN).await;
        }
        Ok(store)
    }

    fn pool_options(&self) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            // sqlx's default pings every connection it hands out: one extra round trip
            // per operation. Only connections that sat idle are checked; a busy one
            // that broke fails its operation (Unavailable, fail-closed) and is dropped.
            .test_before_acquire(false)
            .before_acquire(ping_if_idle)
    }

    fn build(self, pool: PgPool) -> Result<PgStore, SetupError> {
        let table = schema::table_name(&self.table)?;
        let in_flight = self.batches_in_flight.unwrap_or_else(|| {
            usize::try_from(pool.options().get_max_connections() / 2).unwrap_or(1)
        });
        let batch = self.batching.then(|| {
            Arc::new(Batcher::new(
                BatchConfig {
                    max_batch: self.max_batch,
                    in_flight,
                },
                table.as_str(),
            ))
        });
        let listener = tokio::runtime::Handle::try_current()
            .is_ok()
            .then(|| Arc::new(listen::spawn(&pool, table.as_str())));
        Ok(PgStore {
            listener,
            batch,
            sql: Arc::new(Statements::for_table(table.as_str())),
            pool,
            clock: self.clock,
            operation_timeout: self.operation_timeout,
            handoff: Arc::default(),
            durability: None,
        })
    }
}

/// How long connecting waits for the store's `LISTEN` connection; a store that is not
/// listening by then works, and its waiting duplicates poll until it is.
const LISTEN_WITHIN: Duration = Duration::from_secs(5);

/// Connections idle at least this long are pinged before use.
const IDLE_CHECK: Duration = Duration::from_secs(1);

fn ping_if_idle(
    conn: &mut PgConnection,
    meta: PoolConnectionMetadata,
) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + '_>> {
    Box::pin(async move {
        if meta.idle_for >= IDLE_CHECK {
            conn.ping().await?;
        }
        Ok(true)
    })
}

/// The driver's options for `url`, with its TLS settings checked and its files read
/// ([`crate::tls`]).
fn parse_url(url: &str) -> Result<PgConnectOptions, SetupError> {
    let invalid = |why| SetupError::invalid(KIND, why);
    tls::check_mode(url).map_err(invalid)?;
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| invalid(format!("the driver cannot read the URL: {e}")))?;
    tls::apply(url, options).map_err(invalid)
}

impl PgStore {
    /// Makes one connection of its own, and closes it: from the pool, a server that is
    /// not there is only "pool timed out", which hides the cause ("connection refused",
    /// a name that does not resolve). Nothing is read or written.
    pub(crate) async fn reach(&self) -> Result<(), SetupError> {
        let options = self.pool.connect_options();
        let within = self.pool.options().get_acquire_timeout();
        match tokio::time::timeout(within, PgConnection::connect_with(&options)).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
            Ok(Err(e)) => Err(setup_error(&self.pool, e)),
            Err(_) => Err(SetupError::unreachable(
                KIND,
                format!("no connection within {} s", within.as_secs_f64()),
            )),
        }
    }

    /// Default settings, to adjust before [connecting](PgStoreBuilder::connect).
    pub fn builder() -> PgStoreBuilder {
        PgStoreBuilder::default()
    }

    /// The former name of [`builder`](Self::builder).
    #[deprecated(since = "0.1.0", note = "renamed `PgStore::builder`")]
    pub fn options() -> PgStoreBuilder {
        PgStore::builder()
    }

    /// Connects with default settings and runs the migration.
    pub async fn connect(url: &str) -> Result<PgStore, SetupError> {
        PgStore::builder().connect(url).await
    }

    /// Uses `pool` with default settings and runs the migration.
    pub async fn from_pool(pool: PgPool) -> Result<PgStore, SetupError> {
        PgStore::builder().from_pool(pool).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(deprecated)]
    fn the_former_builder_names_still_build() {
        let options: PgStoreOptions = PgStore::options().max_connections(3);
        assert_eq!(options.max_connections, 3);
    }

    #[tokio::test]
    async fn bad_table_name_or_url_is_rejected_before_connecting() {
        let url = "postgres://postgres@127.0.0.1:5432/test";
        match PgStore::builder()
            .table("orders; DROP TABLE x")
            .connect_lazy(url)
        {
            Err(SetupError::Namespace {
                kind: "postgres",
                name,
                ..
            }) => {
                assert_eq!(name, "orders; DROP TABLE x");
            }
            other => panic!("expected Namespace, got {other:?}"),
        }
        match PgStore::builder().connect_lazy("postgres://host:notaport/db") {
            Err(SetupError::Invalid {
                kind: "postgres",
                reason,
            }) => assert!(
                reason.starts_with("the driver cannot read the URL"),
                "{reason}"
            ),
            other => panic!("expected Invalid, got {other:?}"),
        }
        let store = PgStore::builder()
            .table("idem_records_custom")
            .connect_lazy(url)
            .expect("a valid name and URL need no server");
        assert_eq!(store.table(), "idem_records_custom");
    }

    #[test]
    fn the_modes_are_libpqs_and_allow_is_refused() {
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            let url = format!("postgres://127.0.0.1/test?sslmode={mode}");
            let options = parse_url(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(tls::mode_name(options.get_ssl_mode()), mode);
        }
        let e = parse_url("postgres://127.0.0.1/test?sslmode=verify_full").unwrap_err();
        assert!(
            e.to_string()
                .contains("sslmode=verify_full: not a mode; use disable"),
            "{e}"
        );
        let e = parse_url("postgres://127.0.0.1/test?ssl-mode=allow").unwrap_err();
        assert!(
            e.to_string().contains("ssl-mode=allow is not supported"),
            "{e}"
        );
    }

    #[test]
    fn a_file_that_cannot_be_read_names_its_parameter() {
        for (url, says) in [
            (
                "postgres://127.0.0.1/test?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
                "sslrootcert=/nonexistent/ca.pem: cannot read the file",
            ),
            (
                "postgres://127.0.0.1/test?sslmode=verify-full&ssl-ca=%2Fnonexistent%2Fa%20b.pem",
                "ssl-ca=/nonexistent/a b.pem: cannot read",
            ),
            (
                "postgres://127.0.0.1/test?sslmode=require&sslcert=/nonexistent/c.pem",
                "sslcert needs sslkey",
            ),
            (
                "postgres://127.0.0.1/test?sslkey=/nonexistent/k.pem",
                "sslkey needs sslcert",
            ),
            (
                "postgres://127.0.0.1/test?sslcert=/nonexistent/c.pem&sslkey=/nonexistent/k.pem",
                "sslcert=/nonexistent/c.pem: cannot read",
            ),
        ] {
            let e = parse_url(url).unwrap_err();
            // A TLS setting's refusal, not the driver's of the URL.
            assert!(
                matches!(
                    &e,
                    SetupError::Invalid {
                        kind: "postgres",
                        reason,
                    } if !reason.starts_with("the driver cannot read the URL")
                ),
                "{url}: {e:?}"
            );
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
    }
}
