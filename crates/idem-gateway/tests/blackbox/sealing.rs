//! SPEC S17 at the gateway: `--record-key-file` seals recorded answers in the SQLite
//! file, keys rotate across restarts, an answer no key opens is a 500 that never
//! reaches the upstream; and `retry_hints = true` on a route.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::{Gateway, Http, Upstream, binary, new_key, over_both_protocols};

const K1: &str = "k1:1111111111111111111111111111111111111111111111111111111111111111";
const K2: &str = "k2:2222222222222222222222222222222222222222222222222222222222222222";

/// The path posted to (its endpoint is part of the scope, stored plain).
const MARKER: &str = "/v1/charges";

/// The upstream answers this many `x`s: the body that must not be in the file.
const BODY: [(&str, &str); 1] = [("x-test-body-bytes", "3000")];

fn write_keys(dir: &Path, lines: &[&str], mode: u32) {
    let path = dir.join("record.keys");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn store_bytes(dir: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for name in ["idem.db", "idem.db-wal"] {
        bytes.extend(std::fs::read(dir.join(name)).unwrap_or_default());
    }
    bytes
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

const ARGS: [&str; 4] = [
    "--store",
    "sqlite://idem.db",
    "--record-key-file",
    "record.keys",
];

over_both_protocols! {
async fn sealed_answers_replay_rotate_and_refuse_without_their_key(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let http = Http::speaking(proto);
    write_keys(dir.path(), &[K1], 0o600);
    let gw = Gateway::start(&up.url(), dir.path(), &ARGS).await;
    let old = new_key();
    let first = http
        .post(&gw.url(MARKER), &old, r#"{"amount":1}"#, &BODY)
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.body.len(), 3000);
    let retry = http
        .post(&gw.url(MARKER), &old, r#"{"amount":1}"#, &[])
        .await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!((retry.status, &retry.body), (201, &first.body));
    assert_eq!(retry.header("location"), first.header("location"));
    assert_eq!(gw.terminate().await.code(), Some(0));
    let bytes = store_bytes(dir.path());
    assert!(!bytes.is_empty());
    assert!(
        !contains(&bytes, &[b'x'; 64]),
        "the body is in the SQLite file"
    );
    let location = first.header("location").unwrap().as_bytes();
    assert!(
        !contains(&bytes, location),
        "a header is in the SQLite file"
    );

    // Rotation: k2 first, k1 still listed.
    write_keys(dir.path(), &[K2, K1], 0o600);
    let gw = Gateway::start(&up.url(), dir.path(), &ARGS).await;
    let again = http
        .post(&gw.url(MARKER), &old, r#"{"amount":1}"#, &[])
        .await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    let new = new_key();
    let fresh = http
        .post(&gw.url(MARKER), &new, r#"{"amount":2}"#, &[])
        .await;
    assert_eq!(fresh.status, 201);
    assert_eq!(gw.terminate().await.code(), Some(0));

    // k1 retired too early: its answer is refused, and the upstream is not called.
    write_keys(dir.path(), &[K2], 0o600);
    let gw = Gateway::start(&up.url(), dir.path(), &ARGS).await;
    let refused = http
        .post(&gw.url(MARKER), &old, r#"{"amount":1}"#, &[])
        .await;
    assert_eq!(refused.status, 500, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "https://idem.dev/problems/replay-unavailable"
    );
    let replayed = http
        .post(&gw.url(MARKER), &new, r#"{"amount":2}"#, &[])
        .await;
    assert!(
        replayed.replayed() && replayed.body == fresh.body,
        "{replayed:?}"
    );
    assert_eq!(up.started(&old), 1, "never executed again");
    assert_eq!(up.started(&new), 1);
    let logs = gw.logs();
    assert!(
        logs.contains("cannot be opened") && logs.contains("\"k1\""),
        "{logs}"
    );
    assert!(!logs.contains("1111111111"), "a key is in the log");
    gw.terminate().await;
}
}

/// `idem serve` with `extra`, expected to refuse to start; its stderr.
async fn refused_start(dir: &Path, extra: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new(binary());
    cmd.current_dir(dir)
        .args([
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEM_") {
            cmd.env_remove(k);
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the gateway exits")
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_others_can_read_or_a_bad_line_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    write_keys(dir.path(), &[K1], 0o644);
    let e = refused_start(dir.path(), &ARGS).await;
    assert!(
        e.contains("record_key_file") && e.contains("chmod 600"),
        "{e}"
    );
    write_keys(dir.path(), &["k1:nothex"], 0o600);
    let e = refused_start(dir.path(), &ARGS).await;
    assert!(e.contains("line 1") && !e.contains("nothex"), "{e}");
}

over_both_protocols! {
async fn a_route_with_retry_hints_tells_sdks_whether_to_retry(proto: Proto) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("idem.toml"),
        "[[route]]\npath = \"/v1/hinted\"\nretry_hints = true\n",
    )
    .unwrap();
    let up = Upstream::start().await;
    let http = Http::speaking(proto);
    let gw = Gateway::start(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--config", "idem.toml"],
    )
    .await;
    let hints = |a: &crate::common::Answer| {
        (
            a.header("stripe-should-retry").map(str::to_owned),
            a.header("x-should-retry").map(str::to_owned),
        )
    };
    let no = (Some("false".to_owned()), Some("false".to_owned()));
    let yes = (Some("true".to_owned()), Some("true".to_owned()));
    let failing = [("x-test-status", "500")];

    let key = new_key();
    let first = http.post(&gw.url("/v1/hinted"), &key, "{}", &failing).await;
    assert_eq!(first.status, 500);
    let replay = http.post(&gw.url("/v1/hinted"), &key, "{}", &failing).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(hints(&replay), no);
    assert_eq!(up.started(&key), 1);

    // A duplicate while the first attempt runs.
    let slow = new_key();
    let url = gw.url("/v1/hinted");
    let running = {
        let (http, url, slow) = (http.clone(), url.clone(), slow.clone());
        tokio::spawn(async move {
            http.post(&url, &slow, "{}", &[("x-test-delay-ms", "1500")])
                .await
        })
    };
    idem_test_support::eventually(
        "the first attempt reaches the upstream",
        Duration::from_secs(10),
        async || up.started(&slow) == 1,
    )
    .await;
    let conflict = http.post(&url, &slow, "{}", &[]).await;
    assert_eq!(conflict.status, 409, "{conflict:?}");
    assert_eq!(hints(&conflict), yes);
    assert_eq!(running.await.unwrap().status, 201);

    // Another route says nothing.
    let other = new_key();
    http.post(&gw.url("/v1/plain"), &other, "{}", &failing)
        .await;
    let replay = http
        .post(&gw.url("/v1/plain"), &other, "{}", &failing)
        .await;
    assert!(replay.replayed());
    assert_eq!(hints(&replay), (None, None));
    gw.terminate().await;
}
}

/// Runs `sql` on the store behind `args` (`sqlite://idem.db` in `dir`, or PostgreSQL):
/// an attacker, or a careless operator, who can write the store's rows.
fn edit_rows(dir: &Path, store: &str, sql: &str) {
    let out = if store.starts_with("sqlite://") {
        std::process::Command::new("sqlite3")
            .current_dir(dir)
            .args(["idem.db", sql])
            .output()
    } else {
        std::process::Command::new("psql")
            .args([store, "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
    }
    .expect("the database's shell runs");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Bob's plain answer (recorded before sealing was on) copied into alice's sealed row is
/// a 500 `replay-unavailable` for alice, never bob's body and never an execution; bob's
/// own plain answer is refused too, unless `--read-unsealed-records` lets plain answers
/// age out.
async fn an_unsealed_answer_in_a_sealed_store_is_refused(store: &str, table: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let http = Http::new();
    write_keys(dir.path(), &[K1], 0o600);
    let mut plain = vec!["--store", store];
    plain.extend_from_slice(extra);
    let mut sealed = plain.clone();
    sealed.extend_from_slice(&["--record-key-file", "record.keys"]);
    let as_ = |who: &'static str| [("authorization", who)];
    let (alice, bob) = (new_key(), new_key());
    let body = r#"{"amount":1}"#;

    // Bob's answer, recorded before sealing was turned on; then alice's, sealed.
    let gw = Gateway::start(&up.url(), dir.path(), &plain).await;
    let bobs = http
        .post(&gw.url(MARKER), &bob, body, &as_("Bearer bob"))
        .await;
    assert_eq!(bobs.status, 201, "{bobs:?}");
    gw.terminate().await;
    let gw = Gateway::start(&up.url(), dir.path(), &sealed).await;
    let alices = http
        .post(&gw.url(MARKER), &alice, body, &as_("Bearer alice"))
        .await;
    assert_eq!(alices.status, 201, "{alices:?}");
    gw.terminate().await;

    let from_bob = |column: &str| {
        format!("{column} = (SELECT {column} FROM {table} WHERE idem_key = '{bob}')")
    };
    edit_rows(
        dir.path(),
        store,
        &format!(
            "UPDATE {table} SET {}, {}, {} WHERE idem_key = '{alice}'",
            from_bob("status"),
            from_bob("headers"),
            from_bob("body")
        ),
    );

    let gw = Gateway::start(&up.url(), dir.path(), &sealed).await;
    for (key, who) in [(&alice, "Bearer alice"), (&bob, "Bearer bob")] {
        let retry = http.post(&gw.url(MARKER), key, body, &as_(who)).await;
        assert_eq!(retry.status, 500, "{who}: {retry:?}");
        assert_eq!(
            retry.problem_type(),
            "https://idem.dev/problems/replay-unavailable"
        );
        assert_ne!(retry.body, bobs.body);
    }
    assert!(gw.logs().contains("not sealed"), "{}", gw.logs());
    gw.terminate().await;

    // The migration setting reads plain answers while they age out.
    let mut migrating = sealed.clone();
    migrating.push("--read-unsealed-records");
    let gw = Gateway::start(&up.url(), dir.path(), &migrating).await;
    let replay = http
        .post(&gw.url(MARKER), &bob, body, &as_("Bearer bob"))
        .await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, bobs.body);
    gw.terminate().await;
    assert_eq!(up.started(&alice), 1, "alice's request never ran again");
    assert_eq!(up.started(&bob), 1, "bob's request never ran again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsealed_answer_in_a_sealed_sqlite_row_is_refused() {
    an_unsealed_answer_in_a_sealed_store_is_refused("sqlite://idem.db", "idem_records", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsealed_answer_in_a_sealed_postgres_row_is_refused() {
    let Some(url) = crate::shared::postgres().await else {
        return;
    };
    let args = crate::shared::on_shared(&url, &[]);
    an_unsealed_answer_in_a_sealed_store_is_refused(&url, "idem_blackbox_records", &args[2..])
        .await;
}
