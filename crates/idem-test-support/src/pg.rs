//! A private PostgreSQL server for tests ([`PgServer`]): the machine's PostgreSQL
//! binaries on a free 127.0.0.1 port, with `ssl = on` (certificates from
//! [`TestPki`](crate::TestPki)) or plaintext only, restarted as a crash would when a test
//! asks, for tests of what a store that goes away and comes back does to its clients.
//!
//! Each server runs in a temporary directory of its own and is stopped when dropped; a
//! watchdog process stops it and deletes the directory once the test process is gone.
//! PostgreSQL refuses to run as root, so when the tests do, the server runs as the
//! `postgres` system user, its directory handed to that user.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{START_DEADLINE, chown, free_port, run_as, stop, wait_listening, watchdog};
use crate::tls::{CERT_USER, CertFiles};

/// The newest PostgreSQL server binaries on the machine (Debian's layout), or why not.
pub(crate) fn postgres_bin() -> Result<PathBuf, String> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|e| format!("no PostgreSQL server binaries ({}: {e})", root.display()))?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| format!("no PostgreSQL server binaries under {}", root.display()))
}

/// The uid and gid the server runs as: `postgres`'s when this process is root (which
/// PostgreSQL refuses to run as), else this process's own.
pub(crate) fn server_user() -> Result<Option<(u32, u32)>, String> {
    let id = |flag: &str, user: Option<&str>| -> Result<u32, String> {
        let out = Command::new("id")
            .arg(flag)
            .args(user)
            .output()
            .map_err(|e| format!("id: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("id {flag} {}: no such user", user.unwrap_or("")))
    };
    if id("-u", None)? != 0 {
        return Ok(None);
    }
    Ok(Some((
        id("-u", Some("postgres"))?,
        id("-g", Some("postgres"))?,
    )))
}

/// One `initdb`'d data directory per test process, copied for each server (initdb is
/// the slow part of starting one).
fn template() -> Result<&'static Path, String> {
    static TEMPLATE: OnceLock<Result<(PathBuf, Child), String>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let bin = postgres_bin()?;
            let user = server_user()?;
            let dir = std::env::temp_dir().join(format!("idem-pg-template-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            // The watchdog deletes it once the process is gone (statics never drop).
            let guard = watchdog(None, &dir)?;
            chown(&dir, user)?;
            let mut initdb = Command::new(bin.join("initdb"));
            initdb
                .arg("-D")
                .arg(dir.join("data"))
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
                .current_dir(&dir);
            run_as(initdb, user, "initdb")?;
            Ok((dir.join("data"), guard))
        })
        .as_ref()
        .map(|(data, _)| data.as_path())
        .map_err(Clone::clone)
}

/// A private PostgreSQL server on 127.0.0.1, stopped when dropped.
#[derive(Debug)]
pub struct PgServer {
    pub(crate) port: u16,
    pub(crate) dir: PathBuf,
    pub(crate) server: Child,
    pub(crate) watchdog: Child,
}

/// How an error of a server that stopped before it was ready begins.
const EXITED_EARLY: &str = "postgres stopped before it was ready";

impl PgServer {
    /// Starts a server that takes only TLS connections (`ssl = on`, `hostssl` lines
    /// only) with `cert`, and asks for client certificates signed by `client_ca`:
    /// [`CERT_USER`] must log in with one (`cert` authentication), `postgres` with
    /// none.
    pub fn start_tls(cert: &CertFiles, client_ca: &Path) -> Result<PgServer, String> {
        PgServer::start(Some((cert, client_ca)))
    }

    /// Starts a server that offers no TLS at all (`ssl = off`).
    pub fn start_plaintext() -> Result<PgServer, String> {
        PgServer::start(None)
    }

    /// Starts a server, on a new port again when the first one's server stopped before
    /// it was ready: another process may take a free port between its choice and the
    /// server's bind, and the port then answers for the other process.
    fn start(tls: Option<(&CertFiles, &Path)>) -> Result<PgServer, String> {
        let mut tries = 0;
        loop {
            tries += 1;
            match PgServer::start_on_a_free_port(tls) {
                Err(e) if tries < 3 && e.starts_with(EXITED_EARLY) => continue,
                started => return started,
            }
        }
    }

    fn start_on_a_free_port(tls: Option<(&CertFiles, &Path)>) -> Result<PgServer, String> {
        let bin = postgres_bin()?;
        let user = server_user()?;
        let template = template()?;
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("idem-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let data = dir.join("data");
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(template).arg(&data);
        run_as(cp, None, "cp")?;
        let mut settings = vec![
            "listen_addresses = '127.0.0.1'".to_owned(),
            format!("port = {port}"),
            format!("unix_socket_directories = '{}'", dir.display()),
            "fsync = off".to_owned(),
            "max_connections = 40".to_owned(),
            "shared_buffers = 16MB".to_owned(),
        ];
        let hba = match tls {
            Some((cert, client_ca)) => {
                for (from, to) in [
                    (cert.cert.as_path(), "server.pem"),
                    (cert.key.as_path(), "server.key"),
                    (client_ca, "client-ca.pem"),
                ] {
                    std::fs::copy(from, data.join(to)).map_err(|e| format!("{to}: {e}"))?;
                }
                settings.extend([
                    "ssl = on".to_owned(),
                    "ssl_cert_file = 'server.pem'".to_owned(),
                    "ssl_key_file = 'server.key'".to_owned(),
                    "ssl_ca_file = 'client-ca.pem'".to_owned(),
                ]);
                format!(
                    "local all all trust\n\
                     hostssl all {CERT_USER} 127.0.0.1/32 cert\n\
                     hostssl all all 127.0.0.1/32 trust\n"
                )
            }
            None => {
                settings.push("ssl = off".to_owned());
                "local all all trust\nhost all all 127.0.0.1/32 trust\n".to_owned()
            }
        };
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).map_err(|e| e.to_string())?;
        text.push_str(&settings.join("\n"));
        text.push('\n');
        std::fs::write(&conf, text).map_err(|e| e.to_string())?;
        std::fs::write(data.join("pg_hba.conf"), hba).map_err(|e| e.to_string())?;
        chown(&dir, user)?;
        let key = data.join("server.key");
        if key.exists() {
            let mut chmod = Command::new("chmod");
            chmod.arg("600").arg(&key);
            run_as(chmod, None, "chmod")?;
        }
        let log = dir.join("postgres.log");
        let mut server = spawn_postgres(&bin, &dir, user)?;
        let watchdog = match watchdog(Some(server.id()), &dir) {
            Ok(w) => w,
            Err(e) => {
                stop(&mut server);
                return Err(e);
            }
        };
        let mut pg = PgServer {
            port,
            dir,
            server,
            watchdog,
        };
        if let Err(e) = wait_listening(&mut pg.server, port, "postgres", &log) {
            return Err(match pg.server.try_wait() {
                Ok(Some(_)) => format!("{EXITED_EARLY}: {e}"),
                _ => e,
            });
        }
        pg.create_cert_user(&bin, user)?;
        Ok(pg)
    }

    /// Makes the role a client certificate logs in as, over the server's socket.
    fn create_cert_user(&mut self, bin: &Path, user: Option<(u32, u32)>) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.server.try_wait() {
                let log =
                    std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
                return Err(format!("{EXITED_EARLY} ({status}): {log}"));
            }
            let mut psql = Command::new(bin.join("psql"));
            psql.arg("-h")
                .arg(&self.dir)
                .args([
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                ])
                .args(["-v", "ON_ERROR_STOP=1", "-qAtc"])
                .arg(format!("CREATE ROLE {CERT_USER} LOGIN SUPERUSER"))
                .current_dir(&self.dir);
            match run_as(psql, user, "psql") {
                Ok(()) => return Ok(()),
                // Still starting up.
                Err(e) if start.elapsed() < START_DEADLINE => {
                    let _ = e;
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

    /// `postgres://postgres@127.0.0.1:PORT/postgres` with `query` (`sslmode=…&…`)
    /// appended.
    pub fn url(&self, query: &str) -> String {
        self.url_as("postgres", query)
    }

    /// The server's URL logging in as `user`, with `query`.
    pub fn url_as(&self, user: &str, query: &str) -> String {
        let sep = if query.is_empty() { "" } else { "?" };
        format!(
            "postgres://{user}@127.0.0.1:{}/postgres{sep}{query}",
            self.port
        )
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        stop(&mut self.server);
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the `postgres` server of `dir/data`, its log appended to `dir/postgres.log`.
pub(crate) fn spawn_postgres(
    bin: &Path,
    dir: &Path,
    user: Option<(u32, u32)>,
) -> Result<Child, String> {
    let log = dir.join("postgres.log");
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| e.to_string())?;
    chown(&log, user)?;
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D").arg(dir.join("data")).current_dir(dir);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("postgres: {e}"))
}

impl PgServer {
    /// Stops the server at once, as a crash would (`SIGQUIT`, PostgreSQL's immediate
    /// shutdown: no checkpoint, every connection dropped), starts it again on the same
    /// data and port, and waits until it accepts connections: it recovers from its WAL.
    pub fn restart(&mut self) -> Result<(), String> {
        let _ = Command::new("kill")
            .args(["-QUIT", &self.server.id().to_string()])
            .status();
        let start = Instant::now();
        while !matches!(self.server.try_wait(), Ok(Some(_))) {
            if start.elapsed() > START_DEADLINE {
                let _ = self.server.kill();
                let _ = self.server.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.server = spawn_postgres(&postgres_bin()?, &self.dir, server_user()?)?;
        let watchdog = watchdog(Some(self.server.id()), &self.dir)?;
        let mut old = std::mem::replace(&mut self.watchdog, watchdog);
        let _ = old.kill();
        let _ = old.wait();
        wait_listening(
            &mut self.server,
            self.port,
            "postgres",
            &self.dir.join("postgres.log"),
        )
    }
}
