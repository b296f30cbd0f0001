//! Inspection and schema, never written by accident (issue 37 §3): `idem keys` on a
//! mistyped SQLite file or PostgreSQL namespace creates nothing and says there is
//! nothing of idem's there; `check-config` leaves no file behind and tells a missing
//! directory and a taken port; `serve --no-migrate` refuses a store without its schema.

use std::path::Path;
use std::process::Output;

use crate::common::idem_in;
use crate::shared::postgres;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn keys_on_a_mistyped_sqlite_file_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = "sqlite://typo.db";
    for args in [
        vec!["keys", "list", "--store", store],
        vec![
            "keys",
            "show",
            "k-1",
            "--endpoint",
            "POST /v1/charges",
            "--store",
            store,
        ],
        vec![
            "keys",
            "purge",
            "k-1",
            "--endpoint",
            "POST /v1/charges",
            "--store",
            store,
        ],
    ] {
        let out = idem_in(dir.path(), &args);
        assert!(!out.status.success(), "{args:?} exit {:?}", out.status);
        assert!(
            stderr(&out).contains("no idem records at"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files made: {left:?}");
}

#[tokio::test]
async fn keys_on_a_mistyped_postgres_namespace_create_no_table() {
    let Some(url) = postgres().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let ns = format!("typo_{}", std::process::id());
    for _ in 0..2 {
        // Twice: had the first call made the table, the second would list it empty.
        let out = idem_in(
            dir.path(),
            &["keys", "list", "--store", &url, "--store-namespace", &ns],
        );
        assert!(!out.status.success(), "exit {:?}", out.status);
        let err = stderr(&out);
        assert!(
            err.contains("no idem records at") && err.contains(&format!("{ns}_records")),
            "{err}"
        );
    }
}

#[test]
fn check_config_writes_nothing_and_tells_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = ["--upstream", "http://127.0.0.1:9"];
    // A file serve would make: said so, and not made.
    let out = idem_in(
        dir.path(),
        &[
            &[
                "check-config",
                "--store",
                "sqlite://new.db",
                "--listen",
                "127.0.0.1:0",
            ][..],
            &upstream,
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("serve creates it"));
    assert!(!dir.path().join("new.db").exists());
    // A file that is there: opened without a trace.
    let made = idem_in(
        dir.path(),
        &["keys", "purge", "--expired", "--store", "sqlite://new.db"],
    );
    assert!(
        !made.status.success(),
        "purge does not make the file either"
    );
    let db = dir.path().join("idem.db");
    {
        // Made the way serve makes it: by opening it with migration on.
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let url = format!("sqlite://{}", db.display());
            let store = idem_gateway::store::open(&url).await.unwrap();
            store.close().await;
        });
    }
    let before: Vec<String> = names(dir.path());
    let out = idem_in(
        dir.path(),
        &[
            &[
                "check-config",
                "--store",
                "sqlite://idem.db",
                "--listen",
                "127.0.0.1:0",
            ][..],
            &upstream,
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(names(dir.path()), before, "no -wal or -shm left behind");
    // A directory that is not there.
    let out = idem_in(
        dir.path(),
        &[
            &["check-config", "--store", "sqlite://nowhere/idem.db"][..],
            &upstream,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("directory nowhere does not exist"),
        "{}",
        stderr(&out)
    );
    // A port that is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = idem_in(
        dir.path(),
        &[
            &["check-config", "--store", "memory://", "--listen", &addr][..],
            &upstream,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("listen {addr} cannot be bound")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn serve_with_no_migrate_refuses_a_store_without_its_schema() {
    let dir = tempfile::tempdir().unwrap();
    let out = idem_in(
        dir.path(),
        &[
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "sqlite://idem.db",
            "--no-migrate",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no idem records at"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("idem.db").exists());
}

/// The names of the files in `dir`, sorted.
pub(crate) fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
