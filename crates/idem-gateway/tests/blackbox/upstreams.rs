//! Upstreams that are not plain HTTP/1.1: `https://` ones (a private CA made here, with
//! `--upstream-ca`; the wrong CA; another name), and HTTP/2 ones (h2c with prior
//! knowledge, `h2` by ALPN), each with the keyed protocol end to end.

use std::sync::{Arc, Mutex};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;

use crate::common::{Gateway, Http, Upstream, new_key};

/// A private CA, made for one test.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (an IP address becomes an IP SAN) and its key.
    fn issue(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key)
    }

    fn write(&self, dir: &std::path::Path, file: &str) -> String {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// How the test upstream speaks: HTTP/2 only on plain TCP (h2c), or TLS with these
/// ALPN protocols, then HTTP/2 when `h2` was agreed and HTTP/1.1 otherwise.
#[derive(Clone)]
enum Transport {
    H2c,
    Tls {
        config: Arc<rustls::ServerConfig>,
        /// The protocol each connection agreed by ALPN (`""` for none).
        agreed: Arc<Mutex<Vec<String>>>,
    },
}

impl Transport {
    fn tls(ca: &Ca, names: &[&str], alpn: &[&[u8]]) -> Transport {
        let (chain, key) = ca.issue(names);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Transport::Tls {
            config: Arc::new(config),
            agreed: Arc::default(),
        }
    }

    fn agreed(&self) -> Vec<String> {
        match self {
            Transport::Tls { agreed, .. } => agreed.lock().unwrap().clone(),
            Transport::H2c => Vec::new(),
        }
    }

    async fn start(&self) -> Upstream {
        let transport = self.clone();
        Upstream::start_on(move |listener, app| transport.serve(listener, app)).await
    }

    async fn serve(self, listener: TcpListener, app: Router) {
        while let Ok((tcp, _)) = listener.accept().await {
            let (app, transport) = (app.clone(), self.clone());
            tokio::spawn(async move {
                let svc = TowerToHyperService::new(app);
                let h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                match transport {
                    Transport::H2c => {
                        let _ = h2.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                    Transport::Tls { config, agreed } => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config);
                        // A client that refuses the certificate ends here.
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                        let alpn = String::from_utf8(alpn.unwrap_or_default()).unwrap();
                        agreed.lock().unwrap().push(alpn.clone());
                        let io = TokioIo::new(tls);
                        if alpn == "h2" {
                            let _ = h2.serve_connection(io, svc).await;
                        } else {
                            let h1 = hyper::server::conn::http1::Builder::new();
                            let _ = h1.serve_connection(io, svc).await;
                        }
                    }
                }
            });
        }
    }
}

/// The store file shared by the gateways of one test, so a second one sees what the
/// first left of a key.
fn store(dir: &std::path::Path) -> String {
    format!("sqlite://{}", dir.join("idem.db").display())
}

