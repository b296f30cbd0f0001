//! A private MariaDB server for tests ([`MariaDbServer`]): the machine's `mariadbd` on
//! a free 127.0.0.1 port with a data directory of its own, made by
//! `mariadb-install-db`. Two kinds:
//!
//! - [`MariaDbServer::start`]: plaintext, `root` without a password, the database
//!   `test`; crashed and restarted when a test asks ([`MariaDbServer::restart`]), for
//!   tests of what a store that goes away and comes back does to its clients.
//! - [`MariaDbServer::start_tls`]: TLS connections only (`require_secure_transport`),
//!   with certificates from [`TestPki`](crate::TestPki), and accounts that log in as they
//!   would in production, with a password or a client certificate.
//!
//! Each server runs in a temporary directory of its own and is stopped, and the
//! directory deleted, when dropped; a watchdog process does both once the test process
//! is gone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{START_DEADLINE, free_port, run_as, signal, wait_listening, watchdog};
use crate::tls::{CERT_USER, CertFiles};

/// The account of a TLS server that logs in with a password, over TLS only
/// (`REQUIRE SSL`).
pub const MYSQL_TLS_USER: &str = "idem_tls";

/// [`MYSQL_TLS_USER`]'s password.
pub const MYSQL_TLS_PASSWORD: &str = "idem-tls-secret";

/// The database a TLS server's accounts may use.
pub const MYSQL_TLS_DATABASE: &str = "idem";

/// The first of `candidates` that exists, or why none does.
fn find(what: &str, candidates: &[&str]) -> Result<PathBuf, String> {
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| format!("no MariaDB {what} ({})", candidates.join(", ")))
}

fn server_binary() -> Result<PathBuf, String> {
    find("server binary", &["/usr/sbin/mariadbd", "/usr/sbin/mysqld"])
}

