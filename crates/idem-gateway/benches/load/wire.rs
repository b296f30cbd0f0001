//! The protocols the load driver speaks to a gateway (`IDEM_LOAD_PROTOCOL`): HTTP/1.1,
//! HTTP/2 with prior knowledge (h2c), or HTTP/2 over TLS (ALPN `h2`) with a certificate
//! made for the run by a private CA of its own.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::ServerName;

/// What a load run speaks to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1 over TCP, one request at a time per connection.
    H1,
    /// HTTP/2 with prior knowledge over TCP, one stream at a time per connection.
    H2,
    /// HTTP/2 over TLS 1.3 (ALPN `h2`), one stream at a time per connection.
    Tls,
}

impl Proto {
    /// The protocols of `IDEM_LOAD_PROTOCOL` (`h1,h2,tls`; HTTP/1.1 alone by default).
    pub fn list(var: &str) -> Vec<Proto> {
        let list: Vec<Proto> = var
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s {
                "h1" => Proto::H1,
                "h2" => Proto::H2,
                "tls" => Proto::Tls,
                other => panic!("IDEM_LOAD_PROTOCOL: {other:?} is not h1, h2 or tls"),
            })
            .collect();
        if list.is_empty() {
            vec![Proto::H1]
        } else {
            list
        }
    }

    /// Its name in the bench's output.
    pub fn name(self) -> &'static str {
        match self {
            Proto::H1 => "HTTP/1.1",
            Proto::H2 => "HTTP/2 (h2c)",
            Proto::Tls => "HTTP/2 over TLS",
        }
    }
}

/// How the driver reaches a gateway: the protocol, and for TLS the client settings
/// that trust the run's CA.
#[derive(Clone)]
pub struct Wire {
    /// The protocol.
    pub proto: Proto,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl Wire {
    /// Plain HTTP/1.1 (the yardsticks are only measured so).
    pub fn h1() -> Wire {
        Wire {
            proto: Proto::H1,
            tls: None,
        }
    }

    /// A wire for `proto`. For TLS, a CA and a certificate for `localhost` are made and
    /// the pair written into `dir`; the returned arguments give it to `idem serve`.
    pub fn new(proto: Proto, dir: &Path) -> (Wire, Vec<String>) {
        if proto != Proto::Tls {
            return (Wire { proto, tls: None }, Vec::new());
        }
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let (cert_file, key_file) = (dir.join("load-cert.pem"), dir.join("load-key.pem"));
        std::fs::write(&cert_file, leaf.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();

        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let wire = Wire {
            proto,
            tls: Some(tokio_rustls::TlsConnector::from(Arc::new(config))),
        };
        let args = vec![
            "--tls-cert".to_owned(),
            cert_file.display().to_string(),
            "--tls-key".to_owned(),
            key_file.display().to_string(),
        ];
        (wire, args)
    }

    /// A connection to the gateway at `addr`, ready for requests.
    pub async fn connect(&self, addr: SocketAddr) -> Sender {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        match (self.proto, &self.tls) {
            (Proto::H1, _) => {
                let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
                tokio::spawn(conn);
                Sender::H1(sender)
            }
            (Proto::H2, _) | (Proto::Tls, None) => {
                let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .unwrap();
                tokio::spawn(conn);
                Sender::H2(sender)
            }
            (Proto::Tls, Some(tls)) => {
                let name = ServerName::try_from("localhost").unwrap();
                let stream = tls.connect(name, stream).await.unwrap();
                let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .unwrap();
                tokio::spawn(conn);
                Sender::H2(sender)
            }
        }
    }
}

/// One connection's request sender, whichever the protocol.
pub enum Sender {
    /// HTTP/1.1.
    H1(http1::SendRequest<Full<Bytes>>),
    /// HTTP/2, over TCP or TLS.
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    /// Waits until the connection can take a request; an error once it is closed.
    pub async fn ready(&mut self) -> hyper::Result<()> {
        match self {
            Sender::H1(s) => s.ready().await,
            Sender::H2(s) => s.ready().await,
        }
    }

    /// Sends `req` and waits for the head of its answer.
    pub async fn send(
        &mut self,
        req: http::Request<Full<Bytes>>,
    ) -> hyper::Result<http::Response<hyper::body::Incoming>> {
        match self {
            Sender::H1(s) => s.send_request(req).await,
            Sender::H2(s) => s.send_request(req).await,
        }
    }
}
