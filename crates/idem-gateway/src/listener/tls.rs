//! TLS termination on a listener, with rustls: a certificate chain and its key from PEM
//! files, TLS 1.2 and 1.3 only, ALPN offering `h2` and `http/1.1`, and the pair read
//! again on demand (`idem serve` does on SIGHUP) without touching open connections: a
//! new connection gets the new pair, an open one keeps the one it shook hands with,
//! and a new pair that cannot be used leaves the old one in place.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The two PEM files of a listener's TLS: the certificate chain (the server's own
/// certificate first, then any intermediates) and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain.
    pub(crate) cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub(crate) key: PathBuf,
    /// The CA certificates (PEM) a client certificate must chain to, when clients may
    /// present one (`--tls-client-ca`). A client without a certificate is still served;
    /// one whose certificate does not verify fails the handshake.
    pub(crate) client_ca: Option<PathBuf>,
}

/// Why a certificate and key cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate, or one that does not parse.
    #[error("{path} holds no usable PEM certificate{why}")]
    Certificate {
        /// The file.
        path: String,
        /// What the PEM reader said, if anything.
        why: String,
    },
    /// The key file holds no PEM private key, or one that does not parse.
    #[error("{path} holds no usable PEM private key: {why}")]
    Key {
        /// The file.
        path: String,
        /// What the PEM reader said.
        why: String,
    },
    /// The key does not go with the certificate, or rustls refuses the pair.
    #[error("{cert} and {key} cannot be used together: {source}")]
    Pair {
        /// The certificate file.
        cert: String,
        /// The key file.
        key: String,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
}

impl TlsFiles {
    /// The server configuration for this pair, read from the files now.
    pub(crate) fn load(&self) -> Result<ServerConfig, TlsError> {
        let cert_path = self.cert.display().to_string();
        let key_path = self.key.display().to_string();
        let certs = read(&self.cert)?;
        let certs = CertificateDer::pem_slice_iter(&certs)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Certificate {
                path: cert_path.clone(),
                why: format!(": {e}"),
            })?;
        if certs.is_empty() {
            return Err(TlsError::Certificate {
                path: cert_path,
                why: String::new(),
            });
        }
        let key = read(&self.key)?;
        let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| TlsError::Key {
            path: key_path.clone(),
            why: e.to_string(),
        })?;
        let pair = |source| TlsError::Pair {
            cert: cert_path.clone(),
            key: key_path.clone(),
            source,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(pair)?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(pair)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// A verifier of client certificates chaining to the CA certificates in `ca`; clients
/// without one are let through (their requests name no certificate).
fn client_verifier(
    ca: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let path = ca.display().to_string();
    let pem = read(ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| TlsError::Certificate {
            path: path.clone(),
            why: format!(": {e}"),
        })?;
        roots.add(cert).map_err(|e| TlsError::Certificate {
            path: path.clone(),
            why: format!(": {e}"),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::Certificate {
            path,
            why: String::new(),
        });
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Certificate {
            path,
            why: format!(": {e}"),
        })
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// A listener's TLS: its files and the configuration new connections get.
#[derive(Debug, Clone)]
pub(crate) struct Tls {
    files: TlsFiles,
    current: Arc<RwLock<Arc<ServerConfig>>>,
}

impl Tls {
    /// TLS with the pair in `files`, read now.
    pub(crate) fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let config = files.load()?;
        Ok(Tls {
            files,
            current: Arc::new(RwLock::new(Arc::new(config))),
        })
    }

    /// Reads the files again: new connections get the new pair; open ones keep theirs.
    /// A pair that cannot be used leaves the one in force, and is the error returned.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let config = self.files.load()?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The files.
    pub(crate) fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// What the next connection's handshake uses.
    pub(super) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(config)
    }
}
