//! `idem migrate` and the exit statuses (issue 37 §3, §4): a dry run prints the SQL and
//! writes nothing; the migration makes what `serve --no-migrate` opens; an old schema
//! is refused by `serve --no-migrate` and brought up by `idem migrate`; every command
//! exits 2 for a configuration wrong as written and 1 for a failure at run time.

use std::path::Path;
use std::process::Output;

use crate::common::{Gateway, Upstream, binary, idem_in};
use crate::inspection::names;
use crate::shared::postgres;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `serve --no-migrate` on `store`: its exit status and standard error, or `None` when
/// it started (it is stopped again).
async fn serve_without_migrating(dir: &Path, store: &[&str]) -> Option<(Option<i32>, String)> {
    let args = [
        &[
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--no-migrate",
        ][..],
        store,
    ]
    .concat();
    let mut child = tokio::process::Command::new(binary())
        .args(&args)
        .current_dir(dir)
        .env("IDEM_LOG", "warn")
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_STORE_NAMESPACE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("serve starts or exits within 30 s")
        .unwrap();
    match first {
        Some(line) => {
            assert!(line.starts_with("idem listening on "), "{line}");
            child.kill().await.unwrap();
            None
        }
        None => {
            let out = child.wait_with_output().await.unwrap();
            Some((out.status.code(), stderr(&out)))
        }
    }
}

#[tokio::test]
async fn a_dry_run_writes_nothing_and_migrate_makes_what_no_migrate_opens() {
    let dir = tempfile::tempdir().unwrap();
    let store = ["--store", "sqlite://idem.db"];
    let dry = idem_in(
        dir.path(),
        &[&["migrate", "--dry-run"][..], &store].concat(),
    );
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let script = stdout(&dry);
    let lines: Vec<&str> = script.lines().collect();
    assert!(
        lines[0].starts_with("-- idem migrate --dry-run: table idem_records at sqlite://idem.db")
            && lines[0].contains("none (no table yet) to 3"),
        "{script}"
    );
    assert!(lines.contains(&"BEGIN IMMEDIATE;"), "{script}");
    assert_eq!(lines.last(), Some(&"COMMIT;"), "{script}");
    assert!(script.contains("CREATE TABLE IF NOT EXISTS idem_records ("));
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));

    // Without the schema, serve --no-migrate refuses, naming the command to run.
    let (code, err) = serve_without_migrating(dir.path(), &store)
        .await
        .expect("serve refuses");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no idem records at") && err.contains("idem migrate"),
        "{err}"
    );
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));

    let done = idem_in(dir.path(), &[&["migrate"][..], &store].concat());
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(
        stdout(&done),
        "migrated table idem_records at sqlite://idem.db from schema version none (no table \
         yet) to 3\n"
    );
    assert_eq!(names(dir.path()), ["idem.db"]);
    assert_eq!(serve_without_migrating(dir.path(), &store).await, None);
    let again = idem_in(
        dir.path(),
        &[&["migrate", "--dry-run"][..], &store].concat(),
    );
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(
        stdout(&again),
        "table idem_records at sqlite://idem.db is at schema version 3: nothing to migrate\n"
    );
    assert_eq!(names(dir.path()), ["idem.db"], "no -wal or -shm left");
}

#[tokio::test]
async fn an_old_postgres_schema_is_refused_by_no_migrate_and_brought_up_by_migrate() {
    let Some(url) = postgres().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let ns = idem_core::testing::unique_namespace("old");
    let store = ["--store", url.as_str(), "--store-namespace", ns.as_str()];
    // Version 3, made by hand from the plan's statements up to version 3's row.
    let plan = idem_gateway::store::plan(
        &url,
        idem_gateway::store::StoreOptions {
            namespace: Some(idem_gateway::store::Namespace::new(&ns).unwrap()),
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        (plan.from, plan.to),
        (None, idem_postgres::schema::SCHEMA_VERSION as u32)
    );
    let upto = plan
        .statements
        .iter()
        .position(|s| s.starts_with("INSERT INTO idem_schema_migrations") && s.contains(", 3, '"))
        .expect("version 3's row");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for statement in &plan.statements[..=upto] {
        sqlx::Executor::execute(&mut *tx, sqlx::AssertSqlSafe(statement.clone()))
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    tx.commit().await.unwrap();

    let (code, err) = serve_without_migrating(dir.path(), &store)
        .await
        .expect("serve refuses an old schema");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "table {ns}_records has schema version 3; this build needs 6: run `idem migrate`"
        )),
        "{err}"
    );
    let dry = idem_in(
        dir.path(),
        &[&["migrate", "--dry-run"][..], &store].concat(),
    );
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    let script = stdout(&dry);
    assert!(script.contains("schema version 3 to 6"), "{script}");
    assert!(script.contains("ADD COLUMN ambiguity"), "{script}");
    assert!(script.contains("ADD COLUMN tombstone_until"), "{script}");
    assert!(
        !script.contains(&format!("CREATE TABLE {ns}_records")),
        "{script}"
    );
    let done = idem_in(dir.path(), &[&["migrate"][..], &store].concat());
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert!(
        stdout(&done).contains("from schema version 3 to 6"),
        "{}",
        stdout(&done)
    );
    assert_eq!(serve_without_migrating(dir.path(), &store).await, None);

    idem_postgres::schema::drop_table(&pool, &format!("{ns}_records"))
        .await
        .unwrap();
    pool.close().await;
}

