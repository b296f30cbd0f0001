//! The durable journal: persisted before the first attempt, resumed with the same key
//! after a crash, marked when answered, purged later. The crash test kills a real child
//! process (the `idem-client-journal` binary) after the server executed.

#![cfg(feature = "journal")]

mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use idem_client::{Client, EntryState, Error, Journal, ManualSleeper, RetryPolicy};
use idem_core::{ManualClock, SystemClock, Timestamp};
use idem_test_support::upstream::{Reply, Upstream};
use idem_test_support::{Fault, Relay};
use support::ChargeApp;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn client(max_attempts: u32) -> Client {
    Client::builder()
        .policy(RetryPolicy::default().max_attempts(max_attempts))
        .sleeper(ManualSleeper::new(ManualClock::starting_now()))
        .build()
        .unwrap()
}

async fn file_journal() -> (Journal, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path().join("journal.db")).await.unwrap();
    (journal, dir)
}

#[tokio::test]
async fn persisted_operation_is_pending_until_answered() {
    let server = Upstream::scripted([Reply::status(502)]).await;
    let (journal, _dir) = file_journal().await;
    let client = client(3);

    let op = journal
        .persist(client.post(server.url_for("/v1/payouts")).body("amount=5"))
        .await
        .unwrap();
    let before = journal.entry(op.id()).await.unwrap().unwrap();
    assert_eq!(before.state, EntryState::Pending);
    assert_eq!(before.key, *op.key());
    assert_eq!(before.attempts, 0);
    assert_eq!(server.total(), 0, "persisted before the first attempt");

    let outcome = op.send().await.unwrap();

    let after = journal.entry(op.id()).await.unwrap().unwrap();
    assert_eq!(after.state, EntryState::Completed);
    assert_eq!(after.status, Some(200));
    assert_eq!(after.replayed, Some(false));
    assert_eq!(after.attempts, 2);
    assert_eq!(outcome.attempts(), 2);
    assert!(journal.pending(&client).await.unwrap().is_empty());
}

#[tokio::test]
async fn persisting_the_same_operation_twice_gives_one_entry() {
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);
    let op = client.post("http://127.0.0.1:9/v1/x").body("same");

    let a = journal.persist(op.clone()).await.unwrap();
    let b = journal.persist(op.clone()).await.unwrap();

    assert_eq!(a.id(), b.id());
    assert_eq!(journal.entries().await.unwrap().len(), 1);
}

#[tokio::test]
async fn same_key_with_another_request_is_a_journal_conflict() {
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);
    let op = client.post("http://127.0.0.1:9/v1/x").body("one");
    journal.persist(op.clone()).await.unwrap();

    let other = op.clone().body("two");
    let err = journal.persist(other).await.unwrap_err();

    assert!(
        matches!(&err, Error::JournalConflict { key } if key == op.key()),
        "{err:?}"
    );
    assert_eq!(journal.entries().await.unwrap().len(), 1);
}

#[tokio::test]
async fn credentials_are_never_written_to_the_journal() {
    let journal = Journal::in_memory().await.unwrap();
    let client = client(1);
    let mut secret = HeaderValue::from_static("sk_live_123");
    secret.set_sensitive(true);

    for op in [
        client
            .post("http://127.0.0.1:9/")
            .header("authorization", "Bearer sk_live_123"),
        client
            .post("http://127.0.0.1:9/")
            .header("cookie", "session=1"),
        client
            .post("http://127.0.0.1:9/")
            .header("x-api-key", secret),
    ] {
        let err = journal.persist(op).await.unwrap_err();
        assert!(matches!(err, Error::CredentialInJournal { .. }), "{err:?}");
    }
    assert!(journal.entries().await.unwrap().is_empty());
}

#[tokio::test]
async fn exhausted_operation_stays_pending_and_resumes_with_its_key() {
    let server = Upstream::scripted([Reply::status(503), Reply::status(503)]).await;
    let (journal, _dir) = file_journal().await;
    let op = journal
        .persist(
            client(2)
                .post(server.url_for("/v1/transfers"))
                .header("content-type", "application/json")
                .header("x-request-source", "batch-7")
                .body(r#"{"amount":12}"#),
        )
        .await
        .unwrap();

    let err = op.send().await.unwrap_err();
    assert!(err.is_retryable_later(), "{err:?}");
    let entry = journal.entry(op.id()).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Pending);
    assert_eq!(entry.attempts, 2);
    assert!(entry.last_error.unwrap().contains("gave up"));

    // A new process: a new client, the journal reopened.
    drop(journal);
    let journal = Journal::open(_dir.path().join("journal.db")).await.unwrap();
    let fresh = client(2);
    let pending = journal.pending(&fresh).await.unwrap();
    assert_eq!(pending.len(), 1);
    let resumed = &pending[0];
    assert_eq!(resumed.key(), op.key());
    assert_eq!(resumed.operation().method(), "POST");
    assert_eq!(resumed.operation().url(), server.url_for("/v1/transfers"));
    assert_eq!(
        resumed.operation().header_map(),
        op.operation().header_map()
    );
    assert_eq!(
        resumed.operation().body_bytes(),
        op.operation().body_bytes()
    );

    let outcome = resumed.send().await.unwrap();

    assert_eq!(outcome.status(), 200);
    assert_eq!(outcome.key(), op.key());
    let entry = journal.entry(op.id()).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Completed);
    assert_eq!(entry.attempts, 3);
    assert_eq!(server.total(), 3);
    assert!(
        server
            .keys()
            .iter()
            .all(|k| k.as_deref() == Some(op.key().as_str()))
    );
}

