//! The inbox over TLS: a `PgInbox` on a pool from `sslmode=verify-full`, and a
//! `RedisInbox` on a `rediss://` client, each against a private TLS-only server started
//! here with certificates made at run time. A duplicate delivery is skipped over the
//! encrypted connection as over a plain one, and a certificate from another CA is
//! refused before anything is read or written.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_inbox::{Error, Inbox, Outcome, PgInbox, RedisInbox};
use idem_test_support::{PgServer, RedisTlsServer, TestPki, service_unavailable};

/// Runs `process` for message `m-1` three times; how often its effects ran.
async fn deliver_three_times<I: Inbox>(inbox: &I) -> usize {
    let runs = AtomicUsize::new(0);
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let outcome = inbox
            .process("m-1", |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok::<_, Error>(()) })
            })
            .await
            .unwrap();
        outcomes.push(outcome);
    }
    assert_eq!(
        outcomes,
        [
            Outcome::Processed(()),
            Outcome::Duplicate,
            Outcome::Duplicate
        ]
    );
    runs.load(Ordering::SeqCst)
}

async fn pg_pool(url: &str) -> Result<sqlx::PgPool, sqlx::Error> {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_inbox_over_verified_tls_skips_duplicates() {
    let pki = TestPki::new().unwrap();
    let cert = pki.server("server", &["127.0.0.1"]).unwrap();
    let pg = match PgServer::start_tls(&cert, &pki.ca()) {
        Ok(pg) => pg,
        Err(e) => {
            return service_unavailable("a private PostgreSQL with TLS", "127.0.0.1", &e)
                .unwrap_or(());
        }
    };
    let ca = pki.ca().display().to_string();
    let pool = pg_pool(&pg.url(&format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .expect("a verified TLS pool");
    // The server says this session is encrypted.
    let (ssl,): (bool,) =
        sqlx::query_as("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(ssl, "the session is not encrypted");
    let ns = idem_core::testing::unique_namespace("inbox_tls");
    let inbox = PgInbox::new(pool.clone(), "points")
        .unwrap()
        .with_table(&format!("inbox_{ns}"))
        .unwrap();
    inbox.migrate().await.unwrap();
    assert_eq!(deliver_three_times(&inbox).await, 1, "the effects ran once");
    assert!(inbox.contains("m-1").await.unwrap());

    let other = pki.other_ca().display().to_string();
    let e = pg_pool(&pg.url(&format!("sslmode=verify-full&sslrootcert={other}")))
        .await
        .expect_err("a certificate from another CA");
    assert!(e.to_string().contains("invalid peer certificate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_inbox_over_rediss_skips_duplicates() {
    let pki = TestPki::new().unwrap();
    let cert = pki.server("server", &["127.0.0.1"]).unwrap();
    let server = match RedisTlsServer::start(&cert, &pki.ca(), false) {
        Ok(server) => server,
        Err(e) => {
            return service_unavailable("a private redis-server with TLS", "127.0.0.1", &e)
                .unwrap_or(());
        }
    };
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let connect = |ca: std::path::PathBuf| {
        let url = url.clone();
        async move {
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(ca).unwrap()),
            };
            let client = redis::Client::build_with_tls(url.as_str(), certificates)?;
            let connect = client.get_multiplexed_async_connection();
            tokio::time::timeout(Duration::from_secs(10), connect)
                .await
                .expect("the handshake ends in time")
        }
    };
    let conn = connect(pki.ca()).await.expect("a verified rediss client");
    let ns = idem_core::testing::unique_namespace("inbox_tls");
    let inbox = RedisInbox::new(conn, "points")
        .unwrap()
        .with_prefix(format!("idem-inbox-test:{ns}"));
    assert_eq!(deliver_three_times(&inbox).await, 1, "the effects ran once");
    assert!(inbox.contains("m-1").await.unwrap());

    let e = connect(pki.other_ca())
        .await
        .expect_err("a certificate from another CA");
    assert!(e.to_string().contains("invalid peer certificate"), "{e}");
}
