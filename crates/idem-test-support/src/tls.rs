//! TLS-only stores for tests: [`TestPki`] makes a private CA and certificates at run
//! time (rcgen; no key is committed), [`RedisTlsServer`] starts `redis-server
//! --tls-port` on a free 127.0.0.1 port, and [`PgServer`](crate::PgServer) a PostgreSQL
//! server with `ssl = on`.
//!
//! Each server runs in a temporary directory of its own and is stopped when dropped;
//! a watchdog process stops it and deletes the directory once the test process is
//! gone, so nothing outlives a run that panicked or was killed. `start` returns why it
//! could not start (no binaries on the machine, for one), for
//! [`service_unavailable`](crate::service_unavailable)'s loud skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

use crate::process::{free_port, stop, wait_listening, watchdog};

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
