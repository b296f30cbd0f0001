//! `https://` out of the box: with default features the client speaks TLS (rustls on
//! ring) to a server whose certificate a private CA signed, once it is told to trust
//! that CA, and refuses the server without it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_client::{Client, Error, RetryPolicy};
use idem_test_support::TestPki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS server on 127.0.0.1 that answers every request 201 `{"ok":true}` and counts
/// the requests it read whole, with the keys they carried.
struct TlsServer {
    port: u16,
    requests: Arc<AtomicUsize>,
    keys: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsServer {
    async fn start(pki: &TestPki) -> TlsServer {
        let files = pki.server("server", &["127.0.0.1"]).unwrap();
        let certs = CertificateDer::pem_file_iter(&files.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (counted, seen) = (requests.clone(), keys.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, counted, seen) = (acceptor.clone(), counted.clone(), seen.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Some(head) = read_request(&mut tls).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    if let Some(key) = header(&head, "idempotency-key") {
                        seen.lock().unwrap().push(key);
                    }
                    let answer = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                                  content-length: 11\r\nconnection: close\r\n\r\n{\"ok\":true}";
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        TlsServer {
            port,
            requests,
            keys,
            task,
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/v1/charges", self.port)
    }
}

/// A request's head, once it and its `content-length` of body are read.
async fn read_request(io: &mut (impl AsyncReadExt + Unpin)) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let length: usize = header(&head, "content-length").map_or(0, |v| v.parse().unwrap());
            while buf.len() < end + 4 + length {
                let n = io.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(head);
        }
        let n = io.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_url_works_with_default_features_and_a_private_ca() {
    let pki = TestPki::new().unwrap();
    let server = TlsServer::start(&pki).await;
    let client = Client::builder()
        .add_root_certificate_pem(std::fs::read(pki.ca()).unwrap())
        .build()
        .unwrap();
    let charge = client
        .post(server.url())
        .json(&serde_json::json!({"amount": 1000}));
    let key = charge.key().as_str().to_owned();
    let outcome = tokio::time::timeout(Duration::from_secs(20), charge.send())
        .await
        .expect("an answer within 20 s")
        .unwrap();
    assert_eq!(outcome.status(), 201);
    assert_eq!(outcome.body().as_ref(), b"{\"ok\":true}");
    assert_eq!(outcome.attempts(), 1);
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);
    assert_eq!(*server.keys.lock().unwrap(), [key]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_ca_is_not_trusted_is_refused_at_the_handshake() {
    let pki = TestPki::new().unwrap();
    let server = TlsServer::start(&pki).await;
    let client = Client::builder()
        .policy(RetryPolicy::default().max_attempts(1))
        .build()
        .unwrap();
    let sent = tokio::time::timeout(Duration::from_secs(20), client.post(server.url()).send())
        .await
        .expect("an answer within 20 s");
    let err = sent.unwrap_err();
    assert!(!matches!(err, Error::TlsDisabled(_)), "{err}");
    assert_eq!(
        server.requests.load(Ordering::SeqCst),
        0,
        "nothing was sent"
    );
}
