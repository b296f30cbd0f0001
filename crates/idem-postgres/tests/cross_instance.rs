//! Two instances, each its own process with its own pool, race 1,000 keys with 8
//! duplicates per key: every key is acquired exactly once across both.
//!
//! The test re-runs its own binary twice as the instances (the ignored test
//! `cross_instance_child`, selected by an environment variable), starts both at once,
//! and tallies what they report.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{FencingToken, RecordState, Reservation, ReserveRequest, Store, Tenant};
use idem_postgres::PgStore;
use idem_test_support::scope;

const KEYS: usize = 1_000;
const DUPLICATES: usize = 8;
const INSTANCES: usize = 2;
const CALLERS_PER_INSTANCE: usize = 32;
const CHILD_TABLE: &str = "IDEM_PG_CROSS_CHILD_TABLE";
const CHILD_TENANT: &str = "IDEM_PG_CROSS_CHILD_TENANT";
const LINE: &str = "IDEM-CHILD";

/// A child process that is killed if the test ends before it does.
struct Instance {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Instance {
    fn spawn(table: &str, tenant: &str) -> Instance {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "cross_instance_child",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(CHILD_TABLE, table)
            .env(CHILD_TENANT, tenant)
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn instance");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Instance {
            child,
            stdin,
            stdout,
        }
    }

    /// The next line the instance reports, without its prefix.
    fn next_report(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("read instance");
            assert!(n > 0, "instance exited before reporting");
            // The harness may print "test cross_instance_child ... " before it.
            if let Some(at) = line.find(LINE) {
                return line[at + LINE.len()..].trim().to_owned();
            }
        }
    }

    fn go(&mut self) {
        let mut stdin = self.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("start instance");
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_instance_each_key_wins_exactly_once() {
    let Some(store) = common::connect(PgStore::builder(), &unique_namespace("cross")).await else {
        return;
    };
    let tenant = format!("cross-{:016x}", FencingToken::generate().as_u64());
    let mut instances: Vec<Instance> = (0..INSTANCES)
        .map(|_| Instance::spawn(store.table(), &tenant))
        .collect();
    for i in &mut instances {
        assert_eq!(i.next_report(), "ready");
    }
    for i in &mut instances {
        i.go();
    }
    // key -> the winners' tokens; and how many duplicates saw it in progress.
    let mut winners: HashMap<usize, Vec<i64>> = HashMap::new();
    let mut busy = 0;
    let mut wins_per_instance = Vec::new();
    for i in &mut instances {
        let mut wins = 0;
        loop {
            let report = i.next_report();
            let mut words = report.split_whitespace();
            match words.next() {
                Some("won") => {
                    let key: usize = words.next().expect("key").parse().expect("key");
                    let token: i64 = words.next().expect("token").parse().expect("token");
                    winners.entry(key).or_default().push(token);
                    wins += 1;
                }
                Some("done") => {
                    busy += words.next().expect("busy").parse::<usize>().expect("busy");
                    break;
                }
                _ => panic!("instance reported {report:?}"),
            }
        }
        wins_per_instance.push(wins);
        let status = i.child.wait().expect("instance exit");
        assert!(status.success(), "instance failed: {status}");
    }
    eprintln!("keys won per instance: {wins_per_instance:?}");
    assert_eq!(winners.len(), KEYS, "every key was won");
    for (key, tokens) in &winners {
        assert_eq!(tokens.len(), 1, "key {key} was won {} times", tokens.len());
    }
    assert_eq!(
        busy,
        KEYS * (DUPLICATES - 1),
        "every other duplicate saw the key in progress"
    );
    // The stored rows are the winners' attempts.
    for (key, tokens) in &winners {
        let record = store
            .get(&scope(
                Tenant::new(&tenant),
                "/v1/race",
                &format!("key-{}", *key),
            ))
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(record.token, FencingToken::from_i64(tokens[0]));
        assert_eq!(record.attempt, 1);
        assert!(matches!(record.state, RecordState::InProgress { .. }));
    }
}

/// One instance of the race above; runs only when that test starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an instance process of cross_instance_each_key_wins_exactly_once"]
async fn cross_instance_child() {
    let table = std::env::var(CHILD_TABLE).expect("started by the cross-instance test");
    let tenant = std::env::var(CHILD_TENANT).expect("started by the cross-instance test");
    let store = PgStore::builder()
        .table(table)
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .operation_timeout(Duration::from_secs(60))
        .migrate(false)
        .connect(&common::pg_url())
        .await
        .expect("instance connects");
    // Open the pool's connections before the start line, so both instances race on
    // statements, not on connecting.
    let warm: Vec<_> = futures_warmup(&store).await;
    drop(warm);
    println!("{LINE} ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("start line");

    // Each instance sends DUPLICATES / INSTANCES copies of every key; both walk the
    // keys in the same order, so a key's copies from both are in flight together.
    let per_instance = DUPLICATES / INSTANCES;
    let jobs: Arc<Vec<usize>> = Arc::new(
        (0..KEYS)
            .flat_map(|k| std::iter::repeat_n(k, per_instance))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let fingerprint = test_fingerprint(r#"{"amount":100}"#);
    let callers: Vec<_> = (0..CALLERS_PER_INSTANCE)
        .map(|_| {
            let (store, jobs, next, tenant) =
                (store.clone(), jobs.clone(), next.clone(), tenant.clone());
            tokio::spawn(async move {
                let mut won = Vec::new();
                let mut busy = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&key) = jobs.get(i) else {
                        return (won, busy);
                    };
                    let req = ReserveRequest::new(
                        scope(Tenant::new(&tenant), "/v1/race", &format!("key-{}", key)),
                        fingerprint,
                    );
                    match store.reserve(&req).await.expect("reserve") {
                        Reservation::Acquired(lease) => won.push((key, lease.token.as_i64())),
                        Reservation::InProgress { .. } => busy += 1,
                        other => panic!("unexpected {other:?}"),
                    }
                }
            })
        })
        .collect();
    let mut busy = 0;
    for c in callers {
        let (won, b) = c.await.expect("caller");
        for (key, token) in won {
            println!("{LINE} won {key} {token}");
        }
        busy += b;
    }
    println!("{LINE} done {busy}");
}

/// Holds the pool's connections open at once, then lets them go back to the pool.
async fn futures_warmup(store: &PgStore) -> Vec<sqlx::pool::PoolConnection<sqlx::Postgres>> {
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(store.pool().acquire().await.expect("connection"));
    }
    held
}
