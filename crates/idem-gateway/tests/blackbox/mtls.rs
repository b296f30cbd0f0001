//! The tenant from a verified client certificate (`--tls-client-ca`, `--tenant-from
//! cert`, issue 39 §1): a service whose certificate is renewed keeps its tenant (its
//! SAN), another service's certificate is another tenant, a certificate from another
//! CA fails the handshake, and a client without one is named by its headers.

use std::path::Path;

use idem_test_support::{CertFiles, TestPki};

use crate::common::{Gateway, Upstream, check_config, new_key};

/// `curl` POSTing a keyed charge over TLS to `url`, with `cert` as its client
/// certificate when given: the status (0 when the handshake failed) and whether the
/// answer was a replay.
async fn curl(ca: &Path, cert: Option<&CertFiles>, url: &str, key: &str) -> (u16, bool) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "-o", "/dev/null", "-D", "-", "--max-time", "10"])
        .arg("--cacert")
        .arg(ca)
        .args(["-X", "POST", "-H", "content-type: application/json"])
        .args(["-H", &format!("idempotency-key: {key}")])
        .args(["-H", "authorization: Bearer same-for-everyone"])
        .args(["--data", "{\"amount\":100}"]);
    if let Some(c) = cert {
        cmd.arg("--cert").arg(&c.cert).arg("--key").arg(&c.key);
    }
    cmd.arg(url);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("curl runs"))
        .await
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.contains("idempotent-replayed: true"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificates_san_names_its_tenant_across_renewals() {
    let pki = TestPki::new().unwrap();
    let server = pki.server("gateway", &["127.0.0.1"]).unwrap();
    let worker = "uri:spiffe://example.org/ns/pay/sa/worker";
    let first = pki.client_named("worker-2026-11", &[worker]).unwrap();
    let renewed = pki.client_named("worker-2026-12", &[worker]).unwrap();
    let other = pki
        .client_named("reports", &["uri:spiffe://example.org/ns/pay/sa/reports"])
        .unwrap();
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = pki.ca();
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &[
            "--tls-cert",
            server.cert.to_str().unwrap(),
            "--tls-key",
            server.key.to_str().unwrap(),
            "--tls-client-ca",
            ca.to_str().unwrap(),
            "--tenant-from",
            "cert,headers",
        ],
    )
    .await;
    let url = format!("https://127.0.0.1:{}/v1/charges", gw.addr.port());
    let key = new_key();

    assert_eq!(curl(&ca, Some(&first), &url, &key).await, (201, false));
    // A renewed certificate, the same SAN: the same tenant, a replay.
    assert_eq!(curl(&ca, Some(&renewed), &url, &key).await, (201, true));
    assert_eq!(up.started(&key), 1);
    // Another service's certificate with the same key (and the same bearer token):
    // its own execution.
    assert_eq!(curl(&ca, Some(&other), &url, &key).await, (201, false));
    assert_eq!(up.started(&key), 2);
    // No certificate: named by the headers, a tenant of its own.
    assert_eq!(curl(&ca, None, &url, &key).await, (201, false));
    assert_eq!(up.started(&key), 3);

    // A certificate from another CA fails the handshake: nothing reaches anyone.
    let foreign_pki = TestPki::new().unwrap();
    let foreign = foreign_pki.client_named("intruder", &[worker]).unwrap();
    let (status, _) = curl(&ca, Some(&foreign), &url, &key).await;
    assert_eq!(status, 0, "the handshake fails");
    assert_eq!(up.started(&key), 3);
}

#[test]
fn cert_without_a_client_ca_stops_the_start() {
    let out = check_config(&["--tenant-from", "cert"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls_client_ca"), "{err}");
    let out = check_config(&["--tls-client-ca", "ca.pem"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tls_client_ca") && err.contains("tls_cert"),
        "{err}"
    );
}
