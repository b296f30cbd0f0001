//! TLS to a real PostgreSQL with `ssl = on`, started by the test on its own port with
//! certificates made at run time: `verify-full` checks the chain and the name,
//! `verify-ca` only the chain, a wrong CA and a plaintext-only server are refused
//! with what failed, client certificates log in, and files that cannot work are an
//! invalid URL before anything connects.

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{OpenError, OpenStore, Reservation, ReserveRequest, Store, StoreOptions};
use idem_postgres::PgStore;
use idem_test_support::{CERT_USER, PgServer, TestPki, service_unavailable};

fn options() -> StoreOptions {
    StoreOptions {
        pool: Some(2),
        ..StoreOptions::default()
    }
}

async fn open(url: &str) -> Result<PgStore, OpenError> {
    PgStore::open(url, &options()).await
}

/// The PKI and a TLS-only server whose certificate names `names`; `None` (after a loud
/// skip) when the machine has no PostgreSQL server binaries.
fn tls_server(names: &[&str]) -> Option<(TestPki, PgServer)> {
    let started = TestPki::new().and_then(|pki| {
        let cert = pki.server("server", names)?;
        let server = PgServer::start_tls(&cert, &pki.ca())?;
        Ok((pki, server))
    });
    match started {
        Ok(started) => Some(started),
        Err(e) => service_unavailable("a private PostgreSQL with TLS", "127.0.0.1", &e),
    }
}

/// Whether the store's connections are encrypted, as the server sees them.
async fn encrypted(store: &PgStore) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl")
}

/// A keyed operation through the store: reserved once, then a replay.
async fn reserve_and_replay(store: &PgStore) {
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
async fn verify_full_checks_the_chain_and_the_name() {
    let Some((pki, server)) = tls_server(&["127.0.0.1", "localhost"]) else {
        return;
    };
    let ca = pki.ca().display().to_string();
    let other = pki.other_ca().display().to_string();

    let store = open(&server.url(&format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .expect("verify-full with the CA");
    assert!(encrypted(&store).await);
    reserve_and_replay(&store).await;
    store.close().await;

    let e = open(&server.url(&format!("sslmode=verify-full&sslrootcert={other}")))
        .await
        .expect_err("the wrong CA is refused");
    refused_saying(
        &e,
        &[
            "TLS (sslmode=verify-full) failed",
            "invalid peer certificate",
        ],
    );

    // Unverified: encrypted, whatever CA signed the certificate.
    let store = open(&server.url("sslmode=require")).await.expect("require");
    assert!(encrypted(&store).await);
    store.close().await;
    // As in libpq, require with a CA file verifies the chain.
    let e = open(&server.url(&format!("sslmode=require&sslrootcert={other}")))
        .await
        .expect_err("require with the wrong CA is refused");
    refused_saying(&e, &["TLS (sslmode=verify-ca) failed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_fails_verify_full_and_passes_verify_ca() {
    let Some((pki, server)) = tls_server(&["db.elsewhere.test"]) else {
        return;
    };
    let ca = pki.ca().display().to_string();
    let e = open(&server.url(&format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .expect_err("another name is refused under verify-full");
    refused_saying(
        &e,
        &["TLS (sslmode=verify-full) failed", "not valid for name"],
    );
    let store = open(&server.url(&format!("sslmode=verify-ca&sslrootcert={ca}")))
        .await
        .expect("verify-ca checks the chain only");
    assert!(encrypted(&store).await);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_logs_in_and_none_is_refused() {
    let Some((pki, server)) = tls_server(&["127.0.0.1"]) else {
        return;
    };
    let ca = pki.ca().display().to_string();
    let client = pki.client();
    let url = server.url_as(
        CERT_USER,
        &format!(
            "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
            client.cert.display(),
            client.key.display()
        ),
    );
    let store = open(&url).await.expect("the client certificate logs in");
    assert!(encrypted(&store).await);
    store.close().await;
    // The same role without a certificate: `cert` authentication refuses it.
    let e = open(&server.url_as(CERT_USER, &format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .expect_err("no client certificate");
    assert!(matches!(e, OpenError::Refused { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_only_server_is_refused_unless_tls_is_only_preferred() {
    let server = match PgServer::start_plaintext() {
        Ok(server) => server,
        Err(e) => {
            return service_unavailable("a private PostgreSQL", "127.0.0.1", &e).unwrap_or(());
        }
    };
    for mode in ["require", "verify-ca", "verify-full"] {
        let e = open(&server.url(&format!("sslmode={mode}")))
            .await
            .expect_err(mode);
        refused_saying(
            &e,
            &[
                &format!("TLS (sslmode={mode}) failed"),
                "server does not support TLS",
            ],
        );
    }
    let store = open(&server.url("sslmode=prefer")).await.expect("prefer");
    assert!(!encrypted(&store).await);
    store.close().await;
}

#[tokio::test]
async fn tls_files_that_cannot_work_are_an_invalid_url() {
    let pki = TestPki::new().unwrap();
    let client = pki.client();
    let server = pki.server("server", &["127.0.0.1"]).unwrap();
    let ca = pki.ca().display().to_string();
    // Port 1 on loopback: nothing would answer, and nothing is tried.
    let base = "postgres://postgres@127.0.0.1:1/postgres";
    for (query, says) in [
        (
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem".to_owned(),
            "sslrootcert=/nonexistent/ca.pem: cannot read the file".to_owned(),
        ),
        (
            "sslmode=verify-fully".to_owned(),
            "sslmode=verify-fully: not a mode".to_owned(),
        ),
        (
            "sslmode=allow".to_owned(),
            "sslmode=allow is not supported".to_owned(),
        ),
        (
            format!("sslmode=verify-full&sslrootcert={}", client.key.display()),
            "holds no PEM certificate".to_owned(),
        ),
        (
            format!(
                "sslrootcert={ca}&sslcert={}&sslkey={}",
                client.cert.display(),
                server.key.display()
            ),
            format!("sslkey={} does not go with sslcert=", server.key.display()),
        ),
        (
            format!("sslcert={}", client.cert.display()),
            "sslcert needs sslkey".to_owned(),
        ),
    ] {
        let url = format!("{base}?{query}");
        let e = open(&url).await.expect_err(&url);
        assert!(matches!(e, OpenError::InvalidUrl { .. }), "{url}: {e:?}");
        assert!(!e.may_pass(), "{url}");
        assert!(e.to_string().contains(&says), "{url}: {e}");
    }
}
