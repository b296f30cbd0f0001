//! A private MariaDB server for tests ([`MySqlServer`]): the machine's `mariadbd` on a
//! free 127.0.0.1 port, in a data directory of its own made by `mariadb-install-db`,
//! that takes only TLS connections (`require_secure_transport`), with certificates from
//! [`TestPki`](crate::TestPki). Its accounts log in as they would in production, with
//! a password or a client certificate: the grant tables are on.
//!
//! It is stopped, and its directory deleted, when dropped; a watchdog process does both
//! once the test process is gone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{START_DEADLINE, free_port, run_as, signal, wait_listening, watchdog};
use crate::tls::{CERT_USER, CertFiles};

/// The account that logs in with a password, over TLS only (`REQUIRE SSL`).
pub const MYSQL_TLS_USER: &str = "idem_tls";

/// [`MYSQL_TLS_USER`]'s password.
pub const MYSQL_TLS_PASSWORD: &str = "idem-tls-secret";

/// The database the accounts may use.
pub const MYSQL_TLS_DATABASE: &str = "idem";

/// The machine's MariaDB server and its installer, or why not.
fn binaries() -> Result<(PathBuf, PathBuf), String> {
    let find = |candidates: &[&str]| {
        candidates
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| format!("no MariaDB server binaries ({})", candidates.join(", ")))
    };
    Ok((
        find(&["/usr/sbin/mariadbd", "/usr/sbin/mysqld"])?,
        find(&["/usr/bin/mariadb-install-db", "/usr/bin/mysql_install_db"])?,
    ))
}

/// The client that runs the accounts' statements over the server's socket.
fn client() -> Result<PathBuf, String> {
    ["/usr/bin/mariadb", "/usr/bin/mysql"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| "no MariaDB client (mariadb, mysql)".to_owned())
}

/// One data directory made by `mariadb-install-db` per test process, copied for each
/// server: the installer is the slow part of starting one, and two of them at once in
/// one process fail.
fn template() -> Result<&'static Path, String> {
    static TEMPLATE: OnceLock<Result<(PathBuf, Child), String>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let (_, install) = binaries()?;
            let dir =
                std::env::temp_dir().join(format!("idem-mysql-template-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            // The watchdog deletes it once the process is gone (statics never drop).
            let guard = watchdog(None, &dir)?;
            let data = dir.join("data");
            let mut installer = Command::new(install);
            installer
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .args([
                    "--user=root",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ])
                .current_dir(&dir);
            run_as(installer, None, "mariadb-install-db")?;
            Ok((data, guard))
        })
        .as_ref()
        .map(|(data, _)| data.as_path())
        .map_err(Clone::clone)
}

/// A private MariaDB server on 127.0.0.1 that takes only TLS connections, stopped when
/// dropped.
#[derive(Debug)]
pub struct MySqlServer {
    port: u16,
    dir: PathBuf,
    server: Child,
    watchdog: Child,
}

impl MySqlServer {
    /// Starts a server presenting `cert`, trusting client certificates signed by
    /// `client_ca`, refusing plaintext; with the accounts [`MYSQL_TLS_USER`] (a
    /// password, `REQUIRE SSL`) and [`CERT_USER`] (no password, `REQUIRE X509`: a client
    /// certificate `client_ca` signed), both on the database [`MYSQL_TLS_DATABASE`].
    pub fn start_tls(cert: &CertFiles, client_ca: &Path) -> Result<MySqlServer, String> {
        let (server_bin, _) = binaries()?;
        let template = template()?;
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("idem-mysql-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let data = dir.join("data");
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(template).arg(&data);
        if let Err(e) = run_as(cp, None, "cp") {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let log = dir.join("server.log");
        let socket = dir.join("server.sock");
        let mut server = Command::new(server_bin)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.join("server.pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--port={port}"))
            .arg(format!("--ssl-cert={}", cert.cert.display()))
            .arg(format!("--ssl-key={}", cert.key.display()))
            .arg(format!("--ssl-ca={}", client_ca.display()))
            .args([
                "--user=root",
                "--bind-address=127.0.0.1",
                "--require-secure-transport=ON",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
                "--innodb-flush-log-at-trx-commit=0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("mariadbd: {e}"))?;
        let watchdog = match watchdog(Some(server.id()), &dir) {
            Ok(w) => w,
            Err(e) => {
                let _ = server.kill();
                let _ = server.wait();
                return Err(e);
            }
        };
        let mut my = MySqlServer {
            port,
            dir,
            server,
            watchdog,
        };
        wait_listening(&mut my.server, port, "mariadbd", &log)?;
        my.create_accounts(&socket)?;
        Ok(my)
    }

    /// Makes the database and the accounts, as root over the server's socket (which
    /// `require_secure_transport` counts as secure).
    fn create_accounts(&self, socket: &Path) -> Result<(), String> {
        let client = client()?;
        let sql = format!(
            "CREATE DATABASE {MYSQL_TLS_DATABASE};
             CREATE USER '{MYSQL_TLS_USER}'@'127.0.0.1' IDENTIFIED BY '{MYSQL_TLS_PASSWORD}'
                 REQUIRE SSL;
             GRANT ALL ON {MYSQL_TLS_DATABASE}.* TO '{MYSQL_TLS_USER}'@'127.0.0.1';
             CREATE USER '{CERT_USER}'@'127.0.0.1' REQUIRE X509;
             GRANT ALL ON {MYSQL_TLS_DATABASE}.* TO '{CERT_USER}'@'127.0.0.1';"
        );
        let start = Instant::now();
        loop {
            let mut cmd = Command::new(&client);
            cmd.arg("--no-defaults")
                .arg(format!("--socket={}", socket.display()))
                .args(["-uroot", "-e", &sql]);
            match run_as(cmd, None, "mariadb") {
                Ok(()) => return Ok(()),
                // Still starting up.
                Err(_) if start.elapsed() < START_DEADLINE => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://USER@127.0.0.1:PORT/idem` (with the password for
    /// [`MYSQL_TLS_USER`]) and `query` (`ssl-mode=…&…`) appended.
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
}

impl Drop for MySqlServer {
    fn drop(&mut self) {
        // mariadbd shuts down on SIGTERM.
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
