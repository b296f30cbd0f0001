//! TLS termination (`--tls-cert`, `--tls-key`): HTTP/2 and HTTP/1.1 by ALPN, curl gets
//! a replay over either, the pair is read again on SIGHUP without touching open
//! connections (a bad new pair keeps the old one), unusable files stop the start with
//! a clear error, and TLS older than 1.2 is refused. Every certificate and key here is
//! made by the test.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{Gateway, Upstream, binary, new_key};

/// A private CA, and leaf certificates it signs for `localhost`.
struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca: CertificateDer<'static>,
}

/// A leaf's PEM chain (leaf, then the CA) and key, and the leaf's DER.
struct Leaf {
    chain: String,
    key: String,
    der: CertificateDer<'static>,
}

impl Pki {
    fn new() -> Pki {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        Pki {
            issuer: Issuer::new(params, key),
            ca: ca.der().clone(),
        }
    }

    fn leaf(&self) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let ca_pem = pem_of(&self.ca);
        Leaf {
            chain: format!("{}{ca_pem}", cert.pem()),
            key: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// A client that trusts this CA and offers `alpn`.
    fn connector(&self, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

fn pem_of(der: &CertificateDer<'_>) -> String {
    use std::fmt::Write;
    let b64 = base64_encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        writeln!(pem, "{}", std::str::from_utf8(line).unwrap()).unwrap();
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn write_pair(dir: &Path, leaf: &Leaf) {
    // Written aside and renamed, as a certificate manager does, so that a reload never
    // reads half a file.
    for (name, text) in [("cert.pem", &leaf.chain), ("key.pem", &leaf.key)] {
        let tmp = dir.join(format!("{name}.new"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

async fn start(pki: &Pki) -> (Upstream, Gateway, tempfile::TempDir, Leaf) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let leaf = pki.leaf();
    write_pair(dir.path(), &leaf);
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--tls-cert",
            "cert.pem",
            "--tls-key",
            "key.pem",
        ],
    )
    .await;
    (up, gw, dir, leaf)
}

/// A TLS connection to the gateway: the stream, the certificate it presented, and the
/// protocol ALPN chose.
async fn connect(
    pki: &Pki,
    gw: &Gateway,
    alpn: &[&[u8]],
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    CertificateDer<'static>,
    Option<Vec<u8>>,
) {
    let tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = pki
        .connector(alpn)
        .connect(name, tcp)
        .await
        .expect("a TLS handshake");
    let (_, session) = tls.get_ref();
    let presented = session.peer_certificates().unwrap()[0].clone();
    let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
    (tls, presented, alpn)
}

/// An HTTP/2 connection over TLS.
async fn h2_over_tls(
    pki: &Pki,
    gw: &Gateway,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    CertificateDer<'static>,
) {
    let (tls, presented, alpn) = connect(pki, gw, &[b"h2", b"http/1.1"]).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "ALPN chose HTTP/2");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    (send, presented)
}

async fn get(send: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>) -> u16 {
    let req = http::Request::get("https://localhost/v1/things")
        .body(Full::new(Bytes::new()))
        .unwrap();
    send.send_request(req).await.unwrap().status().as_u16()
}

/// `curl -k ARGS…` POSTing with `key`: the status line and whether it was a replay.
async fn curl(args: &[&str], url: String, key: &str) -> (String, bool) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sS",
        "-k",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "--max-time",
        "20",
    ])
    .args(args)
    .args(["-X", "POST", "-H", &format!("Idempotency-Key: {key}")])
    .args([
        "-H",
        "Content-Type: application/json",
        "-d",
        "{\"amount\":1}",
    ])
    .arg(url);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("curl runs"))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    let status = head.lines().next().unwrap_or_default().trim().to_owned();
    (status, head.contains("idempotent-replayed: true"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_over_tls_gets_a_replay_over_http2_and_http11() {
    let pki = Pki::new();
    let (up, gw, _dir, _) = start(&pki).await;
    let url = format!("https://{}/v1/charges", gw.addr);
    for (args, status) in [
        (["--http2"], "http/2 201"),
        (["--http1.1"], "http/1.1 201 created"),
    ] {
        let key = new_key();
        assert_eq!(
            curl(&args, url.clone(), &key).await,
            (status.to_owned(), false)
        );
        assert_eq!(
            curl(&args, url.clone(), &key).await,
            (status.to_owned(), true)
        );
        assert_eq!(up.started(&key), 1);
    }
    // ALPN with HTTP/1.1 alone is HTTP/1.1.
    let (_, _, alpn) = connect(&pki, &gw, &[b"http/1.1"]).await;
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_tls_port_is_a_400_that_says_so_and_reaches_nobody() {
    let pki = Pki::new();
    let (up, gw, _dir, _) = start(&pki).await;
    for request in [
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"k-plain\"\r\n\
         content-length: 2\r\n\r\n{}",
        "GET /healthz HTTP/1.0\r\n\r\n",
    ] {
        let mut plain = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        plain.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), plain.read_to_string(&mut answer))
            .await
            .expect("answered and closed")
            .unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").expect(&answer);
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{answer}");
        assert!(
            head.contains("content-type: application/problem+json"),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            v["type"],
            "https://idem.dev/problems/plain-http-to-https-port"
        );
        assert_eq!(v["status"], 400);
    }
    assert_eq!(up.total(), 0, "nothing reached the upstream");
    // The same port still speaks TLS.
    let key = new_key();
    let url = format!("https://{}/v1/charges", gw.addr);
    assert_eq!(
        curl(&["--http1.1"], url, &key).await,
        ("http/1.1 201 created".to_owned(), false)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_pair_for_new_connections_and_open_ones_keep_working() {
    let pki = Pki::new();
    let (_up, gw, dir, first) = start(&pki).await;
    let (mut open, presented) = h2_over_tls(&pki, &gw).await;
    assert_eq!(presented, first.der);
    assert_eq!(get(&mut open).await, 201);

    let second = pki.leaf();
    write_pair(dir.path(), &second);
    gw.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (_, presented, _) = connect(&pki, &gw, &[b"h2"]).await;
        if presented == second.der {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new pair was never used"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connection opened before the reload goes on, with its first certificate.
    assert_eq!(get(&mut open).await, 201);

    // A new certificate with the key of another: refused, and the pair in force stays.
    let third = pki.leaf();
    let mismatched = Leaf {
        chain: third.chain.clone(),
        key: second.key.clone(),
        der: third.der.clone(),
    };
    write_pair(dir.path(), &mismatched);
    gw.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !gw.logs().contains("cannot be used") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no error logged:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut fresh, presented) = h2_over_tls(&pki, &gw).await;
    assert_eq!(
        presented, second.der,
        "the bad pair left the good one in force"
    );
    assert_eq!(get(&mut fresh).await, 201);
    assert_eq!(get(&mut open).await, 201);
}

/// `POST /reload` reads the pair again as SIGHUP does (issue 61 §5): a private key
/// rotated under the same file names is in force once the reload answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_reload_reloads_the_pair_too() {
    let pki = Pki::new();
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let first = pki.leaf();
    write_pair(dir.path(), &first);
    let token = "tls-reload-admin-token-0123456789";
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--tls-cert",
            "cert.pem",
            "--tls-key",
            "key.pem",
            "--admin",
            "127.0.0.1:0",
            "--admin-token",
            token,
        ],
    )
    .await;
    let (_, presented, _) = connect(&pki, &gw, &[b"h2"]).await;
    assert_eq!(presented, first.der);
    let second = pki.leaf();
    write_pair(dir.path(), &second);
    let auth = format!("Bearer {token}");
    let done = crate::common::Http::new()
        .send(
            "POST",
            &gw.admin_url("/reload"),
            &[("authorization", &auth)],
            "",
        )
        .await;
    assert_eq!(done.status, 200, "{done:?}");
    let (_, presented, _) = connect(&pki, &gw, &[b"h2"]).await;
    assert_eq!(presented, second.der, "the new pair, at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_files_stop_the_start_with_a_clear_error() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let a = pki.leaf();
    let b = pki.leaf();
    std::fs::write(dir.path().join("a.pem"), &a.chain).unwrap();
    std::fs::write(dir.path().join("b.key"), &b.key).unwrap();
    std::fs::write(dir.path().join("a.key"), &a.key).unwrap();
    std::fs::write(dir.path().join("junk.pem"), "not a certificate\n").unwrap();
    let run = |command: &str, cert: &str, key: &str| {
        let out = std::process::Command::new(binary())
            .args([
                command,
                "--upstream",
                "http://127.0.0.1:1",
                "--store",
                "memory://",
            ])
            .args([
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                cert,
                "--tls-key",
                key,
            ])
            .current_dir(dir.path())
            .env("IDEM_LOG", "error")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for command in ["serve", "check-config"] {
        let (ok, err) = run(command, "missing.pem", "a.key");
        assert!(
            !ok && err.contains("cannot read missing.pem"),
            "{command}: {err}"
        );
        let (ok, err) = run(command, "junk.pem", "a.key");
        assert!(
            !ok && err.contains("junk.pem holds no usable PEM certificate"),
            "{command}: {err}"
        );
        let (ok, err) = run(command, "a.pem", "a.pem");
        assert!(
            !ok && err.contains("a.pem holds no usable PEM private key"),
            "{command}: {err}"
        );
        let (ok, err) = run(command, "a.pem", "b.key");
        assert!(
            !ok && err.contains("cannot be used together"),
            "{command}: {err}"
        );
    }
    let (ok, err) = run("check-config", "a.pem", "a.key");
    assert!(ok, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_older_than_1_2_is_refused() {
    let pki = Pki::new();
    let (_up, gw, _dir, _) = start(&pki).await;
    // A TLS 1.1 ClientHello (record and client version 3.2, no supported_versions), with
    // a suite the server's key could use under TLS 1.2: only the version is wrong.
    let mut hello = vec![0x03, 0x02];
    hello.extend_from_slice(&[7; 32]); // random
    hello.push(0); // no session id
    // TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_RSA_WITH_AES_128_CBC_SHA
    hello.extend_from_slice(&[0x00, 0x04, 0xc0, 0x2b, 0x00, 0x2f]);
    hello.extend_from_slice(&[0x01, 0x00]); // null compression
    let mut handshake = vec![0x01, 0, 0, hello.len() as u8];
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, 0x03, 0x02, 0, handshake.len() as u8];
    record.extend_from_slice(&handshake);
    let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("the connection is closed")
        .ok();
    // A fatal alert (content type 21, level 2) and never a ServerHello: rustls speaks
    // no TLS below 1.2, and says handshake_failure (40) or protocol_version (70).
    assert_eq!(answer.first(), Some(&0x15), "{answer:?}");
    assert_eq!(answer.get(5), Some(&2), "{answer:?}");
    assert!(matches!(answer.get(6), Some(40 | 70)), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_takes_its_own_pair() {
    let pki = Pki::new();
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let admin = pki.leaf();
    std::fs::write(dir.path().join("admin.pem"), &admin.chain).unwrap();
    std::fs::write(dir.path().join("admin.key"), &admin.key).unwrap();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--store",
            "memory://",
            "--admin",
            "127.0.0.1:0",
            "--admin-tls-cert",
            "admin.pem",
            "--admin-tls-key",
            "admin.key",
        ],
    )
    .await;
    let admin_addr = gw.admin.unwrap();
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "-k", "--max-time", "20", "-w", " %{http_version}"])
        .arg(format!("https://{admin_addr}/healthz"));
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.ends_with(" 2"), "HTTP/2 over TLS: {said}");
    // The proxy's port stays plain.
    let plain = crate::common::Http::new()
        .send("GET", &gw.url("/v1/things"), &[], "")
        .await;
    assert_eq!(plain.status, 201);
}