/// One data directory made by `mariadb-install-db` per test process, copied for each
/// server: the installer is the slow part of starting one, and two of them at once in
/// one process fail.
fn template() -> Result<&'static Path, String> {
    static TEMPLATE: OnceLock<Result<(PathBuf, Child), String>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            server_binary()?;
            let install = find(
                "installer",
                &["/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db"],
            )?;
            let dir =
                std::env::temp_dir().join(format!("idem-mariadb-template-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            // The watchdog deletes it once the process is gone (statics never drop).
            let guard = watchdog(None, &dir)?;
            let mut installer = Command::new(install);
            installer
                .arg("--no-defaults")
                .arg(format!("--datadir={}", dir.join("data").display()))
                .args([
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ])
                .current_dir(&dir);
            run_as(installer, None, "mariadb-install-db")?;
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
    /// The options the server runs with beside its directory's and port's, kept for a
    /// restart.
    options: Vec<String>,
    server: Child,
    watchdog: Child,
}

impl MariaDbServer {
    /// Starts a plaintext server with the database `test`, `root` logging in without a
    /// password ([`url`](Self::url)).
    ///
    /// Commits reach the operating system before they are acknowledged
    /// (`innodb_flush_log_at_trx_commit=2`): a killed server loses none of them, which
    /// is the crash a test can make, and the machine is spared an `fsync` per commit.
    pub fn start() -> Result<MariaDbServer, String> {
        let db = MariaDbServer::spawn(vec![
            "--innodb-flush-log-at-trx-commit=2".to_owned(),
            "--innodb-buffer-pool-size=32M".to_owned(),
            "--max-connections=100".to_owned(),
        ])?;
        db.sql("CREATE DATABASE IF NOT EXISTS test")?;
        Ok(db)
    }

    /// Starts a server presenting `cert`, trusting client certificates signed by
    /// `client_ca`, refusing plaintext; with the accounts [`MYSQL_TLS_USER`] (a
    /// password, `REQUIRE SSL`) and [`CERT_USER`] (no password, `REQUIRE X509`: a client
    /// certificate `client_ca` signed), both on the database [`MYSQL_TLS_DATABASE`]
    /// ([`url_as`](Self::url_as)).
    pub fn start_tls(cert: &CertFiles, client_ca: &Path) -> Result<MariaDbServer, String> {
        let db = MariaDbServer::spawn(vec![
            format!("--ssl-cert={}", cert.cert.display()),
            format!("--ssl-key={}", cert.key.display()),
            format!("--ssl-ca={}", client_ca.display()),
            "--require-secure-transport=ON".to_owned(),
            "--skip-name-resolve".to_owned(),
            "--innodb-buffer-pool-size=16M".to_owned(),
            "--innodb-flush-log-at-trx-commit=0".to_owned(),
        ])?;
        // Over the server's socket, which `require_secure_transport` counts as secure.
        db.sql(&format!(
            "CREATE DATABASE {MYSQL_TLS_DATABASE};
             CREATE USER '{MYSQL_TLS_USER}'@'127.0.0.1' IDENTIFIED BY '{MYSQL_TLS_PASSWORD}'
                 REQUIRE SSL;
             GRANT ALL ON {MYSQL_TLS_DATABASE}.* TO '{MYSQL_TLS_USER}'@'127.0.0.1';
             CREATE USER '{CERT_USER}'@'127.0.0.1' REQUIRE X509;
             GRANT ALL ON {MYSQL_TLS_DATABASE}.* TO '{CERT_USER}'@'127.0.0.1';"
        ))?;
        Ok(db)
    }

    /// Copies the template into a directory of its own and starts a server on it with
    /// `options`, ready for SQL.
    fn spawn(options: Vec<String>) -> Result<MariaDbServer, String> {
        let template = template()?;
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("idem-mariadb-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(template).arg(dir.join("data"));
        if let Err(e) = run_as(cp, None, "cp") {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let mut server = spawn_mariadbd(&dir, port, &options)?;
        let watchdog = match watchdog(Some(server.id()), &dir) {
            Ok(w) => w,
            Err(e) => {
                let _ = server.kill();
                let _ = server.wait();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let mut db = MariaDbServer {
            port,
            dir,
            options,
            server,
            watchdog,
        };
        db.wait_ready()?;
        Ok(db)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/test`, for a server from [`start`](Self::start).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// `mysql://USER@127.0.0.1:PORT/idem` (with the password for [`MYSQL_TLS_USER`])
    /// and `query` (`ssl-mode=…&…`) appended, for a server from
    /// [`start_tls`](Self::start_tls).
    pub fn url_as(&self, user: &str, query: &str) -> String {
        let login = if user == MYSQL_TLS_USER {
            format!("{user}:{MYSQL_TLS_PASSWORD}")
        } else {
            user.to_owned()
        };
        let sep = if query.is_empty() { "" } else { "?" };
        format!(
            "mysql://{login}@127.0.0.1:{}/{MYSQL_TLS_DATABASE}{sep}{query}",
            self.port
        )
    }

    /// Runs `sql` as `root` with the `mariadb` client, over the server's socket.
    pub fn sql(&self, sql: &str) -> Result<(), String> {
        let mut client = Command::new(find("client", &["/usr/bin/mariadb", "/usr/bin/mysql"])?);
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
        self.server = spawn_mariadbd(&self.dir, self.port, &self.options)?;
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
        // SIGTERM is mariadbd's clean shutdown (it ignores SIGINT).
        let _ = signal(self.server.id(), "TERM");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if matches!(self.server.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `mariadbd` on `dir/data` with `options`, listening on 127.0.0.1:`port` and
/// `dir/sock`, its log in `dir/mariadb.log`.
fn spawn_mariadbd(dir: &Path, port: u16, options: &[String]) -> Result<Child, String> {
    Command::new(server_binary()?)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", dir.join("data").display()))
        .arg(format!("--socket={}", dir.join("sock").display()))
        .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
        .arg(format!("--log-error={}", dir.join("mariadb.log").display()))
        .arg(format!("--port={port}"))
        .args(["--bind-address=127.0.0.1", "--user=root", "--skip-log-bin"])
        .args(options)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("mariadbd: {e}"))
}
