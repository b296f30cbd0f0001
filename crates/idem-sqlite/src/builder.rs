//! [`SqliteStoreBuilder`]: the settings a [`SqliteStore`] opens with, and the URL
//! parameters it reads itself.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{MigrationPlan, Namespace, SetupError, SharedClock, SystemClock};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Connection, SqliteConnection};

use crate::connection::Target;
use crate::error::{KIND, setup_error};
use crate::schema::{self, DEFAULT_TABLE, Statements};
use crate::store::{DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, SqliteStore};
use crate::writer::{DEFAULT_WRITE_BATCH, DEFAULT_WRITE_QUEUE, Writer, WriterConfig};

/// Settings for opening a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    clock: SharedClock,
    table: String,
    max_connections: u32,
    busy_timeout: Duration,
    writer: WriterConfig,
    migrate: bool,
}

impl Default for SqliteStoreBuilder {
    fn default() -> Self {
        SqliteStoreBuilder {
            clock: Arc::new(SystemClock),
            table: DEFAULT_TABLE.to_owned(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            writer: WriterConfig {
                max_batch: DEFAULT_WRITE_BATCH,
                queue: DEFAULT_WRITE_QUEUE,
            },
            migrate: true,
        }
    }
}

impl SqliteStoreBuilder {
    /// Reads the current time from `clock` instead of the system clock (tests use a
    /// `ManualClock`). Every timestamp the store writes or compares comes from it, never
    /// from SQLite's own clock.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Keeps records in `table` instead of `idem_records`. Checked when the store opens,
    /// by the [`Namespace`] rule.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The pool size for [`connect`](Self::connect) (default
    /// [`DEFAULT_MAX_CONNECTIONS`], at least 1).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long a write waits for the lock held by another connection or process
    /// (default [`DEFAULT_BUSY_TIMEOUT`]).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// At most `n` writes per transaction (default [`DEFAULT_WRITE_BATCH`], at least 1).
    /// Larger batches commit less often; each caller waits for its whole batch.
    pub fn write_batch(mut self, n: usize) -> Self {
        self.writer.max_batch = n.max(1);
        self
    }

    /// Whether opening creates a missing database file and brings the table's schema
    /// up to date (default true). Off, nothing of the schema is written and no file is
    /// made: a missing file or table is [`SetupError::NoSchema`], an older or newer
    /// schema [`SetupError::SchemaVersion`]. For inspecting a file, and where the schema
    /// is managed apart from the service.
    pub fn migrate(mut self, run: bool) -> Self {
        self.migrate = run;
        self
    }

    /// At most `n` writes wait for the writer (default [`DEFAULT_WRITE_QUEUE`], at
    /// least 1); further callers wait to queue, which slows them instead of growing
    /// memory without bound.
    pub fn write_queue(mut self, n: usize) -> Self {
        self.writer.queue = n.max(1);
        self
    }

    /// The connection options [`connect`](Self::connect) uses for `url`: the file is
    /// created if missing, WAL journal, `synchronous = NORMAL`, this builder's
    /// `busy_timeout`. Useful to build a pool of one's own for
    /// [`from_pool`](Self::from_pool) that the application shares.
    ///
    /// `url` is `sqlite://path`, `sqlite:path` or a bare path, with SQLite's URI
    /// parameters (`?mode=ro`, …) if wanted, and `synchronous=full` (or `normal`,
    /// `extra`, `off`) to choose how commits reach the disk: with `full`, every commit
    /// is synced, so not even a power loss or an OS crash loses a record, at the cost
    /// of an fsync per group commit; with `off`, nothing is ever synced, so either may
    /// lose or corrupt records, and the store logs a warning. `page_size=1024` (a power of two from 512 to
    /// 65536) sets the page size of a database file this call creates; a file that
    /// exists keeps its own. Each new key writes a whole page of the key index to the
    /// WAL, and each checkpoint writes it again, so smaller pages write less: in a load
    /// run of small answers, 1 KiB pages wrote about half the bytes per request that
    /// SQLite's default 4 KiB did, at the same throughput. A large body then spans
    /// more pages.
    pub fn connect_options(&self, url: &str) -> Result<SqliteConnectOptions, SetupError> {
        let (url, params) = split_params(url)?;
        let options = SqliteConnectOptions::from_str(&url)
            .map_err(setup_error)?
            .create_if_missing(self.migrate)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(params.synchronous.unwrap_or(SqliteSynchronous::Normal))
            .busy_timeout(self.busy_timeout);
        Ok(match params.page_size {
            Some(bytes) => options.page_size(bytes),
            None => options,
        })
    }