/// A keyed POST, then its retry: the first executes, the retry replays it, the
/// upstream ran once.
async fn records_and_replays(gw: &Gateway, up: &Upstream) {
    let http = Http::new();
    let key = new_key();
    let first = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(first.status, 201, "{first:?}\n{}", gw.logs());
    assert!(!first.replayed());
    let again = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(again.status, 201, "{again:?}");
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(up.started(&key), 1, "the upstream ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_under_a_private_ca_records_and_replays() {
    let ca = Ca::new("idem test CA");
    let up = Transport::tls(&ca, &["127.0.0.1"], &[]).start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write(dir.path(), "ca.pem");
    let url = format!("https://{}", up.addr);
    let gw = Gateway::start(
        &url,
        dir.path(),
        &["--store", "memory://", "--upstream-ca", &ca_file],
    )
    .await;
    records_and_replays(&gw, &up).await;
    let seen = up.seen();
    assert_eq!(
        seen[0].headers["host"],
        up.addr.to_string().as_str(),
        "the Host is the upstream's, as over http://"
    );
    let fwd = seen[0].headers["x-forwarded-proto"].to_str().unwrap();
    assert_eq!(fwd, "http", "the client's scheme, not the upstream's");
}

/// Without `--upstream-ca` the system's roots are trusted (here `SSL_CERT_FILE` names
/// another CA, as a machine's store would hold public ones): the handshake fails, the
/// answer is a 502 naming TLS, nothing is sent in plaintext and the key is released, so
/// the same key executes once the gateway trusts the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_under_an_unknown_ca_is_a_502_that_releases_the_key() {
    let ca = Ca::new("idem test CA");
    let up = Transport::tls(&ca, &["127.0.0.1"], &[]).start().await;
    let dir = tempfile::tempdir().unwrap();
    let system = Ca::new("some public CA").write(dir.path(), "system.pem");
    let url = format!("https://{}", up.addr);
    let store = store(dir.path());
    let gw = Gateway::start_with_env(
        &url,
        dir.path(),
        &["--store", &store, "--admin", "127.0.0.1:0"],
        &[("SSL_CERT_FILE", &system)],
    )
    .await;
    let http = Http::new();
    let key = new_key();
    let a = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!(
        a.problem_type(),
        "https://idem.dev/problems/upstream-unreachable"
    );
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("TLS"), "{detail}");
    assert!(detail.contains("UnknownIssuer"), "{detail}");
    assert_eq!(up.total(), 0, "nothing reached the upstream");
    let metrics = http.send("GET", &gw.admin_url("/metrics"), &[], "").await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        metrics.contains("idem_upstream_errors_total{kind=\"tls\"} 1"),
        "{metrics}"
    );
    // Released: not 409, and not recorded.
    let b = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(b.status, 502, "{b:?}");
    gw.terminate().await;

    let ca_file = ca.write(dir.path(), "ca.pem");
    let gw = Gateway::start(
        &url,
        dir.path(),
        &["--store", &store, "--upstream-ca", &ca_file],
    )
    .await;
    let c = http.post(&gw.url("/v1/charges"), &key, "{}", &[]).await;
    assert_eq!(c.status, 201, "{c:?}");
    assert!(!c.replayed());
    assert_eq!(up.started(&key), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_certified_for_another_name_is_a_502() {
    let ca = Ca::new("idem test CA");
    let up = Transport::tls(&ca, &["elsewhere.test"], &[]).start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write(dir.path(), "ca.pem");
    let url = format!("https://{}", up.addr);
    let gw = Gateway::start(
        &url,
        dir.path(),
        &["--store", "memory://", "--upstream-ca", &ca_file],
    )
    .await;
    let key = new_key();
    let a = Http::new()
        .post(&gw.url("/v1/charges"), &key, "{}", &[])
        .await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!(
        a.problem_type(),
        "https://idem.dev/problems/upstream-unreachable"
    );
    let detail = a.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("not valid for name"), "{detail}");
    assert_eq!(up.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upstream_is_reached_with_http2_prior_knowledge() {
    let up = Transport::H2c.start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--upstream-protocol", "http2"],
    )
    .await;
    records_and_replays(&gw, &up).await;
    // Unkeyed requests share the connection's streams too.
    let http = Http::new();
    let url = gw.url("/v1/charges");
    let gets = (0..8).map(|_| http.send("GET", &url, &[], ""));
    for a in futures_util::future::join_all(gets).await {
        assert_eq!(a.status, 201, "{a:?}");
    }
}

/// An HTTP/2-only upstream spoken to in HTTP/1.1 (the default) answers nothing the
/// gateway can read, and nothing executes. Mostly the request was sent first: a broken
/// connection's 504. When the upstream's bytes break the connection before it takes
/// the request, nothing was sent: a 502 that releases the key. Which comes first is
/// the upstream's timing; each answer is the true one for its case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upstream_spoken_to_in_http1_executes_nothing() {
    let up = Transport::H2c.start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let key = new_key();
    let a = Http::new()
        .post(&gw.url("/v1/charges"), &key, "{}", &[])
        .await;
    let problem = match a.status {
        504 => "https://idem.dev/problems/upstream-connection-lost",
        502 => "https://idem.dev/problems/upstream-unreachable",
        _ => panic!("{a:?}"),
    };
    assert_eq!(a.problem_type(), problem, "{a:?}");
    assert_eq!(up.started(&key), 0, "nothing executed");
}

/// `auto` over TLS takes what ALPN agrees: `h2` from an upstream that offers it, and
/// HTTP/1.1 from one that offers only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_speaks_http2_to_an_https_upstream_that_agrees_h2_by_alpn() {
    let ca = Ca::new("idem test CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write(dir.path(), "ca.pem");
    for (offered, agreed) in [
        (&[&b"h2"[..], b"http/1.1"][..], "h2"),
        (&[&b"http/1.1"[..]][..], "http/1.1"),
    ] {
        let transport = Transport::tls(&ca, &["127.0.0.1"], offered);
        let up = transport.start().await;
        let url = format!("https://{}", up.addr);
        let gw = Gateway::start(
            &url,
            dir.path(),
            &[
                "--store",
                "memory://",
                "--upstream-ca",
                &ca_file,
                "--upstream-protocol",
                "auto",
            ],
        )
        .await;
        records_and_replays(&gw, &up).await;
        assert_eq!(transport.agreed(), [agreed], "one pooled connection");
    }
}

/// An upstream that speaks HTTP/1.1 alone (hyper's HTTP/1.1 server, no HTTP/2).
async fn http11_only_upstream() -> Upstream {
    Upstream::start_on(|listener: TcpListener, app: Router| async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let app = app.clone();
            tokio::spawn(async move {
                let svc = TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    })
    .await
}

/// `--upstream-protocol http2` in front of an HTTP/1.1-only upstream: the upstream
/// never reads the request, so the answer is a 502 that releases the key (not a 504
/// that keeps it locked for the lease), and once the gateway speaks HTTP/1.1 to it the
/// same key executes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_to_an_http11_only_upstream_is_a_502_that_releases_the_key() {
    let up = http11_only_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    // A store file that both gateways share, one after the other.
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let http = Http::new();
    let key = new_key();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", &store, "--upstream-protocol", "http2"],
    )
    .await;
    for _ in 0..2 {
        let a = http
            .post(&gw.url("/v1/charges"), &key, r#"{"amount":1}"#, &[])
            .await;
        assert_eq!(a.status, 502, "{a:?}\n{}", gw.logs());
        assert_eq!(
            a.problem_type(),
            "https://idem.dev/problems/upstream-unreachable"
        );
    }
    assert_eq!(up.total(), 0, "the upstream read no request");
    drop(gw);
    // Released, not in progress: the same key executes at once.
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", &store]).await;
    let a = http
        .post(&gw.url("/v1/charges"), &key, r#"{"amount":1}"#, &[])
        .await;
    assert_eq!(a.status, 201, "{a:?}");
    assert!(!a.replayed());
    assert_eq!(up.started(&key), 1);
}
