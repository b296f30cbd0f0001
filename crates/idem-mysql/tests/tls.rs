//! TLS to a real MariaDB that takes only TLS connections (`require_secure_transport`),
//! started by the test on its own port with certificates made at run time, its grant
//! tables on: `VERIFY_IDENTITY` checks the chain and the name, `VERIFY_CA` only the
//! chain, a wrong CA is refused saying what failed, plaintext is refused by the server,
//! a client certificate logs in an account that requires one, and files that cannot
//! work are an invalid URL before anything connects.

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{OpenError, OpenStore, Reservation, ReserveRequest, Store, StoreOptions};
use idem_mysql::MySqlStore;
use idem_test_support::{CERT_USER, MYSQL_TLS_USER, MariaDbServer, TestPki, service_unavailable};

fn options() -> StoreOptions {
    StoreOptions {
        pool: Some(2),
        ..StoreOptions::default()
    }
}

async fn open(url: &str) -> Result<MySqlStore, OpenError> {
    MySqlStore::open(url, &options()).await
}

/// The PKI and a TLS-only server whose certificate names `names`; `None` (after a loud
/// skip) when the machine has no MariaDB server binaries.
fn tls_server(names: &[&str]) -> Option<(TestPki, MariaDbServer)> {
    let started = TestPki::new().and_then(|pki| {
        let cert = pki.server("server", names)?;
        let server = MariaDbServer::start_tls(&cert, &pki.ca())?;
        Ok((pki, server))
    });
    match started {
        Ok(started) => Some(started),
        Err(e) => service_unavailable("a private MariaDB with TLS", "127.0.0.1", &e),
    }
}

/// Whether the store's connections are encrypted, as the server sees them.
async fn encrypted(store: &MySqlStore) -> bool {
    let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(store.pool())
        .await
        .expect("Ssl_cipher");
    !cipher.is_empty()
}

/// A keyed operation through the store: reserved once, then a replay.
async fn reserve_and_replay(store: &MySqlStore) {
    let request = ReserveRequest::new(test_scope("/v1/charges", "k-tls"), test_fingerprint("{}"));
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
async fn verify_identity_checks_the_chain_and_the_name_and_plaintext_is_refused() {
    let Some((pki, server)) = tls_server(&["127.0.0.1", "localhost"]) else {
        return;
    };
    let ca = pki.ca().display().to_string();
    let other = pki.other_ca().display().to_string();
    let url = |query: &str| server.url_as(MYSQL_TLS_USER, query);

    let store = open(&url(&format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")))
        .await
        .expect("VERIFY_IDENTITY with the CA");
    assert!(encrypted(&store).await);
    reserve_and_replay(&store).await;
    store.close().await;

    let e = open(&url(&format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={other}")))
        .await
        .expect_err("the wrong CA is refused");
    refused_saying(
        &e,
        &[
            "TLS (ssl-mode=VERIFY_IDENTITY) failed",
            "invalid peer certificate",
        ],
    );

    // Unverified: encrypted, whatever CA signed the certificate.
    let store = open(&url("ssl-mode=REQUIRED")).await.expect("REQUIRED");
    assert!(encrypted(&store).await);
    store.close().await;
    // REQUIRED with a CA file verifies the chain.
    let e = open(&url(&format!("ssl-mode=REQUIRED&ssl-ca={other}")))
        .await
        .expect_err("REQUIRED with the wrong CA is refused");
    refused_saying(&e, &["TLS (ssl-mode=VERIFY_CA) failed"]);

    // The server takes no plaintext: its own refusal (MariaDB answers that the
    // account, which requires TLS, is denied), with its error number; a refusal, not a
    // server that is not there.
    let e = open(&url("ssl-mode=DISABLED"))
        .await
        .expect_err("plaintext is refused");
    refused_saying(&e, &["Access denied", "(error 1045)"]);

    // A client certificate logs in the account that requires one; without one it
    // cannot.
    let client = pki.client();
    let with_cert = server.url_as(
        CERT_USER,
        &format!(
            "ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&ssl-cert={}&ssl-key={}",
            client.cert.display(),
            client.key.display()
        ),
    );
    let store = open(&with_cert).await.expect("a client certificate");
    assert!(encrypted(&store).await);
    store.close().await;
    let e = open(&server.url_as(CERT_USER, &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")))
        .await
        .expect_err("no client certificate");
    refused_saying(&e, &["Access denied"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_fails_verify_identity_and_passes_verify_ca() {
    let Some((pki, server)) = tls_server(&["db.elsewhere.test"]) else {
        return;
    };
    let ca = pki.ca().display().to_string();
    let url = |query: &str| server.url_as(MYSQL_TLS_USER, query);
    let e = open(&url(&format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")))
        .await
        .expect_err("another name is refused under VERIFY_IDENTITY");
    refused_saying(
        &e,
        &[
            "TLS (ssl-mode=VERIFY_IDENTITY) failed",
            "not valid for name",
        ],
    );
    let store = open(&url(&format!("ssl-mode=VERIFY_CA&ssl-ca={ca}")))
        .await
        .expect("VERIFY_CA checks the chain only");
    assert!(encrypted(&store).await);
    store.close().await;
}

#[tokio::test]
async fn files_that_cannot_work_are_an_invalid_url_naming_the_parameter() {
    let pki = TestPki::new().expect("a PKI");
    let ca = pki.ca().display().to_string();
    let client = pki.client();
    let cases = [
        (
            "ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/ca.pem".to_owned(),
            "ssl-ca=/nonexistent/ca.pem",
        ),
        (
            format!("ssl-mode=VERIFY_CA&ssl-ca={}", client.key.display()),
            "ssl-ca=",
        ),
        (
            format!("ssl-ca={ca}&ssl-cert={}", client.cert.display()),
            "ssl-key",
        ),
        (
            "ssl-mode=SOMETIMES".to_owned(),
            "ssl-mode=SOMETIMES: not a mode",
        ),
    ];
    for (query, says) in cases {
        let url = format!("mysql://root@127.0.0.1:1/test?{query}");
        match open(&url).await {
            Err(e @ OpenError::InvalidUrl { .. }) => {
                assert!(e.to_string().contains(says), "{query}: {e}");
            }
            other => panic!("{query}: expected an invalid URL, got {other:?}"),
        }
    }
}