    /// What [`connect`](Self::connect) with migration on would change in the
    /// schema of `url`'s database, found on a read-only connection: no file, table or
    /// row is made. A file that is not there has no version, and the plan creates it.
    pub async fn migration_plan(&self, url: &str) -> Result<MigrationPlan, SetupError> {
        let table = self.checked_table()?;
        let (base, _) = split_params(url)?;
        // Read-write, as `keys list` opens: the last connection to close removes the
        // `-wal` and `-shm` it found or made, which a read-only one cannot.
        let options = SqliteConnectOptions::from_str(&base)
            .map_err(setup_error)?
            .create_if_missing(false)
            .busy_timeout(self.busy_timeout);
        let found = if options.get_filename().is_file() {
            let mut conn = SqliteConnection::connect_with(&options)
                .await
                .map_err(setup_error)?;
            let found = schema::applied_version(&mut conn, table.as_str()).await;
            let _ = conn.close().await;
            found.map_err(setup_error)?
        } else {
            missing_directory(options.get_filename())?;
            None
        };
        let version = |v: i64| u32::try_from(v).unwrap_or(0);
        Ok(MigrationPlan {
            table: table.as_str().to_owned(),
            from: found.map(version),
            to: version(schema::SCHEMA_VERSION),
            statements: schema::migration_sql(table.as_str(), found.unwrap_or(0)),
        })
    }

    /// The table, if the [`Namespace`] rule admits it.
    fn checked_table(&self) -> Result<Namespace, SetupError> {
        Namespace::new(&self.table).map_err(|source| SetupError::Namespace {
            kind: KIND,
            name: self.table.clone(),
            source,
        })
    }

    /// Opens (creating if missing) the database at `url` and migrates it.
    ///
    /// A missing database file is created first with mode 0600, so it and its `-wal`
    /// and `-shm` (which SQLite gives the database's mode) are readable by their owner
    /// only, whatever the umask. A file that exists keeps its mode; if every user may
    /// read or write it, or its `-wal` or `-shm`, a warning says so.
    pub async fn connect(self, url: &str) -> Result<SqliteStore, SetupError> {
        let options = self.connect_options(url)?;
        self.checked_table()?;
        if !self.migrate {
            let path = options.get_filename();
            if !path.is_file() {
                return Err(SetupError::NoSchema {
                    kind: KIND,
                    missing: format!("no file {}", path.display()),
                    migrate: true,
                });
            }
        } else {
            missing_directory(options.get_filename())?;
            crate::file::prepare(url, &options);
        }
        self.connect_with(options).await
    }

    /// Opens a pool with `options` as given and migrates it. A file SQLite creates
    /// here gets SQLite's mode (0644 less the umask): create it beforehand with the
    /// mode wanted, as [`connect`](Self::connect) does.
    pub async fn connect_with(
        self,
        options: SqliteConnectOptions,
    ) -> Result<SqliteStore, SetupError> {
        self.checked_table()?;
        // Two processes opening one new file at once both switch it to WAL; SQLite
        // answers one of them SQLITE_BUSY at once instead of waiting out busy_timeout
        // (waiting could deadlock). Opening again succeeds once the other is done.
        let deadline = std::time::Instant::now() + self.busy_timeout;
        let pool = loop {
            match SqlitePoolOptions::new()
                .max_connections(self.max_connections)
                .connect_with(options.clone())
                .await
            {
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                result => break result.map_err(setup_error)?,
            }
        };
        let store = self.from_pool(pool).await?;
        Ok(SqliteStore {
            changes: idem_core::ChangeHub::new(),
            owns_pool: true,
            ..store
        })
    }