#[tokio::test]
async fn refused_operation_is_marked_failed_not_pending() {
    let server = Upstream::scripted([Reply::problem(422, "key-reused", "different payload")]).await;
    let journal = Journal::in_memory().await.unwrap();
    let client = client(3);
    let op = journal
        .persist(client.post(server.url_for("/")))
        .await
        .unwrap();

    let err = op.send().await.unwrap_err();

    assert!(matches!(err, Error::KeyReused { .. }));
    let entry = journal.entry(op.id()).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Failed);
    assert_eq!(entry.status, Some(422));
    assert!(entry.last_error.unwrap().contains("different payload"));
    assert!(journal.pending(&client).await.unwrap().is_empty());
}

#[tokio::test]
async fn purge_removes_only_finished_entries_past_the_age() {
    let server = Upstream::scripted([Reply::problem(422, "key-reused", "x")]).await;
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let journal = Journal::in_memory()
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let client = client(1);
    let failed = journal
        .persist(client.post(server.url_for("/a")))
        .await
        .unwrap();
    assert!(failed.send().await.is_err());
    let completed = journal
        .persist(client.post(server.url_for("/b")))
        .await
        .unwrap();
    completed.send().await.unwrap();
    let pending = journal
        .persist(client.post(server.url_for("/c")))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(2 * 3600));
    let recent = journal
        .persist(client.post(server.url_for("/d")))
        .await
        .unwrap();
    recent.send().await.unwrap();

    assert_eq!(
        journal
            .purge_finished(Duration::from_secs(3600), 1)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        journal
            .purge_finished(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        journal
            .purge_finished(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );

    let left: Vec<i64> = journal
        .entries()
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, [pending.id(), recent.id()]);
}

/// Kills the child when the test ends, whatever happens.
struct KillOnDrop(tokio::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_client_resumes_with_the_same_key_and_gets_the_replay() {
    let app = ChargeApp::start(false, Arc::new(SystemClock), Duration::from_secs(60)).await;
    // The first connection's answer never reaches the client: it waits until killed.
    let proxy = Relay::start(app.addr).await;
    proxy.fault_next([Fault::HoldReply]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let bin = env!("CARGO_BIN_EXE_idem-client-journal");
    let url = proxy.http_url("/v1/charges");

    let mut child = KillOnDrop(
        Command::new(bin)
            .arg("--journal")
            .arg(&path)
            .args(["send", "POST", &url, "--data", r#"{"amount":700}"#])
            .args(["--header", "content-type: application/json"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let persisted = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the child never persisted the operation")
        .unwrap()
        .unwrap();
    let key = persisted
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("key="))
        .unwrap()
        .to_owned();

    // The server executed and answered; the child is still waiting for the answer.
    proxy.wait_replies_lost(1).await;
    assert_eq!(app.runs(), 1);
    child.0.kill().await.unwrap();
    let status = child.0.wait().await.unwrap();
    assert!(!status.success(), "the child was killed, it did not finish");

    let journal = Journal::open(&path).await.unwrap();
    let entries = journal.entries().await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].state, EntryState::Pending);
    assert_eq!(entries[0].key.as_str(), key);

    // Restarted: resume what is pending. The proxy passes connections now.
    let resumed = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(bin)
            .arg("--journal")
            .arg(&path)
            .arg("resume")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the resumed child did not finish")
    .unwrap();
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(resumed.status.success(), "resume failed: {stdout}");
    assert_eq!(
        stdout.trim(),
        format!("id=1 key={key} status=201 replayed=true attempts=1")
    );

    assert_eq!(app.runs(), 1, "the handler ran once across both processes");
    let entry = journal.entry(1).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Completed);
    assert_eq!(entry.status, Some(201));
    assert_eq!(entry.replayed, Some(true));
}

/// The journal's files hold request bodies and keys: its database, `-wal` and `-shm` are
/// created readable by their owner only, whatever the umask, and an existing file keeps
/// the mode its owner gave it (SPEC S14).
#[cfg(unix)]
#[tokio::test]
async fn journal_files_are_0600_and_an_existing_file_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("existing.db");
    std::fs::File::create(&existing).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o640)).unwrap();
    let client = client(1);
    for (db, want) in [(dir.path().join("fresh.db"), 0o600), (existing, 0o640)] {
        let journal = Journal::open(&db).await.unwrap();
        journal
            .persist(
                client
                    .post("http://127.0.0.1:1/v1/payouts")
                    .body("amount=5"),
            )
            .await
            .unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let mut file = db.clone().into_os_string();
            file.push(suffix);
            let file = std::path::PathBuf::from(file);
            assert_eq!(mode(&file), want, "{}", file.display());
        }
    }
}
