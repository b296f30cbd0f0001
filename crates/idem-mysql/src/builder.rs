//! [`MySqlStoreBuilder`]: the settings a [`MySqlStore`] is built with, and its pool's.

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::open::{query_pairs, refuse_unknown_parameters};
use idem_core::{SetupError, SharedClock, SystemClock};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::pool::PoolConnectionMetadata;
use sqlx::{Connection, MySqlConnection, MySqlPool};

use crate::batch::{BatchConfig, Batcher, DEFAULT_MAX_BATCH};
use crate::error::{KIND, connect_error};
use crate::poller::{DEFAULT_WAIT_POLL, Poller};
use crate::schema::{self, DEFAULT_TABLE};
use crate::statements::Statements;
use crate::store::MySqlStore;
use crate::tls;

/// The pool's default most connections.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// The bound on one operation of a [`MySqlStore`], its retries included, unless configured
/// otherwise ([`MySqlStoreBuilder::operation_timeout`]).
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// The URL schemes the store reads, one meaning: MySQL and MariaDB speak one protocol.
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];

/// Settings for a [`MySqlStore`]: its table, clock, pool and timeouts, and whether it
/// migrates its table when it connects.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_mysql::SetupError> {
/// let store = idem_mysql::MySqlStore::builder()
///     .table("payments_idem")
///     .max_connections(20)
///     .connect("mysql://app:secret@127.0.0.1:3306/payments")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone)]
pub struct MySqlStoreBuilder {
    table: String,
    clock: SharedClock,
    acquire_timeout: Duration,
    operation_timeout: Duration,
    max_connections: u32,
    migrate: bool,
    wait_poll: Duration,
    batching: bool,
    max_batch: usize,
    batches_in_flight: Option<usize>,
}

impl fmt::Debug for MySqlStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStoreBuilder")
            .field("table", &self.table)
            .field("clock", &self.clock)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .field("max_connections", &self.max_connections)
            .field("migrate", &self.migrate)
            .field("wait_poll", &self.wait_poll)
            .field("batching", &self.batching)
            .field("max_batch", &self.max_batch)
            .field("batches_in_flight", &self.batches_in_flight)
            .finish()
    }
}

impl Default for MySqlStoreBuilder {
    fn default() -> Self {
        MySqlStoreBuilder {
            table: DEFAULT_TABLE.to_owned(),
            clock: Arc::new(SystemClock),
            acquire_timeout: Duration::from_secs(2),
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            migrate: true,
            wait_poll: DEFAULT_WAIT_POLL,
            batching: true,
            max_batch: DEFAULT_MAX_BATCH,
            batches_in_flight: None,
        }
    }
}

