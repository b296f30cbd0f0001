//! A consumer process killed with SIGKILL mid-message (SPEC S12): the broker redelivers
//! the message, and the inbox skips it if the first attempt had committed, or applies
//! it once if it had not.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;

use common::TestStream;
use idem_inbox::Publisher;
use sqlx::AssertSqlSafe;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const CHILD: &str = env!("CARGO_BIN_EXE_idem-inbox-crash-consumer");
const MESSAGES: [(&str, &str); 3] = [("m-1", "alice 10"), ("m-2", "bob 20"), ("m-3", "carol 30")];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Db {
    Sqlite,
    Postgres,
}

/// One crash scenario's fixtures: the stream, the database and its table names.
struct Scenario {
    stream: TestStream,
    database: String,
    table: String,
    ledger: String,
    pg: Option<sqlx::PgPool>,
    sqlite_path: Option<std::path::PathBuf>,
    _dir: tempfile::TempDir,
}

impl Scenario {
    async fn new(case: &str, db: Db) -> Option<Scenario> {
        let (_, js) = common::nats().await?;
        let dir = tempfile::tempdir().unwrap();
        let pg = match db {
            Db::Postgres => Some(common::pg_pool(4).await?),
            Db::Sqlite => None,
        };
        // A 1 s ack wait makes the redelivery of the killed consumer's messages quick.
        let stream = TestStream::create(&js, case, Duration::from_secs(1), 20).await;
        let publisher = Publisher::new(js);
        for (id, payload) in MESSAGES {
            publisher
                .publish(stream.subject.clone(), id, payload.into())
                .await
                .unwrap();
        }
        let ns = stream.name.to_ascii_lowercase();
        let sqlite_path = dir.path().join("ledger.db");
        let database = match db {
            Db::Sqlite => format!("sqlite:{}", sqlite_path.display()),
            Db::Postgres => common::pg_url(),
        };
        Some(Scenario {
            stream,
            database,
            table: format!("{ns}_processed"),
            ledger: format!("{ns}_ledger"),
            pg,
            sqlite_path: (db == Db::Sqlite).then_some(sqlite_path),
            _dir: dir,
        })
    }

    fn spawn(&self, crash: Option<&str>) -> Child {
        let mut cmd = Command::new(CHILD);
        cmd.env("IDEM_INBOX_DATABASE", &self.database)
            .env("IDEM_INBOX_TABLE", &self.table)
            .env("IDEM_INBOX_LEDGER", &self.ledger)
            .env("IDEM_INBOX_NATS", common::nats_url())
            .env("IDEM_INBOX_STREAM", &self.stream.name)
            .env("IDEM_INBOX_CONSUMER", &self.stream.consumer)
            .env("IDEM_INBOX_DEADLINE_SECS", "60")
            .env_remove("IDEM_INBOX_CRASH")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(mode) = crash {
            cmd.env("IDEM_INBOX_CRASH", mode);
        }
        cmd.spawn().expect("spawn the consumer child")
    }

    /// The ledger's `(message_id, amount)` rows, read from outside the child.
    async fn ledger_rows(&self) -> Vec<(String, i64)> {
        let sql = format!(
            "SELECT message_id, amount FROM {} ORDER BY message_id",
            self.ledger
        );
        if let Some(pool) = &self.pg {
            sqlx::query_as(AssertSqlSafe(sql))
                .fetch_all(pool)
                .await
                .unwrap()
        } else {
            let path = self.sqlite_path.as_ref().unwrap();
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            let rows = sqlx::query_as(AssertSqlSafe(sql))
                .fetch_all(&pool)
                .await
                .unwrap();
            pool.close().await;
            rows
        }
    }

    async fn cleanup(self) {
        self.stream.delete().await;
        if let Some(pool) = &self.pg {
            let sql = format!("DROP TABLE IF EXISTS {}, {}", self.table, self.ledger);
            sqlx::query(AssertSqlSafe(sql)).execute(pool).await.unwrap();
        }
    }
}

/// Reads the child's stdout until a line starting with `prefix`, bounded.
async fn read_line_starting(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with(prefix) {
                return Some(line);
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| panic!("no {prefix:?} line from the child within 60 s"));
    found.unwrap_or_else(|| panic!("the child exited without a {prefix:?} line"))
}

/// Kills the child with SIGKILL at its crash point.
async fn kill_nine(mut child: Child) {
    child.kill().await.unwrap(); // SIGKILL on Unix
    let status = child.wait().await.unwrap();
    assert_eq!(status.signal(), Some(9), "{status:?}");
}

/// Runs a clean consumer to the end and returns its `(processed, duplicates)`.
async fn recover(s: &Scenario) -> (u64, u64) {
    let mut child = s.spawn(None);
    let done = read_line_starting(&mut child, "DONE").await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let field = |name: &str| -> u64 {
        done.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{name} in {done:?}"))
            .parse()
            .unwrap()
    };
    (field("processed"), field("duplicates"))
}

fn all_applied_once() -> Vec<(String, i64)> {
    vec![
        ("m-1".to_owned(), 10),
        ("m-2".to_owned(), 20),
        ("m-3".to_owned(), 30),
    ]
}

async fn killed_after_commit_before_ack(db: Db) {
    let Some(s) = Scenario::new("after_commit", db).await else {
        return;
    };
    let mut child = s.spawn(Some("after-commit"));
    let line = read_line_starting(&mut child, "CRASH-POINT").await;
    assert_eq!(line, "CRASH-POINT after-commit m-1");
    assert_eq!(
        s.ledger_rows().await,
        vec![("m-1".to_owned(), 10)],
        "committed"
    );
    kill_nine(child).await;

    // m-1 comes back (it was never acked) and is skipped; m-2 and m-3 are applied.
    let (processed, duplicates) = recover(&s).await;
    assert_eq!((processed, duplicates), (2, 1));
    assert_eq!(s.ledger_rows().await, all_applied_once());
    s.cleanup().await;
}

async fn killed_before_commit(db: Db) {
    let Some(s) = Scenario::new("before_commit", db).await else {
        return;
    };
    let mut child = s.spawn(Some("before-commit"));
    let line = read_line_starting(&mut child, "CRASH-POINT").await;
    assert_eq!(line, "CRASH-POINT before-commit m-1");
    assert_eq!(s.ledger_rows().await, vec![], "written but not committed");
    kill_nine(child).await;
    assert_eq!(s.ledger_rows().await, vec![], "the kill rolled it back");

    // m-1 comes back and, never having committed, is applied once now.
    let (processed, duplicates) = recover(&s).await;
    assert_eq!((processed, duplicates), (3, 0));
    assert_eq!(s.ledger_rows().await, all_applied_once());
    s.cleanup().await;
}

#[tokio::test]
async fn sqlite_consumer_killed_after_commit_before_ack_skips_the_redelivery() {
    killed_after_commit_before_ack(Db::Sqlite).await;
}

#[tokio::test]
async fn sqlite_consumer_killed_before_commit_applies_the_redelivery_once() {
    killed_before_commit(Db::Sqlite).await;
}

#[tokio::test]
async fn postgres_consumer_killed_after_commit_before_ack_skips_the_redelivery() {
    killed_after_commit_before_ack(Db::Postgres).await;
}

#[tokio::test]
async fn postgres_consumer_killed_before_commit_applies_the_redelivery_once() {
    killed_before_commit(Db::Postgres).await;
}
