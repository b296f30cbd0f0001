//! A private MariaDB server for tests ([`MariaDbServer`]): the machine's `mariadbd` on
//! a free 127.0.0.1 port with a data directory of its own, made by
//! `mariadb-install-db`, and crashed and restarted when a test asks, for tests of what
//! a store that goes away and comes back does to its clients.
//!
//! Each server runs in a temporary directory of its own and is stopped when dropped; a
//! watchdog process stops it and deletes the directory once the test process is gone.
//! `root` logs in without a password, over TCP from 127.0.0.1; the database `test` is
//! made at the first start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{START_DEADLINE, free_port, run_as, stop, wait_listening, watchdog};

/// The server binary, on Debian's and most distributions' path.
const MARIADBD: &str = "/usr/sbin/mariadbd";

/// One installed data directory per test process, copied for each server (the install
/// is the slow part of starting one).
fn template() -> Result<&'static Path, String> {
    static TEMPLATE: OnceLock<Result<(PathBuf, Child), String>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            if !Path::new(MARIADBD).exists() {
                return Err(format!("no MariaDB server binary ({MARIADBD})"));
            }
            let dir =
                std::env::temp_dir().join(format!("idem-mariadb-template-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            // The watchdog deletes it once the process is gone (statics never drop).
            let guard = watchdog(None, &dir)?;
            let mut install = Command::new("mariadb-install-db");
            install
                .arg("--no-defaults")
                .arg(format!("--datadir={}", dir.join("data").display()))
                .args([
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ])
                .current_dir(&dir);
            run_as(install, None, "mariadb-install-db")?;
            Ok((dir.join("data"), guard))
        })
        .as_ref()
        .map(|(data, _)| data.as_path())
        .map_err(Clone::clone)
}

/// A private MariaDB server on 127.0.0.1, stopped when dropped.
#[derive(Debug)]
pub struct MariaDbServer {
    port: u16,
    dir: PathBuf,
    server: Child,
    watchdog: Child,
}

impl MariaDbServer {
    /// Starts a server with the database `test`, plaintext only.
    ///
    /// Commits reach the operating system before they are acknowledged
    /// (`innodb_flush_log_at_trx_commit=2`): a killed server loses none of them, which
    /// is the crash a test can make, and the machine is spared an `fsync` per commit.
    pub fn start() -> Result<MariaDbServer, String> {
        let template = template()?;
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("idem-mariadb-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(template).arg(dir.join("data"));
        run_as(cp, None, "cp")?;
        let mut server = spawn_mariadbd(&dir, port)?;
        let watchdog = match watchdog(Some(server.id()), &dir) {
            Ok(w) => w,
            Err(e) => {
                stop(&mut server);
                return Err(e);
            }
        };
        let mut db = MariaDbServer {
            port,
            dir,
            server,
            watchdog,
        };
        db.wait_ready()?;
        db.sql("CREATE DATABASE IF NOT EXISTS test")?;
        Ok(db)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// Runs `sql` as `root` with the `mariadb` client, over the server's socket.
    pub fn sql(&self, sql: &str) -> Result<(), String> {
        let mut client = Command::new("mariadb");
        client
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .args(["-uroot", "-e", sql])
            .current_dir(&self.dir);
        run_as(client, None, "mariadb")
    }

    /// Kills the server (`SIGKILL`, a crash: no buffer flushed, every connection
    /// dropped), starts it again on the same data and port, and waits until it accepts
    /// connections: InnoDB recovers from its redo log.
    pub fn restart(&mut self) -> Result<(), String> {
        let _ = self.server.kill();
        let _ = self.server.wait();
        self.server = spawn_mariadbd(&self.dir, self.port)?;
        let watchdog = watchdog(Some(self.server.id()), &self.dir)?;
        let mut old = std::mem::replace(&mut self.watchdog, watchdog);
        let _ = old.kill();
        let _ = old.wait();
        self.wait_ready()
    }

    /// Waits until the port accepts connections and the server answers SQL (it
    /// listens before its recovery ends).
    fn wait_ready(&mut self) -> Result<(), String> {
        let log = self.dir.join("mariadb.log");
        wait_listening(&mut self.server, self.port, "mariadbd", &log)?;
        let start = Instant::now();
        loop {
            match self.sql("SELECT 1") {
                Ok(()) => return Ok(()),
                Err(e) if start.elapsed() > START_DEADLINE => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        // SIGTERM is mariadbd's clean shutdown; `stop` sends SIGINT, which it ignores.
        let _ = Command::new("kill")
            .args(["-TERM", &self.server.id().to_string()])
            .status();
        stop(&mut self.server);
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `mariadbd` on `dir/data`, listening on 127.0.0.1:`port` and `dir/sock`, its
/// log in `dir/mariadb.log`.
fn spawn_mariadbd(dir: &Path, port: u16) -> Result<Child, String> {
    Command::new(MARIADBD)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", dir.join("data").display()))
        .arg(format!("--socket={}", dir.join("sock").display()))
        .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
        .arg(format!("--log-error={}", dir.join("mariadb.log").display()))
        .arg(format!("--port={port}"))
        .args([
            "--bind-address=127.0.0.1",
            "--user=root",
            "--skip-log-bin",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-buffer-pool-size=32M",
            "--max-connections=100",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("mariadbd: {e}"))
}