impl MySqlStoreBuilder {
    /// The records table ([`DEFAULT_TABLE`] by default); its secrets go to
    /// `TABLE_meta`. A plain identifier, checked when the store is built.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The clock the store reads "now" from (the system's by default).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long an operation waits for a pooled connection (2 s by default).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// How long an operation may take in all, its retries included, before it is
    /// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) (5 s by default).
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The most connections the pool opens ([`DEFAULT_MAX_CONNECTIONS`] by default; at
    /// least 1).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Whether connecting migrates the table (on by default). Off, the store expects
    /// the table migrated already and does not check it.
    pub fn migrate(mut self, run: bool) -> Self {
        self.migrate = run;
        self
    }

    /// How often the store looks for the completion of the records its waiting
    /// duplicates watch (SPEC S15; [`DEFAULT_WAIT_POLL`] by default): one statement per
    /// interval for all of them, while any waits. [`Duration::ZERO`] turns the poller
    /// off, and each waiter then reserves again on a backoff of its own. A URL's
    /// `wait-poll-ms` overrides it.
    pub fn wait_poll(mut self, every: Duration) -> Self {
        self.wait_poll = every;
        self
    }

    /// Whether reserves and completions that queue while others are written go to the
    /// server together, one statement and one commit per kind of operation for the
    /// whole batch (on by default). A lone operation is written at once, alone. See
    /// [`MySqlStore::batch_stats`].
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// The most operations one batch carries (default [`DEFAULT_MAX_BATCH`], at most
    /// 256); more wait for the next batch.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// The most batches written at once, each on a pooled connection of its own
    /// (default: a quarter of the pool, at least one). Fewer make larger batches and
    /// leave more connections to everything else.
    pub fn batches_in_flight(mut self, n: usize) -> Self {
        self.batches_in_flight = Some(n.max(1));
        self
    }

    /// Connects to `url` (`mysql://user:password@host:3306/database`, or `mariadb://`
    /// the same), checks that the server answers, and migrates the table unless told
    /// not to.
    pub async fn connect(self, url: &str) -> Result<MySqlStore, SetupError> {
        let migrate = self.migrate;
        let store = self.connect_lazy(url)?;
        store.reach().await?;
        if migrate {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// A store whose pool connects on its first operation: the URL and the table name
    /// are checked, nothing else.
    pub fn connect_lazy(mut self, url: &str) -> Result<MySqlStore, SetupError> {
        let (options, wait_poll) = parse_url(url)?;
        if let Some(every) = wait_poll {
            self.wait_poll = every;
        }
        let pool = MySqlPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            // sqlx's default pings every connection it hands out: one more round trip
            // per statement (three of them for a reserve that found a record). Only
            // connections that sat idle are checked; a busy one that broke fails its
            // operation (unavailable, fail-closed; a reserve's insert whose outcome that
            // leaves open is released by its token) and is dropped.
            .test_before_acquire(false)
            .before_acquire(ping_if_idle)
            .connect_lazy_with(options);
        self.build(pool)
    }

    /// A store on the caller's pool, migrated unless told not to.
    pub async fn from_pool(self, pool: MySqlPool) -> Result<MySqlStore, SetupError> {
        let migrate = self.migrate;
        let store = self.build(pool)?;
        if migrate {
            store.migrate().await?;
        }
        Ok(store)
    }

    fn build(self, pool: MySqlPool) -> Result<MySqlStore, SetupError> {
        let table = schema::table_name(&self.table)?;
        let runtime = tokio::runtime::Handle::try_current().is_ok();
        let poller = (runtime && !self.wait_poll.is_zero()).then(|| {
            Arc::new(Poller::spawn(
                pool.clone(),
                table.as_str(),
                self.clock.clone(),
                self.wait_poll,
                self.operation_timeout,
            ))
        });
        // A quarter of the pool: fewer, larger batches cost the server less per
        // operation (measured: 2 at a time on MariaDB cost it half what 5 did per
        // request, at the same throughput), and leave the rest of the pool to the
        // single-row statements, the poller and a batch's one-by-one retries.
        let in_flight = self.batches_in_flight.unwrap_or_else(|| {
            usize::try_from(pool.options().get_max_connections() / 4).unwrap_or(1)
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
        Ok(MySqlStore {
            batch,
            sql: Arc::new(Statements::for_table(table.as_str())),
            poller,
            pool,
            clock: self.clock,
            operation_timeout: self.operation_timeout,
            lock_retries: Arc::default(),
        })
    }
}

/// Connections idle at least this long are pinged before use.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Pings a pooled connection before use only if it sat idle for [`IDLE_CHECK`]: the
/// server may have closed it meanwhile (`wait_timeout`, a restart, a proxy).
fn ping_if_idle(
    conn: &mut MySqlConnection,
    meta: PoolConnectionMetadata,
) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + '_>> {
    Box::pin(async move {
        if meta.idle_for >= IDLE_CHECK {
            conn.ping().await?;
        }
        Ok(true)
    })
}

/// The query parameters a store URL may carry: those the driver reads that the store
/// can honour, and the store's own [`WAIT_POLL`]. The driver passes over any other
/// without a word, so a misspelt one is refused rather than skipped; its character set
/// stays the store's `utf8mb4`.
pub(crate) const PARAMETERS: &[&str] = &[
    "ssl-mode",
    "sslmode",
    "ssl-ca",
    "sslca",
    "ssl-cert",
    "sslcert",
    "ssl-key",
    "sslkey",
    "socket",
    "statement-cache-capacity",
    WAIT_POLL,
];

/// The store's own parameter: milliseconds between the poller's looks
/// ([`MySqlStoreBuilder::wait_poll`]), 0 for none.
const WAIT_POLL: &str = "wait-poll-ms";

/// The longest `wait-poll-ms`: a minute. A longer pause would leave waiters to their
/// own fallback polling anyway.
const MOST_WAIT_POLL_MS: u64 = 60_000;

/// The driver's options for `url`, and its `wait-poll-ms` if it has one: a scheme of
/// [`SCHEMES`], only [`PARAMETERS`], a known `ssl-mode`, and TLS files that can be read
/// and used ([`crate::tls`]).
fn parse_url(url: &str) -> Result<(MySqlConnectOptions, Option<Duration>), SetupError> {
    let invalid = |why: String| SetupError::invalid(KIND, why);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(
            "the URL has no scheme (mysql:// or mariadb://)".into(),
        ));
    };
    if !SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(invalid(format!(
            "the scheme {scheme}:// is not one of mysql:// and mariadb://"
        )));
    }
    let mut wait_poll = None;
    for pair in query_pairs(url) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == WAIT_POLL {
            let ms = value
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms <= MOST_WAIT_POLL_MS)
                .ok_or_else(|| {
                    invalid(format!(
                        "{WAIT_POLL}={value:?}: expected milliseconds from 0 (no poller) \
                         to {MOST_WAIT_POLL_MS}"
                    ))
                })?;
            wait_poll = Some(Duration::from_millis(ms));
        }
    }
    refuse_unknown_parameters(url, PARAMETERS).map_err(invalid)?;
    tls::check_mode(url).map_err(invalid)?;
    let options = MySqlConnectOptions::from_str(&format!("mysql://{rest}"))
        .map_err(|e| invalid(format!("the driver cannot read the URL: {e}")))?;
    let options = tls::apply(url, options).map_err(invalid)?;
    Ok((options, wait_poll))
}

