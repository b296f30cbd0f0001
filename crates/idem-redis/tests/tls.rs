//! TLS to a real `redis-server --tls-port`, started by the test on its own port with
//! certificates made at run time: `rediss://` with the private CA works end to end, the
//! name is checked, `insecure=true` skips the checks only when written, a wrong CA is
//! refused and a plaintext-only server said to be one, a server that wants client
//! certificates takes one, and `rediss+cluster://` reaches every master of a Redis
//! Cluster whose nodes speak only TLS.

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{OpenError, OpenStore, Reservation, ReserveRequest, Store, StoreOptions};
use idem_redis::RedisStore;
use idem_test_support::{RedisCluster, RedisTlsServer, TestPki, service_unavailable};

async fn open(url: &str) -> Result<RedisStore, OpenError> {
    RedisStore::open(url, &StoreOptions::default()).await
}

/// The PKI and a TLS-only server whose certificate names `names`; `None` (after a loud
/// skip) when the machine has no `redis-server`.
fn tls_server(names: &[&str], require_client_cert: bool) -> Option<(TestPki, RedisTlsServer)> {
    let started = TestPki::new().and_then(|pki| {
        let cert = pki.server("server", names)?;
        let server = RedisTlsServer::start(&cert, &pki.ca(), require_client_cert)?;
        Ok((pki, server))
    });
    match started {
        Ok(started) => Some(started),
        Err(e) => service_unavailable("a private redis-server with TLS", "127.0.0.1", &e),
    }
}

async fn reserve_and_replay(store: &RedisStore) {
    reserve_and_replay_key(store, "k-tls").await;
}

async fn reserve_and_replay_key(store: &RedisStore, key: &str) {
    let request = ReserveRequest::new(test_scope("/v1/charges", key), test_fingerprint("{}"));
    let Reservation::Acquired(lease) = store.reserve(&request).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    store
        .complete(&lease, &idem_core::StoredResponse::new(201, "charged"))
        .await
        .unwrap();
    let again = store.reserve(&request).await.unwrap();
    assert!(
        matches!(again, Reservation::Replay(ref r) if r.status == 201),
        "{again:?}"
    );
}

fn refused_saying(e: &OpenError, says: &[&str]) {
    assert!(matches!(e, OpenError::Refused { .. }), "{e:?}");
    let text = e.to_string();
    for part in says {
        assert!(text.contains(part), "{text:?} does not say {part:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_verifies_the_chain_and_the_name() {
    let Some((pki, server)) = tls_server(&["127.0.0.1", "localhost"], false) else {
        return;
    };
    let port = server.port();
    let ca = pki.ca().display().to_string();
    let other = pki.other_ca().display().to_string();
    let store = open(&format!("rediss://127.0.0.1:{port}/?cacert={ca}"))
        .await
        .expect("rediss with the CA");
    reserve_and_replay(&store).await;
    let e = open(&format!("rediss://127.0.0.1:{port}/?cacert={other}"))
        .await
        .expect_err("the wrong CA");
    refused_saying(&e, &["TLS failed", "invalid peer certificate"]);
    // Without a CA the system's roots apply, which do not hold the private CA.
    let e = open(&format!("rediss://127.0.0.1:{port}"))
        .await
        .expect_err("no CA");
    refused_saying(&e, &["TLS failed", "invalid peer certificate"]);
    // Only when written out.
    let store = open(&format!("rediss://127.0.0.1:{port}/?insecure=true"))
        .await
        .expect("insecure=true");
    store.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_refused() {
    let Some((pki, server)) = tls_server(&["cache.elsewhere.test"], false) else {
        return;
    };
    let ca = pki.ca().display().to_string();
    let e = open(&format!(
        "rediss://127.0.0.1:{}/?cacert={ca}",
        server.port()
    ))
    .await
    .expect_err("another name");
    refused_saying(&e, &["TLS failed", "not valid for name"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_wants_a_client_certificate_takes_one() {
    let Some((pki, server)) = tls_server(&["127.0.0.1"], true) else {
        return;
    };
    let ca = pki.ca().display().to_string();
    let client = pki.client();
    let url = format!(
        "rediss://127.0.0.1:{}/?cacert={ca}&cert={}&key={}",
        server.port(),
        client.cert.display(),
        client.key.display()
    );
    let store = open(&url).await.expect("with the client certificate");
    reserve_and_replay(&store).await;
    let e = open(&format!(
        "rediss://127.0.0.1:{}/?cacert={ca}",
        server.port()
    ))
    .await
    .expect_err("without one");
    assert!(!matches!(e, OpenError::InvalidUrl { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_only_server_is_refused_over_rediss() {
    let server = match RedisCluster::start_replicated(0) {
        Ok(server) => server,
        Err(e) => {
            return service_unavailable("a private redis-server", "127.0.0.1", &e).unwrap_or(());
        }
    };
    let port = server.ports()[0];
    let pki = TestPki::new().unwrap();
    let ca = pki.ca().display().to_string();
    let e = open(&format!("rediss://127.0.0.1:{port}/?cacert={ca}"))
        .await
        .expect_err("no TLS there");
    // It reads the hello as the start of a command and never answers.
    assert!(matches!(e, OpenError::Unreachable { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("the TLS handshake got no answer (a server that speaks no TLS"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_reaches_every_master_over_tls() {
    let pki = TestPki::new().unwrap();
    let cluster = match RedisCluster::start_tls(3, 0, std::time::Duration::from_secs(5), &pki) {
        Ok(cluster) => cluster,
        Err(e) => {
            return service_unavailable("a private Redis Cluster with TLS", "127.0.0.1", &e)
                .unwrap_or(());
        }
    };
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let ca = pki.ca().display().to_string();
    let store = open(&format!("{url}&cacert={ca}"))
        .await
        .expect("rediss+cluster with the CA");
    // Keys whose hash slots fall on each of the three masters: every node's TLS
    // connection is used, not only the seed's.
    let ns = idem_core::testing::unique_namespace("tls_cluster");
    for i in 0..24 {
        reserve_and_replay_key(&store, &format!("{ns}-{i}")).await;
    }
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "{masters:?}");
    for port in masters {
        let keys = key_count(&pki, port);
        assert!(keys > 0, "the master on {port} holds none of the records");
    }
    let other = pki.other_ca().display().to_string();
    let e = open(&format!("{url}&cacert={other}"))
        .await
        .expect_err("the wrong CA");
    refused_saying(&e, &["TLS failed", "invalid peer certificate"]);
    let plain = url.replacen("rediss+cluster://", "redis+cluster://", 1);
    let e = open(&plain).await.expect_err("plaintext to TLS-only nodes");
    assert!(!matches!(e, OpenError::InvalidUrl { .. }), "{e:?}");
}

/// How many keys the TLS node on `port` holds, asked with `redis-cli --tls`.
fn key_count(pki: &TestPki, port: u16) -> u64 {
    let client = pki.client();
    let out = std::process::Command::new("redis-cli")
        .arg("--tls")
        .arg("--cacert")
        .arg(pki.ca())
        .arg("--cert")
        .arg(&client.cert)
        .arg("--key")
        .arg(&client.key)
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "--raw",
            "DBSIZE",
        ])
        .output()
        .expect("redis-cli");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("DBSIZE on {port}: {text:?}"))
}
