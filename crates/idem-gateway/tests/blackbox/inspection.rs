//! Inspection and schema, never written by accident (issue 37 §3): `idem keys` on a
//! mistyped SQLite file or PostgreSQL namespace creates nothing and says there is
//! nothing of idem's there; `check-config` leaves no file behind and tells a missing
//! directory and a taken port; `serve --no-migrate` refuses a store without its schema.
//!
//! A namespace never opened is told from an empty one (issue 54 §3): on SQLite,
//! PostgreSQL, Redis and a Redis Cluster, every inspection command says the first in
//! one shape and exits 1, and after a gateway has opened the namespace, still without
//! a record, the listings print nothing and exit 0.

use std::path::Path;
use std::process::Output;

use crate::cluster::redis_cluster;
use crate::common::{Gateway, idem_in};
use crate::shared::{postgres, redis};

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

/// Every inspection command, each before `--store URL --store-namespace NS`.
const INSPECTIONS: [&[&str]; 7] = [
    &["keys", "list"],
    &["keys", "list", "--ambiguous"],
    &[
        "keys",
        "list",
        "--state",
        "in_progress",
        "--older-than",
        "5m",
    ],
    &["keys", "show", "k-1", "--endpoint", "POST /v1/charges"],
    &["keys", "show", "k-1", "--tenant", "anonymous"],
    &["keys", "purge", "k-1", "--endpoint", "POST /v1/charges"],
    &["keys", "purge", "--expired"],
];

/// The listings of an opened namespace: nothing to print is not a failure.
const LISTINGS: [&[&str]; 3] = [INSPECTIONS[0], INSPECTIONS[1], INSPECTIONS[2]];

/// What every inspection command says of a namespace never opened, on every store,
/// once the store URL, the namespace and what the store looked for are replaced by
/// `<URL>`, `<NS>` and `<MISSING>` ([`shape`]).
const NEVER_OPENED: &str = "idem: no idem records at <URL>: namespace <NS> was never opened \
     by idem (<MISSING>). Check the store URL and --store-namespace: a gateway makes the \
     namespace when it first opens it";

/// `err` with the store's own parts replaced as in [`NEVER_OPENED`]; a SQL store's
/// mention of `idem migrate`, which makes its table too, is left out.
fn shape(err: &str, url: &str, ns: &str) -> String {
    let err = err
        .trim_end()
        .replace(&idem_core::redact_url(url), "<URL>")
        .replace(&format!("namespace {ns} "), "namespace <NS> ")
        .replace(", or `idem migrate` does", "");
    match err.split_once("by idem (") {
        Some((head, rest)) => match rest.split_once("). Check") {
            Some((_, tail)) => format!("{head}by idem (<MISSING>). Check{tail}"),
            None => err,
        },
        None => err,
    }
}

/// `idem ARGS… --store URL --store-namespace NS`, run in `dir` to its end.
fn inspect(dir: &Path, args: &[&str], url: &str, ns: &str) -> Output {
    let mut all = args.to_vec();
    all.extend(["--store", url, "--store-namespace", ns]);
    idem_in(dir, &all)
}

/// Every inspection command on the namespace `ns` of the store `url`, which no gateway
/// opened: exit 1, nothing on standard output, the one message of [`NEVER_OPENED`]
/// naming `missing`, the same from each; and nothing written, since each command finds
/// the namespace unopened after the one before. Then a gateway opens it and stops:
/// the listings print nothing and exit 0, `purge --expired` purges none, and a key has
/// no record.
async fn never_opened_then_empty(dir: &Path, url: &str, ns: &str, missing: &str) {
    let mut first: Option<String> = None;
    for args in INSPECTIONS {
        let out = inspect(dir, args, url, ns);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed {:?}", out.stdout);
        assert_eq!(shape(&err, url, ns), NEVER_OPENED, "{args:?}: {err}");
        assert!(
            err.contains(&format!("by idem ({missing})")),
            "{args:?}: {err}"
        );
        match &first {
            None => first = Some(err),
            Some(first) => assert_eq!(&err, first, "{args:?}"),
        }
    }

    let gw = Gateway::start(
        "http://127.0.0.1:9",
        dir,
        &["--store", url, "--store-namespace", ns],
    )
    .await;
    assert!(gw.terminate().await.success());
    for args in LISTINGS {
        let out = inspect(dir, args, url, ns);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?} printed {:?}", out.stdout);
        assert!(!stderr(&out).contains("never opened"), "{}", stderr(&out));
    }
    let out = inspect(dir, INSPECTIONS[6], url, ns);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "purged 0 expired records\n"
    );
    for args in [INSPECTIONS[3], INSPECTIONS[5]] {
        let out = inspect(dir, args, url, ns);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("no record for key \"k-1\""),
            "{}",
            stderr(&out)
        );
    }
}

#[tokio::test]
async fn sqlite_tells_a_namespace_never_opened_from_an_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let url = "sqlite://inspected.db";
    never_opened_then_empty(dir.path(), url, "payments", "no file inspected.db").await;
    // In a file a gateway made, another namespace is as unopened.
    let out = inspect(dir.path(), INSPECTIONS[0], url, "refunds");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(shape(&stderr(&out), url, "refunds"), NEVER_OPENED);
    assert!(
        stderr(&out).contains("(inspected.db has no table refunds_records)"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn postgres_tells_a_namespace_never_opened_from_an_empty_one() {
    let Some(url) = postgres().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let ns = idem_core::testing::unique_namespace("inspected");
    let missing = format!("this database has no table {ns}_records");
    never_opened_then_empty(dir.path(), &url, &ns, &missing).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    idem_postgres::schema::drop_table(&pool, &format!("{ns}_records"))
        .await
        .unwrap();
    pool.close().await;
}

#[tokio::test]
async fn redis_tells_a_namespace_never_opened_from_an_empty_one() {
    let Some(url) = redis().await else { return };
    let dir = tempfile::tempdir().unwrap();
    let ns = idem_core::testing::unique_namespace("inspected");
    let missing = format!("no key {ns}:meta:schema");
    never_opened_then_empty(dir.path(), &url, &ns, &missing).await;
    // What the gateway left, on a server that holds other data: its marker and the
    // tenant secret, nothing else (its records would have expired by themselves).
    let mut conn = ::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = ::redis::cmd("DEL")
        .arg(format!("{ns}:meta:schema"))
        .arg(format!("{ns}:meta:tenant-secret"))
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_tells_a_namespace_never_opened_from_an_empty_one() {
    let Some(url) = redis_cluster().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ns = idem_core::testing::unique_namespace("inspected");
    let missing = format!("no key {ns}:meta:schema");
    never_opened_then_empty(dir.path(), &url, &ns, &missing).await;
}