    /// Uses an existing pool (shared with the application's own tables, for
    /// [`SqliteStore::complete_in`]) and migrates it. The pool's connection settings are
    /// left as they are; [`connect_options`](Self::connect_options) gives the
    /// recommended ones. The store's writes go through one more connection of its own
    /// to the pool's database, opened with the pool's file and the `busy_timeout`,
    /// `synchronous`, `foreign_keys` and journal mode its connections have (hooks such as
    /// `after_connect` do not run on it).
    pub async fn from_pool(self, pool: SqlitePool) -> Result<SqliteStore, SetupError> {
        let table = self.checked_table()?;
        let mut conn = pool.acquire().await.map_err(setup_error)?;
        if self.migrate {
            schema::migrate(&mut conn, table.as_str()).await?;
        } else {
            let path = pool.connect_options().get_filename().display().to_string();
            schema::check(&mut conn, table.as_str(), &path).await?;
        }
        let target = Target::of(&mut conn, &pool.connect_options())
            .await
            .map_err(setup_error)?;
        drop(conn);
        let never_syncs = target.never_syncs();
        if never_syncs {
            tracing::warn!(
                "the SQLite idempotency store runs with synchronous = off: a machine crash \
                 or power loss can lose or corrupt its records, and a retry of a lost key \
                 executes again; use normal (the default) or full"
            );
        }
        let sql = Arc::new(Statements::new(table.as_str()));
        let writer = Writer::start(
            target,
            pool.clone(),
            self.clock.clone(),
            sql.clone(),
            self.writer,
        )
        .await
        .map_err(|e| {
            SetupError::failed(KIND, format!("opening the store's writer connection: {e}"))
        })?;
        Ok(SqliteStore {
            changes: idem_core::ChangeHub::new(),
            sql,
            table: table.as_str().into(),
            pool,
            clock: self.clock,
            writer,
            owns_pool: false,
            never_syncs,
        })
    }
}

impl SqliteStore {
    /// Settings to open a store with.
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder::default()
    }

    /// Opens (creating if missing) the database at `url` (`sqlite://idem.db`, or a
    /// path) with the default settings, and migrates it.
    pub async fn connect(url: &str) -> Result<SqliteStore, SetupError> {
        SqliteStore::builder().connect(url).await
    }

    /// Uses an existing pool with the default settings, and migrates it.
    pub async fn from_pool(pool: SqlitePool) -> Result<SqliteStore, SetupError> {
        SqliteStore::builder().from_pool(pool).await
    }
}

/// Whether `e` is SQLite's "database is busy" or "locked" (primary codes 5 and 6, in any
/// of their extended forms).
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

/// The query parameters of a store URL that idem reads itself, sqlx does not.
#[derive(Debug, Default)]
struct UrlParams {
    synchronous: Option<SqliteSynchronous>,
    page_size: Option<u32>,
}

/// A setting that cannot work when `file` is not there and neither is its directory.
fn missing_directory(file: &std::path::Path) -> Result<(), SetupError> {
    let name = file.to_string_lossy();
    // SQLite's special names (`:memory:`, sqlx's `file:sqlx-in-memory-N`) are no file.
    if name.is_empty() || name.starts_with(':') || name.starts_with("file:") || file.exists() {
        return Ok(());
    }
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.exists() => Err(SetupError::invalid(
            KIND,
            format!(
                "the directory {} of the database file does not exist",
                dir.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// `url` without the parameters idem reads itself (`synchronous`, `page_size`), and
/// those parameters' values.
fn split_params(url: &str) -> Result<(String, UrlParams), SetupError> {
    let mut params = UrlParams::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), params));
    };
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((key, value)) if key.eq_ignore_ascii_case("synchronous") => {
                params.synchronous = Some(SqliteSynchronous::from_str(value).map_err(setup_error)?);
            }
            Some((key, value)) if key.eq_ignore_ascii_case("page_size") => {
                params.page_size = Some(parse_page_size(value)?);
            }
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, params))
}

/// A page size SQLite accepts: a power of two from 512 to 65536 bytes.
fn parse_page_size(value: &str) -> Result<u32, SetupError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|n| n.is_power_of_two() && (512..=65536).contains(n))
        .ok_or_else(|| {
            SetupError::invalid(
                KIND,
                format!(
                    "invalid page_size {value:?}: use a power of two from 512 to 65536 \
                     (bytes); it applies only when the database file is created"
                ),
            )
        })
}
