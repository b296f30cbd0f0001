//! The files a network store's URL names for TLS (a CA to trust, a client certificate
//! and its key), read and checked when the store opens (feature `tls`).
//!
//! Each check names the URL parameter it read (`sslrootcert`, `cacert`, …), so that a
//! file that is missing, unreadable or not what its parameter says stops the start with
//! a message the operator can act on, instead of every later connection failing the
//! same way. The bytes returned are the PEM text as read: the store hands it to its
//! driver, so the files are read once, when the store opens.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A client certificate chain and its private key, both PEM, checked to belong together.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The certificate chain, the client's own certificate first.
    pub cert: Vec<u8>,
    /// The private key of the first certificate.
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key material never reaches a log.
        f.debug_struct("ClientIdentity").finish_non_exhaustive()
    }
}

/// Reads the file `path` that the parameter `setting` names and returns its text.
fn read(setting: &str, path: &str) -> Result<Vec<u8>, String> {
    if path.is_empty() {
        return Err(format!("{setting} is empty; give the path of a PEM file"));
    }
    std::fs::read(path).map_err(|e| format!("{setting}={path}: cannot read the file: {e}"))
}

/// The certificates in `pem`, at least one.
fn certificates(
    setting: &str,
    path: &str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{setting}={path}: not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting}={path}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certs)
}

/// Reads the CA certificates the parameter `setting` names (`path`): a PEM file of one
/// or more certificates, each usable as a trust anchor.
pub fn read_ca(setting: &str, path: &str) -> Result<Vec<u8>, String> {
    let pem = read(setting, path)?;
    let mut roots = RootCertStore::empty();
    for cert in certificates(setting, path, &pem)? {
        roots
            .add(cert)
            .map_err(|e| format!("{setting}={path}: not a usable CA certificate: {e}"))?;
    }
    Ok(pem)
}

/// Reads a client certificate chain (`cert_setting`, `cert_path`) and its private key
/// (`key_setting`, `key_path`), and checks that the key is one rustls signs with and
/// that it is the first certificate's.
pub fn read_identity(
    (cert_setting, cert_path): (&str, &str),
    (key_setting, key_path): (&str, &str),
) -> Result<ClientIdentity, String> {
    let cert = read(cert_setting, cert_path)?;
    let chain = certificates(cert_setting, cert_path, &cert)?;
    let key = read(key_setting, key_path)?;
    let der = PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
        format!("{key_setting}={key_path}: holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}")
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    usable_pair(&provider, chain, der).map_err(|e| {
        format!("{key_setting}={key_path} does not go with {cert_setting}={cert_path}: {e}")
    })?;
    Ok(ClientIdentity { cert, key })
}

/// Whether rustls would present `chain` with `key` as a client.
fn usable_pair(
    provider: &Arc<CryptoProvider>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<(), rustls::Error> {
    rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map(drop)
}

/// The TLS failure somewhere in `error`'s chain (a certificate that does not verify, a
/// handshake the peer broke off), as rustls reported it: drivers wrap it in an I/O
/// error, which would read as a server that is not there.
pub fn handshake_failure<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let io = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        let inner = io.map(|inner| inner as &(dyn std::error::Error + 'static));
        // redis-rs hands out the I/O error it keeps behind an `Arc` as its source.
        let shared = e
            .downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()
            .map(|inner| &**inner as &(dyn std::error::Error + 'static));
        next = inner.or(shared).or_else(|| e.source());
    }
    None
}

/// Refuses one of a pair of parameters given without the other: a client certificate
/// needs its key and a key its certificate.
pub fn both_or_neither<'a>(
    (cert_setting, cert): (&str, Option<&'a str>),
    (key_setting, key): (&str, Option<&'a str>),
) -> Result<Option<(&'a str, &'a str)>, String> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(format!(
            "{cert_setting} needs {key_setting}, the client certificate's private key"
        )),
        (None, Some(_)) => Err(format!(
            "{key_setting} needs {cert_setting}, the client certificate the key is for"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_file_names_its_parameter() {
        let e = read_ca("sslrootcert", "/nonexistent/idem/ca.pem").unwrap_err();
        assert!(
            e.starts_with("sslrootcert=/nonexistent/idem/ca.pem: cannot read"),
            "{e}"
        );
        let e = read_ca("cacert", "").unwrap_err();
        assert!(e.starts_with("cacert is empty"), "{e}");
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("idem-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("not-a-ca.pem");
        std::fs::write(&path, "hello\n").unwrap();
        let path = path.to_str().unwrap();
        let e = read_ca("sslrootcert", path).unwrap_err();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        let e = read_identity(("sslcert", path), ("sslkey", path)).unwrap_err();
        assert!(
            e.contains("sslcert=") && e.contains("holds no PEM certificate"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_handshake_failure_is_found_inside_an_io_error() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let found = handshake_failure(&io).expect("found");
        assert!(found.to_string().contains("UnknownIssuer"), "{found}");
        let shared: Arc<dyn std::error::Error + Send + Sync> = Arc::new(io);
        assert!(handshake_failure(&shared).is_some());
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(handshake_failure(&plain).is_none());
    }

    #[test]
    fn half_a_client_identity_is_refused() {
        assert_eq!(both_or_neither(("cert", None), ("key", None)), Ok(None));
        assert_eq!(
            both_or_neither(("cert", Some("c")), ("key", Some("k"))),
            Ok(Some(("c", "k")))
        );
        let e = both_or_neither(("sslcert", Some("c")), ("sslkey", None)).unwrap_err();
        assert!(e.contains("sslcert needs sslkey"), "{e}");
        let e = both_or_neither(("cert", None), ("key", Some("k"))).unwrap_err();
        assert!(e.contains("key needs cert"), "{e}");
    }
}
