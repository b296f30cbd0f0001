//! Two independent processes, each with its own `RedisStore` and connection, race on
//! the same keys: every key is acquired exactly once, and every other duplicate sees
//! that winner's attempt (in progress, or its recorded answer).
//!
//! The test binary runs itself twice as a child process (`race_worker`, ignored when
//! run directly); the parent releases both at once and checks what they report against
//! what Redis holds.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{RecordState, Reservation, ReserveRequest, Store, StoredResponse, Tenant};
use idem_redis::RedisStore;
use idem_test_support::scope;
use idem_test_support::service_unavailable;
use idem_test_support::services::redis_url;

const KEYS: usize = 1_000;
const PROCESSES: usize = 2;
const DUPLICATES_PER_PROCESS: usize = 4;
/// How long the parent waits for any one line from a child before it gives up.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);

fn answer(worker: &str, i: usize) -> String {
    format!("worker {worker} executed key {i}")
}

/// Kills the child when the test ends early, so no worker outlives it.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_processes_race_each_key_wins_exactly_once() {
    race(redis_url(), "Redis", Duration::from_secs(5));
}

/// The same race on a Redis Cluster: the records spread over its masters.
#[test]
fn two_processes_race_on_a_cluster_each_key_wins_exactly_once() {
    match idem_test_support::redis_cluster_url() {
        // The cluster client bounds each request's whole stay in its queue too, and
        // 4 000 at once wait there longer than on one connection.
        Ok(url) => race(url, "Redis Cluster", Duration::from_secs(30)),
        Err(e) => service_unavailable::<()>("Redis Cluster", "127.0.0.1", &e).unwrap_or(()),
    }
}

/// Runs one race at a time: four worker processes at once would race the machine, not
/// each other, and turn a slow answer into a timeout.
static ONE_RACE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn race(url: String, service: &str, timeout: Duration) {
    let _one = ONE_RACE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let prefix = format!("idem-test:{}:", unique_namespace("cross_instance"));
    let verifier = match rt.block_on(
        RedisStore::builder()
            .key_prefix(&prefix)
            .timeout(Duration::from_secs(5))
            .connect(&url),
    ) {
        Ok(store) => store,
        Err(e) => return service_unavailable::<()>(service, &url, &e).unwrap_or(()),
    };
    let tenant = format!("race-tenant-{}", unique_namespace("t"));

    let (lines_tx, lines_rx) = mpsc::channel::<(usize, String)>();
    let mut workers = Vec::new();
    for id in 0..PROCESSES {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["race_worker", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env("IDEM_RACE_WORKER", id.to_string())
            .env("IDEM_RACE_PREFIX", &prefix)
            .env("IDEM_RACE_TENANT", &tenant)
            .env("IDEM_TEST_REDIS_URL", &url)
            .env("IDEM_RACE_TIMEOUT_S", timeout.as_secs().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn worker process");
        let stdout = child.stdout.take().expect("stdout");
        let tx = lines_tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest may have printed `test race_worker ... ` on the same line.
                if let Some(at) = line.find("race:")
                    && tx.send((id, line[at + 5..].to_owned())).is_err()
                {
                    break;
                }
            }
            let _ = tx.send((id, "eof".to_owned()));
        });
        workers.push(Worker(child));
    }
    drop(lines_tx);
    let next = || {
        lines_rx
            .recv_timeout(CHILD_DEADLINE)
            .expect("a worker went silent")
    };

    // Both connected and waiting: release them together.
    for _ in 0..PROCESSES {
        let (id, line) = next();
        assert_eq!(line, "ready", "worker {id}");
    }
    for w in &mut workers {
        writeln!(w.0.stdin.as_mut().expect("stdin"), "go").expect("release worker");
    }

    let mut winners: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
    let mut replays: Vec<(usize, usize, String)> = Vec::new();
    let mut in_progress = [0usize; PROCESSES];
    let mut outcomes = 0;
    let mut finished = 0;
    while finished < PROCESSES {
        let (id, line) = next();
        let mut parts = line.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("won"), Some(i), Some(token)) => {
                let i: usize = i.parse().expect("key index");
                winners
                    .entry(i)
                    .or_default()
                    .push((id, token.parse().expect("token")));
                outcomes += 1;
            }
            (Some("replay"), Some(i), Some(body)) => {
                replays.push((id, i.parse().expect("key index"), body.to_owned()));
                outcomes += 1;
            }
            (Some("busy"), Some(n), None) => {
                in_progress[id] = n.parse().expect("count");
                outcomes += in_progress[id];
            }
            (Some("eof"), None, None) => finished += 1,
            _ => panic!("worker {id} said {line:?}"),
        }
    }
    for mut w in workers.drain(..) {
        let status = w.0.wait().expect("worker exit");
        assert!(status.success(), "a worker failed: {status}");
    }

    assert_eq!(outcomes, KEYS * PROCESSES * DUPLICATES_PER_PROCESS);
    for i in 0..KEYS {
        let won = winners.get(&i).map_or(&[][..], Vec::as_slice);
        assert_eq!(won.len(), 1, "key {i} was acquired {} times", won.len());
    }
    for (id, i, body) in &replays {
        let (winner, _) = winners[i][0];
        assert_eq!(
            body,
            &answer(&winner.to_string(), *i),
            "worker {id} replayed key {i}"
        );
    }

    // What Redis holds agrees: one completed first attempt per key, by the winner.
    rt.block_on(async {
        for i in 0..KEYS {
            let (winner, token) = winners[&i][0];
            let record = verifier
                .get(&scope(
                    Tenant::new(&tenant),
                    "/v1/race",
                    &format!("race-{i}"),
                ))
                .await
                .expect("get")
                .expect("record stored");
            assert_eq!(record.attempt, 1);
            assert_eq!(record.token.as_u64(), token, "key {i}");
            match record.state {
                RecordState::Completed { response, .. } => {
                    assert_eq!(
                        response,
                        StoredResponse::new(200, answer(&winner.to_string(), i))
                    )
                }
                other => panic!("key {i} left {other:?}"),
            }
        }
        for i in 0..KEYS {
            verifier
                .remove(&scope(
                    Tenant::new(&tenant),
                    "/v1/race",
                    &format!("race-{i}"),
                ))
                .await
                .expect("clean up");
        }
    });

    let per_worker: Vec<usize> = (0..PROCESSES)
        .map(|id| winners.values().filter(|w| w[0].0 == id).count())
        .collect();
    eprintln!(
        "cross-instance race: {KEYS} keys x {} duplicates; wins per process {per_worker:?}, \
         duplicates that saw in progress {in_progress:?}, replays {}",
        PROCESSES * DUPLICATES_PER_PROCESS,
        replays.len()
    );
}

