//! The gateway's store over TLS: a private PostgreSQL with `ssl = on`, a
//! `redis-server --tls-port` and a MariaDB with `require_secure_transport`, each started here on its own port with certificates made
//! at run time, and a Redis Cluster whose nodes speak only TLS. A verified connection
//! carries the keyed protocol end to end; a store
//! URL whose TLS settings cannot work stops `idem serve` and `idem check-config` with
//! status 2 and a message naming the setting; a certificate that does not verify is
//! said to be one.

use std::process::Stdio;

use idem_test_support::{
    MYSQL_TLS_USER, MariaDbServer, PgServer, RedisCluster, RedisTlsServer, TestPki,
    service_unavailable,
};
use tokio::process::Command;

use crate::common::{Gateway, Http, Upstream, binary, new_key};

/// A keyed request through a gateway on `store` executes once and its retry replays.
async fn executes_once_and_replays(store: &str) {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", store]).await;
    let http = Http::new();
    let key = new_key();
    let url = gw.url("/v1/charges");
    let first = http.post(&url, &key, r#"{"amount":100}"#, &[]).await;
    assert_eq!(first.status, 201, "{first:?}\n{}", gw.logs());
    assert!(!first.replayed());
    let retry = http.post(&url, &key, r#"{"amount":100}"#, &[]).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(up.started(&key), 1, "the upstream ran once");
}

/// `idem ARGS…` with a bounded run time: its status and standard error.
async fn run(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEM_") {
            cmd.env_remove(k);
        }
    }
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), cmd.output())
        .await
        .expect("idem exits in time")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_tls_store_carries_the_keyed_protocol() {
    let pki = TestPki::new().unwrap();
    let cert = pki.server("server", &["127.0.0.1", "localhost"]).unwrap();
    let ca = pki.ca().display().to_string();
    match PgServer::start_tls(&cert, &pki.ca()) {
        Ok(pg) => {
            let store = pg.url(&format!("sslmode=verify-full&sslrootcert={ca}"));
            executes_once_and_replays(&store).await;
        }
        Err(e) => {
            service_unavailable("a private PostgreSQL with TLS", "127.0.0.1", &e).unwrap_or(())
        }
    }
    match RedisTlsServer::start(&cert, &pki.ca(), false) {
        Ok(redis) => {
            let store = format!("rediss://127.0.0.1:{}/?cacert={ca}", redis.port());
            executes_once_and_replays(&store).await;
        }
        Err(e) => {
            service_unavailable("a private redis-server with TLS", "127.0.0.1", &e).unwrap_or(())
        }
    }
    match MariaDbServer::start_tls(&cert, &pki.ca()) {
        Ok(my) => {
            let query = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
            executes_once_and_replays(&my.url_as(MYSQL_TLS_USER, &query)).await;
        }
        Err(e) => service_unavailable("a private MariaDB with TLS", "127.0.0.1", &e).unwrap_or(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_redis_cluster_carries_the_keyed_protocol_and_refuses_the_wrong_ca() {
    let pki = TestPki::new().unwrap();
    let cluster = match RedisCluster::start_tls(3, 0, std::time::Duration::from_secs(5), &pki) {
        Ok(cluster) => cluster,
        Err(e) => {
            return service_unavailable("a private Redis Cluster with TLS", "127.0.0.1", &e)
                .unwrap_or(());
        }
    };
    let ca = pki.ca().display().to_string();
    executes_once_and_replays(&format!("{}&cacert={ca}", cluster.url())).await;
    // A certificate that does not verify is a refusal that says so: `check-config`
    // fails with status 1, and `serve` names it while it answers keyed requests 503
    // and tries again (the CA file may be replaced, or the nodes' certificates).
    let other = pki.other_ca().display().to_string();
    let store = format!("{}&cacert={other}", cluster.url());
    let (code, stderr) = run(&[
        "check-config",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        &store,
    ])
    .await;
    assert_eq!(code, Some(1), "{store}: {stderr}");
    assert!(
        stderr.contains("TLS failed: invalid peer certificate"),
        "{stderr}"
    );
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", &store]).await;
    let key = new_key();
    let answer = Http::new()
        .post(&gw.url("/v1/charges"), &key, "{}", &[])
        .await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(up.started(&key), 0);
    assert!(
        gw.logs().contains("TLS failed: invalid peer certificate"),
        "{}",
        gw.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_settings_that_cannot_work_stop_the_start_with_status_2() {
    let pki = TestPki::new().unwrap();
    let client = pki.client();
    let key = client.key.display().to_string();
    // Port 1 on loopback: nothing is ever reached, the settings alone decide.
    for (store, says) in [
        (
            "postgres://postgres@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"
                .to_owned(),
            "sslrootcert=/nonexistent/ca.pem: cannot read the file",
        ),
        (
            "postgres://postgres@127.0.0.1:1/db?sslmode=verify_full".to_owned(),
            "sslmode=verify_full: not a mode",
        ),
        (
            "postgres://postgres@127.0.0.1:1/db?sslmode=allow".to_owned(),
            "sslmode=allow is not supported",
        ),
        (
            format!(
                "postgres://postgres@127.0.0.1:1/db?sslmode=require&sslcert={}&sslkey={}",
                client.cert.display(),
                pki.ca().display()
            ),
            "holds no PEM private key",
        ),
        (
            format!("rediss://127.0.0.1:1/?cacert={key}"),
            "holds no PEM certificate",
        ),
        (
            "mysql://root@127.0.0.1:1/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/nonexistent/ca.pem"
                .to_owned(),
            "ssl-ca=/nonexistent/ca.pem: cannot read the file",
        ),
        (
            "mysql://root@127.0.0.1:1/db?ssl-mode=VERIFY_FULL".to_owned(),
            "ssl-mode=VERIFY_FULL: not a mode",
        ),
        (
            format!(
                "mysql://root@127.0.0.1:1/db?ssl-mode=REQUIRED&ssl-cert={}&ssl-key={}",
                client.cert.display(),
                pki.ca().display()
            ),
            "holds no PEM private key",
        ),
        (
            "rediss://127.0.0.1:1/#insecure".to_owned(),
            "write insecure=true",
        ),
    ] {
        for command in ["serve", "check-config"] {
            let (code, stderr) = run(&[
                command,
                "--upstream",
                "http://127.0.0.1:1",
                "--listen",
                "127.0.0.1:0",
                "--store",
                &store,
            ])
            .await;
            assert_eq!(code, Some(2), "{command} {store}: {stderr}");
            assert!(stderr.contains(says), "{command} {store}: {stderr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_verify_is_said_to_be_one() {
    let pki = TestPki::new().unwrap();
    let cert = pki.server("server", &["db.elsewhere.test"]).unwrap();
    let ca = pki.ca().display().to_string();
    let other = pki.other_ca().display().to_string();
    let pg = match PgServer::start_tls(&cert, &pki.ca()) {
        Ok(pg) => pg,
        Err(e) => {
            return service_unavailable("a private PostgreSQL with TLS", "127.0.0.1", &e)
                .unwrap_or(());
        }
    };
    for (query, says) in [
        (
            format!("sslmode=verify-full&sslrootcert={other}"),
            "TLS (sslmode=verify-full) failed: invalid peer certificate",
        ),
        (
            format!("sslmode=verify-full&sslrootcert={ca}"),
            "not valid for name",
        ),
    ] {
        let store = pg.url(&query);
        let (code, stderr) = run(&[
            "check-config",
            "--upstream",
            "http://127.0.0.1:1",
            "--store",
            &store,
        ])
        .await;
        // The server was reached and refused: a failure at run time, not a typo.
        assert_eq!(code, Some(1), "{store}: {stderr}");
        assert!(stderr.contains(says), "{store}: {stderr}");
    }
    match MariaDbServer::start_tls(&cert, &pki.ca()) {
        Ok(my) => {
            let store = my.url_as(
                MYSQL_TLS_USER,
                &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={other}"),
            );
            let (code, stderr) = run(&[
                "check-config",
                "--upstream",
                "http://127.0.0.1:1",
                "--store",
                &store,
            ])
            .await;
            assert_eq!(code, Some(1), "{store}: {stderr}");
            let says = "TLS (ssl-mode=VERIFY_IDENTITY) failed: invalid peer certificate";
            assert!(stderr.contains(says), "{store}: {stderr}");
        }
        Err(e) => service_unavailable("a private MariaDB with TLS", "127.0.0.1", &e).unwrap_or(()),
    }
    // verify-ca checks the chain alone.
    let store = pg.url(&format!("sslmode=verify-ca&sslrootcert={ca}"));
    let (code, stderr) = run(&[
        "check-config",
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        &store,
    ])
    .await;
    assert_eq!(code, Some(0), "{stderr}");
}
