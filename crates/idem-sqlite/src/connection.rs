//! The writer's connection: where it opens, with the settings of the pool's, and the
//! thread that checkpoints the WAL beside it.
//!
//! In WAL mode the writer does not checkpoint: SQLite would copy the WAL back into the
//! database file (and, with `synchronous = NORMAL`, sync both) inside the commit that
//! crosses 1000 WAL pages, stalling every write queued behind it. A second thread with
//! its own connection runs a passive checkpoint instead, at most every
//! [`CHECKPOINT_EVERY`] while writes flow, concurrently with the writer. Should it stop,
//! the writer checkpoints for itself again.
//!
//! A checkpoint that runs beside a busy writer never reaches the end of the WAL (frames
//! arrive while it copies), and SQLite starts the WAL over only once all of it is in
//! the database file: under steady load the WAL would grow by every page written,
//! without bound, and each new WAL block costs the kernel a zeroed page. So after each of its
//! rounds the checkpoint thread asks the writer to finish the job: before its next
//! transaction the writer checkpoints what the round left (a few frames, with no write
//! running alongside), and that transaction starts the WAL over. `journal_size_limit`
//! then trims a WAL that a burst made larger than [`WAL_SIZE_LIMIT`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rusqlite::OpenFlags;
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteConnectOptions;

/// The least time between two checkpoints of the checkpoint thread.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// The size, in bytes, that a WAL larger than it is cut back to when it starts over.
const WAL_SIZE_LIMIT: i64 = 64 << 20;

/// Where and how the writer opens its connection: the pool's database, with the
/// settings a pooled connection has.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    path: PathBuf,
    memory: bool,
    busy_timeout: Duration,
    synchronous: i64,
    foreign_keys: bool,
    journal_mode: String,
}

impl Target {
    /// Reads the settings from `conn`, a connection of the pool opened with `options`.
    pub(crate) async fn of(
        conn: &mut SqliteConnection,
        options: &SqliteConnectOptions,
    ) -> Result<Target, sqlx::Error> {
        let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *conn)
            .await?;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await?;
        let foreign_keys: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
            .fetch_one(&mut *conn)
            .await?;
        let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await?;
        // An in-memory database has no file; sqlx names it so that its connections
        // share it through SQLite's shared cache, and so can the writer.
        let file: String =
            sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                .fetch_one(&mut *conn)
                .await?;
        Ok(Target {
            path: options.get_filename().to_owned(),
            memory: file.is_empty(),
            busy_timeout: Duration::from_millis(u64::try_from(busy).unwrap_or(0)),
            synchronous,
            foreign_keys: foreign_keys != 0,
            journal_mode,
        })
    }

    pub(crate) fn open(&self) -> rusqlite::Result<rusqlite::Connection> {
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if self.memory {
            flags |= OpenFlags::SQLITE_OPEN_MEMORY | OpenFlags::SQLITE_OPEN_SHARED_CACHE;
        }
        let conn = rusqlite::Connection::open_with_flags(&self.path, flags)?;
        conn.busy_timeout(self.busy_timeout)?;
        conn.pragma_update(None, "synchronous", self.synchronous)?;
        conn.pragma_update(None, "foreign_keys", self.foreign_keys)?;
        // WAL is a property of the file; the rollback-journal modes are per connection.
        if !self.journal_mode.eq_ignore_ascii_case("wal") {
            conn.pragma_update_and_check(None, "journal_mode", &self.journal_mode, |_| Ok(()))?;
        }
        if self.wal() {
            conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        }
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }

    /// Whether the database has a WAL to checkpoint.
    pub(crate) fn wal(&self) -> bool {
        !self.memory && self.journal_mode.eq_ignore_ascii_case("wal")
    }

    /// Whether commits to a file skip syncing altogether (`synchronous = OFF`), so that
    /// a machine crash or power loss may lose or corrupt the database.
    pub(crate) fn never_syncs(&self) -> bool {
        !self.memory && self.synchronous == 0
    }
}

/// Checkpoints on `conn` each time the writer nudges, at most every
/// [`CHECKPOINT_EVERY`], and then sets `finish` for the writer to copy the frames that
/// arrived meanwhile; ends when the writer drops its end.
pub(crate) fn checkpoint(
    conn: rusqlite::Connection,
    nudges: std::sync::mpsc::Receiver<()>,
    finish: Arc<AtomicBool>,
) {
    while nudges.recv().is_ok() {
        // Passive: copies what it can without waiting for readers or the writer; what
        // it cannot yet copy waits for the writer's finishing checkpoint or the next
        // nudge.
        match passive_checkpoint(&conn) {
            Ok(()) => finish.store(true, Ordering::Release),
            Err(e) => {
                tracing::debug!(error = %e, "checkpointing the idempotency store's WAL failed");
            }
        }
        std::thread::sleep(CHECKPOINT_EVERY);
    }
}

pub(crate) fn passive_checkpoint(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

/// The writer's end of the checkpoint thread.
#[derive(Debug)]
pub(crate) struct Checkpoints {
    /// Wakes the thread after a commit; full while it sleeps or copies.
    pub(crate) nudge: std::sync::mpsc::SyncSender<()>,
    /// Set by the thread after a round: the writer copies the rest before it next
    /// writes.
    pub(crate) finish: Arc<AtomicBool>,
    /// Joined on close, so that the thread's connection is closed before the writer's.
    pub(crate) thread: std::thread::JoinHandle<()>,
}
