//! TLS for `https://` URLs (the `rustls` feature): rustls on the ring provider, as the
//! rest of idem uses, never aws-lc-rs, which reqwest's own rustls feature would bring.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, RootCertStore};

use crate::{Error, Result};

/// The TLS client settings of the default HTTP client: TLS 1.3 and 1.2 with the ring
/// provider, trusting the system's roots and the PEM certificates in `extra`.
pub(crate) fn client_config(extra: &[Vec<u8>]) -> Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    // A machine without CA certificates can still send to http:// URLs: its https://
    // sends fail at the handshake, saying the issuer is unknown.
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "a system root certificate could not be read");
    }
    roots.add_parsable_certificates(found.certs);
    for pem in extra {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Build(format!("a root certificate is no PEM: {e}")))?;
        if certs.is_empty() {
            return Err(Error::Build(
                "a root certificate PEM holds no certificate".to_owned(),
            ));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| Error::Build(format!("not a CA certificate: {e}")))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::Build(format!("TLS settings: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
