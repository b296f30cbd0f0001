//! TLS-only stores for tests: [`TestPki`] makes a private CA and certificates at run
//! time (rcgen; no key is committed), [`PgServer`] starts the machine's PostgreSQL
//! binaries on a free 127.0.0.1 port with `ssl = on` (or a plaintext-only one), and
//! [`RedisTlsServer`] starts `redis-server --tls-port` on one.
//!
//! Each server runs in a temporary directory of its own and is stopped when dropped;
//! a watchdog process stops it and deletes the directory once the test process is
//! gone, so nothing outlives a run that panicked or was killed. `start` returns why it
//! could not start (no binaries on the machine, for one), for
//! [`service_unavailable`](crate::service_unavailable)'s loud skip.
//!
//! PostgreSQL refuses to run as root, so when the tests do, the server runs as the
//! `postgres` system user, its directory handed to that user.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// How long a server may take to accept connections.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(60);

/// The role a client certificate logs in as: its common name.
pub const CERT_USER: &str = "idem_cert";

/// A private CA and certificates it issued, as PEM files in a directory of their own.
pub struct TestPki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki").field("dir", &self.dir).finish()
    }
}

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl TestPki {
    /// A new CA (`ca.pem`), a second one that signed nothing the servers use
    /// (`other-ca.pem`, the wrong CA), and a client certificate for [`CERT_USER`].
    pub fn new() -> Result<TestPki, String> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("idem-pki-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (pem, issuer) = ca("idem test CA")?;
        let pki = TestPki { dir, issuer };
        pki.write("ca.pem", &pem)?;
        let (other, _) = ca("another CA")?;
        pki.write("other-ca.pem", &other)?;
        pki.issue(CERT_USER, &[], true)?;
        Ok(pki)
    }

    /// The CA that signed every certificate here.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A CA that signed none of them.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    /// The client certificate for [`CERT_USER`].
    pub fn client(&self) -> CertFiles {
        self.files(CERT_USER)
    }

    /// A server certificate for `names` (an IP address becomes an IP SAN), issued by
    /// [`ca`](Self::ca) and written as `FILE.pem` and `FILE.key`.
    pub fn server(&self, file: &str, names: &[&str]) -> Result<CertFiles, String> {
        self.issue(file, names, false)
    }

    /// A client certificate whose SANs are `sans`, each `uri:…`, `dns:…` or
    /// `email:…`, issued by [`ca`](Self::ca) and written as `FILE.pem` and `FILE.key`.
    pub fn client_named(&self, file: &str, sans: &[&str]) -> Result<CertFiles, String> {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        for san in sans {
            let (kind, value) = san.split_once(':').ok_or(format!("{san}: no kind"))?;
            let text = || rcgen::string::Ia5String::try_from(value).map_err(|e| e.to_string());
            params.subject_alt_names.push(match kind {
                "uri" => rcgen::SanType::URI(text()?),
                "dns" => rcgen::SanType::DnsName(text()?),
                "email" => rcgen::SanType::Rfc822Name(text()?),
                _ => return Err(format!("{san}: not uri, dns or email")),
            });
        }
        self.sign(file, &key, &params)
    }

    fn issue(&self, file: &str, names: &[&str], client: bool) -> Result<CertFiles, String> {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).map_err(|e| e.to_string())?;
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        self.sign(file, &key, &params)
    }

    /// `params` for `key`, issued by [`ca`](Self::ca) and written as `FILE.pem` and
    /// `FILE.key`.
    fn sign(
        &self,
        file: &str,
        key: &KeyPair,
        params: &CertificateParams,
    ) -> Result<CertFiles, String> {
        let cert = params
            .signed_by(key, &self.issuer)
            .map_err(|e| e.to_string())?;
        self.write(&format!("{file}.pem"), &cert.pem())?;
        self.write(&format!("{file}.key"), &key.serialize_pem())?;
        Ok(self.files(file))
    }

    fn files(&self, file: &str) -> CertFiles {
        CertFiles {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        }
    }

    fn write(&self, file: &str, text: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA named `name`: its certificate (PEM) and its issuer.
fn ca(name: &str) -> Result<(String, Issuer<'static, KeyPair>), String> {
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

/// A port free on 127.0.0.1 now.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// A shell that, once this process is gone, stops `pid` if any (`SIGINT`, then
/// `SIGKILL`) and deletes `dir`: a killed test never runs `Drop`, and statics never
/// drop.
pub(crate) fn watchdog(pid: Option<u32>, dir: &Path) -> Result<Child, String> {
    let stop = pid.map_or(String::new(), |pid| {
        format!("kill -INT {pid} 2>/dev/null; sleep 3; kill -9 {pid} 2>/dev/null; ")
    });
    let script = format!(
        "while kill -0 {parent} 2>/dev/null; do sleep 1; done; {stop}rm -rf '{dir}'",
        parent = std::process::id(),
        dir = dir.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sh: {e}"))
}

/// Stops `child` with `SIGINT` (PostgreSQL's fast shutdown), waiting a bounded time
/// before killing it.
fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until something accepts connections on `127.0.0.1:port`, or `child` exits.
pub(crate) fn wait_listening(
    child: &mut Child,
    port: u16,
    what: &str,
    log: &Path,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{what} exited ({status}): {log}"));
        }
        if start.elapsed() > START_DEADLINE {
            return Err(format!("{what} does not accept connections on {port}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

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

/// Runs `cmd` as `user` (if any) and fails with its output unless it succeeds.
fn run_as(mut cmd: Command, user: Option<(u32, u32)>, what: &str) -> Result<(), String> {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Hands `path` (recursively) to `user`.
pub(crate) fn chown(path: &Path, user: Option<(u32, u32)>) -> Result<(), String> {
    let Some((uid, gid)) = user else {
        return Ok(());
    };
    let mut cmd = Command::new("chown");
    cmd.arg("-R").arg(format!("{uid}:{gid}")).arg(path);
    run_as(cmd, None, "chown")
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

    fn start(tls: Option<(&CertFiles, &Path)>) -> Result<PgServer, String> {
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
        let mut server = crate::pg::spawn_postgres(&bin, &dir, user)?;
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
        wait_listening(&mut pg.server, port, "postgres", &log)?;
        pg.create_cert_user(&bin, user)?;
        Ok(pg)
    }

    /// Makes the role a client certificate logs in as, over the server's socket.
    fn create_cert_user(&self, bin: &Path, user: Option<(u32, u32)>) -> Result<(), String> {
        let start = Instant::now();
        loop {
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

/// A private `redis-server` on 127.0.0.1 that speaks only TLS (`--port 0
/// --tls-port PORT`), stopped when dropped.
#[derive(Debug)]
pub struct RedisTlsServer {
    port: u16,
    dir: PathBuf,
    server: Child,
    watchdog: Child,
}

impl RedisTlsServer {
    /// Starts one with `cert`, trusting client certificates signed by `client_ca`;
    /// with `require_client_cert`, a client without one is refused
    /// (`--tls-auth-clients yes`), otherwise one is optional.
    pub fn start(
        cert: &CertFiles,
        client_ca: &Path,
        require_client_cert: bool,
    ) -> Result<RedisTlsServer, String> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("idem-redis-tls-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log = dir.join("redis.log");
        let mut server = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .arg("--tls-cert-file")
            .arg(&cert.cert)
            .arg("--tls-key-file")
            .arg(&cert.key)
            .arg("--tls-ca-cert-file")
            .arg(client_ca)
            .args([
                "--tls-auth-clients",
                if require_client_cert {
                    "yes"
                } else {
                    "optional"
                },
            ])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(["--logfile", "redis.log"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        let watchdog = match watchdog(Some(server.id()), &dir) {
            Ok(w) => w,
            Err(e) => {
                stop(&mut server);
                return Err(e);
            }
        };
        let mut redis = RedisTlsServer {
            port,
            dir,
            server,
            watchdog,
        };
        wait_listening(&mut redis.server, port, "redis-server", &log)?;
        Ok(redis)
    }

    /// The server's TLS port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RedisTlsServer {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
