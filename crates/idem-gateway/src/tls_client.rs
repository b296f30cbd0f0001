//! The TLS client settings the gateway connects with: to an `https://` upstream, and to
//! a JWKS URL; a leaf that the configuration, the proxy and the key-set fetcher share.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

/// The TLS client settings for an `https://` upstream: TLS 1.2 and 1.3 with the ring
/// provider, trusting the CA certificates in the PEM file `ca` when given, else the
/// system's roots. ALPN is the connector's to set.
pub(crate) fn tls_client_config(ca: Option<&Path>) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("cannot read CA certificates from {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!("{} holds no PEM certificate", path.display()));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: not a CA certificate: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "a system root certificate could not be read");
            }
            let (_, unusable) = roots.add_parsable_certificates(found.certs);
            if unusable > 0 {
                tracing::debug!(unusable, "system root certificates skipped");
            }
            if roots.is_empty() {
                return Err(
                    "no system root certificates were found for the https:// upstream; \
                     install the system's CA certificates or give --upstream-ca FILE"
                        .to_owned(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