/// One racing process: started by the test above, which sets `IDEM_RACE_*`.
#[test]
#[ignore = "a child process of the race tests above"]
fn race_worker() {
    let (Ok(worker), Ok(prefix), Ok(tenant)) = (
        std::env::var("IDEM_RACE_WORKER"),
        std::env::var("IDEM_RACE_PREFIX"),
        std::env::var("IDEM_RACE_TENANT"),
    ) else {
        eprintln!("race_worker runs only as a child of the cross-instance test");
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let store = Arc::new(
        rt.block_on(
            RedisStore::builder()
                .key_prefix(prefix)
                .timeout(Duration::from_secs(
                    std::env::var("IDEM_RACE_TIMEOUT_S").map_or(5, |s| s.parse().unwrap()),
                ))
                .connect(&redis_url()),
        )
        .expect("worker connects"),
    );
    println!("race:ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("wait for go");
    assert_eq!(go.trim(), "go");

    let results = rt.block_on(async {
        let fingerprint = test_fingerprint(r#"{"race":true}"#);
        let mut tasks = Vec::with_capacity(KEYS * DUPLICATES_PER_PROCESS);
        for i in 0..KEYS {
            for _ in 0..DUPLICATES_PER_PROCESS {
                let store = store.clone();
                let worker = worker.clone();
                let req = ReserveRequest::new(
                    scope(Tenant::new(&tenant), "/v1/race", &format!("race-{i}")),
                    fingerprint,
                );
                tasks.push(tokio::spawn(async move {
                    let outcome = store.reserve(&req).await.expect("reserve");
                    if let Reservation::Acquired(lease) = &outcome {
                        store
                            .complete(lease, &StoredResponse::new(200, answer(&worker, i)))
                            .await
                            .expect("complete");
                    }
                    (i, outcome)
                }));
            }
        }
        let mut results = Vec::with_capacity(tasks.len());
        for t in tasks {
            results.push(t.await.expect("task"));
        }
        results
    });

    let mut busy = 0;
    let mut out = std::io::stdout().lock();
    for (i, outcome) in results {
        match outcome {
            Reservation::Acquired(lease) => {
                writeln!(out, "race:won {i} {}", lease.token.as_u64()).expect("report")
            }
            Reservation::Replay(r) => writeln!(
                out,
                "race:replay {i} {}",
                String::from_utf8(r.body.to_vec()).expect("text body")
            )
            .expect("report"),
            Reservation::InProgress { .. } => busy += 1,
            Reservation::Mismatch => panic!("key {i}: same payload reported as mismatch"),
            Reservation::Gone { .. } => panic!("key {i}: a fresh key reported as gone"),
        }
    }
    writeln!(out, "race:busy {busy}").expect("report");
    out.flush().expect("flush");
}
