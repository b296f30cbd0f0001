//! The database file is readable by its owner only (SPEC S14).
//!
//! SQLite creates a new database with mode 0644 less the umask, so under the usual
//! umask every local user could read the recorded answers. A store that opens a file
//! it may create makes the file itself first, with mode 0600, and SQLite then gives the
//! `-wal` and `-shm` files it creates beside it the database's own mode. A file that
//! exists keeps the mode its owner chose (0640 for a backup group, say): the store
//! neither loosens nor tightens it, but says so in the log when every local user can
//! read or write it or the files beside it.

use std::path::{Path, PathBuf};

use sqlx::sqlite::SqliteConnectOptions;

/// Makes the database file that [`SqliteStore::connect`](crate::SqliteStore::connect)
/// opens for `url` (parsed as `options`) with mode 0600 if it does not exist yet, unless
/// the URL names no file (`:memory:`, `mode=memory`, another `vfs`); warns of a
/// database, `-wal` or `-shm` that exists and that every user can read or write. An
/// error creating it is left for SQLite to report as it opens the file.
pub(crate) fn prepare(url: &str, options: &SqliteConnectOptions) {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let no_file = query.split('&').any(|pair| match pair.split_once('=') {
        Some((k, v)) => (k == "mode" && v == "memory") || k == "vfs",
        None => false,
    });
    let path = options.get_filename();
    // sqlx names a `:memory:` database `file:sqlx-in-memory-N`; SQLite's own special
    // names start with a colon.
    let name = path.to_string_lossy();
    if no_file || name.is_empty() || name.starts_with(':') || name.starts_with("file:") {
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
            tracing::debug!(path = %path.display(), "created the SQLite database with mode 0600");
            return;
        }
    }
    warn_if_open_to_all(path);
}

/// The files SQLite keeps for a database in WAL mode: the database, `-wal`, `-shm`.
pub(crate) fn database_files(db: &Path) -> [PathBuf; 3] {
    let with = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [db.to_owned(), with("-wal"), with("-shm")]
}

fn warn_if_open_to_all(db: &Path) {
    for file in database_files(db) {
        idem_core::private_file::warn_if_exposed(
            &file,
            "idempotency records: recorded answers, tenants' keys; and its -wal and -shm",
            idem_core::private_file::Exposure::Group,
        );
    }
}