impl MySqlStore {
    /// A builder with the default settings.
    pub fn builder() -> MySqlStoreBuilder {
        MySqlStoreBuilder::default()
    }

    /// Connects to `url` with the default settings (see
    /// [`MySqlStoreBuilder::connect`]).
    pub async fn connect(url: &str) -> Result<MySqlStore, SetupError> {
        MySqlStore::builder().connect(url).await
    }

    /// One connection of its own, outside the pool, to tell a server that is not there
    /// ([`SetupError::Unreachable`]) from one that refuses ([`SetupError::Refused`]).
    pub(crate) async fn reach(&self) -> Result<(), SetupError> {
        let options = self.pool.connect_options();
        let within = self.pool.options().get_acquire_timeout();
        match tokio::time::timeout(within, MySqlConnection::connect_with(&options)).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                Ok(())
            }
            Ok(Err(e)) => Err(connect_error(e, Some(options.get_ssl_mode()))),
            Err(_) => Err(SetupError::unreachable(
                KIND,
                format!("no connection within {} s", within.as_secs_f64()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_bad_table_name_scheme_or_tls_mode_is_refused_before_connecting() {
        let url = "mysql://root@127.0.0.1:3306/test";
        match MySqlStore::builder()
            .table("orders; DROP TABLE x")
            .connect_lazy(url)
        {
            Err(SetupError::Namespace {
                kind: "mysql",
                name,
                ..
            }) => assert_eq!(name, "orders; DROP TABLE x"),
            other => panic!("expected Namespace, got {other:?}"),
        }
        for (url, says) in [
            ("postgres://127.0.0.1/test", "is not one of"),
            ("127.0.0.1:3306/test", "no scheme"),
            ("mysql://host:notaport/db", "the driver cannot read the URL"),
            (
                "mysql://127.0.0.1/test?ssl-mode=SOMETIMES",
                "ssl-mode=SOMETIMES: not a mode; use DISABLED, PREFERRED",
            ),
            (
                "mysql://127.0.0.1/test?ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/ca.pem",
                "ssl-ca=/nonexistent/ca.pem",
            ),
            (
                "mysql://127.0.0.1/test?ssl-mode=REQUIRED&ssl-cert=/nonexistent/c.pem",
                "ssl-key",
            ),
            (
                "mysql://127.0.0.1/test?ssl_mode=DISABLED",
                "unknown parameter",
            ),
            (
                "mysql://127.0.0.1/test?wait-poll-ms=soon",
                "wait-poll-ms=\"soon\": expected milliseconds",
            ),
            ("mysql://127.0.0.1/test?wait-poll-ms=60001", "to 60000"),
        ] {
            match MySqlStore::builder().connect_lazy(url) {
                Err(SetupError::Invalid {
                    kind: "mysql",
                    reason,
                }) => assert!(reason.contains(says), "{url}: {reason}"),
                other => panic!("{url}: expected Invalid, got {other:?}"),
            }
        }
        for url in [url, "mariadb://root@127.0.0.1:3306/test?ssl-mode=DISABLED"] {
            let store = MySqlStore::builder()
                .table("idem_records_custom")
                .connect_lazy(url)
                .expect("a valid name and URL need no server");
            assert_eq!(store.table(), "idem_records_custom");
        }
    }
}