#[tokio::test]
async fn every_command_exits_2_when_wrong_as_written_and_1_when_it_fails_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let unreachable = format!("postgres://postgres@127.0.0.1:{closed}/test");
    let upstream = Upstream::start().await;
    let up = upstream.url();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        // Wrong as written.
        (
            vec!["serve", "--upstream", &up, "--listne", "x"],
            2,
            "--listne",
        ),
        (
            vec![
                "serve",
                "--upstream",
                &up,
                "--store",
                "postgres://h/db?sslmod=require",
            ],
            2,
            "unknown parameter \"sslmod\"",
        ),
        (
            vec!["check-config", "--upstream", &up, "--store", "mongodb://h"],
            2,
            "mongodb://h",
        ),
        (
            vec![
                "check-config",
                "--upstream",
                &up,
                "--store",
                "rediss://127.0.0.1:6379?cacert=/nonexistent/ca.pem",
            ],
            2,
            "/nonexistent/ca.pem",
        ),
        (
            vec!["keys", "list", "--store", "postgres://h/db?sslmode=bogus"],
            2,
            "sslmode=bogus",
        ),
        (
            vec!["migrate", "--store", "redis://h?db=x&nope=1"],
            0,
            "keeps no schema",
        ),
        (
            vec!["migrate", "--store", "sqlite://nowhere/x.db"],
            2,
            "nowhere",
        ),
        (
            vec![
                "migrate",
                "--store",
                "sqlite://x.db",
                "--store-namespace",
                "a-b",
            ],
            2,
            "--store-namespace",
        ),
        (vec!["check", "not a url"], 2, "not a url"),
        (vec!["demo", "--operations", "many"], 2, "many"),
        (vec!["demo", "--store", "mongodb://h"], 2, "mongodb://h"),
        // Failures at run time.
        (
            vec!["check-config", "--upstream", &up, "--store", &unreachable],
            1,
            "Connection refused",
        ),
        (
            vec!["keys", "list", "--store", &unreachable],
            1,
            "Connection refused",
        ),
        (
            vec!["migrate", "--store", &unreachable],
            1,
            "Connection refused",
        ),
        (
            vec!["keys", "list", "--store", "sqlite://typo.db"],
            1,
            "no idem records at",
        ),
    ];
    for (args, code, says) in cases {
        let out = idem_in(dir.path(), &args);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?} should say {says:?}: {text}");
        assert!(!text.contains("pool timed out"), "{args:?}: {text}");
    }
    assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
}

#[tokio::test]
async fn keys_show_without_an_endpoint_says_how_the_scope_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(
        &upstream.url(),
        dir.path(),
        &["--store", "sqlite://idem.db"],
    )
    .await;
    let http = crate::common::Http::new();
    let key = crate::common::new_key();
    let answer = http
        .post(&gateway.url("/v1/charges"), &key, "{\"amount\":1}", &[])
        .await;
    assert_eq!(answer.status, 201);
    // The gateway's own SQLite file, named as the gateway names it: the message is the
    // same on every store, and this test keeps to its file under IDEM_TEST_GATEWAY_STORE.
    let store = ["--store", "sqlite://idem.db"];
    let out = idem_in(dir.path(), &[&["keys", "show", &key][..], &store].concat());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "no record for key {key:?} in the scope tenant anonymous, no endpoint"
        )) && err.contains("--endpoint")
            && err.contains("--scope public"),
        "{err}"
    );
    let out = idem_in(
        dir.path(),
        &[
            &["keys", "show", &key, "--endpoint", "POST /v1/charges"][..],
            &store,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    drop(gateway);
}
