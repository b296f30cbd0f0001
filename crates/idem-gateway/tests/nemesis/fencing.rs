//! The fencing token is what stops a paused gateway from overwriting the next attempt's
//! record (SPEC S7): gateway A is stopped (`SIGSTOP`) while its attempt runs, longer
//! than its lease; gateway B takes the key over and records its own answer; A wakes up,
//! its upstream call returns, and its late completion is refused. A's client, and every
//! replay through either gateway, gets B's answer; the feed lists the key as taken over.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use idem_nemesis::client::{self, Send};
use idem_nemesis::upstream::Upstream;
use idem_nemesis::{Outcome, Recorder};
use idem_test_support::service_unavailable;
use idem_test_support::services::{postgres_url, redis_url};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::binary;

const LEASE: &str = "1s";

/// A gateway on 127.0.0.1 with its admin listener; killed on drop.
struct Gateway {
    child: Child,
    addr: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    log: std::path::PathBuf,
}

impl Gateway {
    async fn start(
        upstream: std::net::SocketAddr,
        store: &str,
        namespace: &str,
        dir: &Path,
        n: usize,
    ) -> Gateway {
        let log = dir.join(format!("gateway-{n}.log"));
        let mut cmd = Command::new(binary());
        cmd.arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(["--upstream", &format!("http://{upstream}")])
            .args([
                "--store",
                store,
                "--store-namespace",
                namespace,
                "--ttl",
                "2m",
            ])
            .args(["--lease", LEASE])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("IDEM_") {
                cmd.env_remove(k);
            }
        }
        // The record listing the test reads is closed without an admin token.
        cmd.env("IDEM_ADMIN_TOKEN", idem_nemesis::gateway::ADMIN_TOKEN);
        cmd.env("IDEM_LOG", "info");
        let mut child = cmd.spawn().expect("the idem binary starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut addr, mut admin) = (None, None);
        let read = async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(a) = line.strip_prefix("idem listening on http://") {
                    addr = Some(a.parse().unwrap());
                } else if let Some(a) = line.strip_prefix("idem admin on http://") {
                    admin = Some(a.parse().unwrap());
                }
                if addr.is_some() && admin.is_some() {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the gateway did not start:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        Gateway {
            child,
            addr: addr.expect("listening"),
            admin: admin.expect("an admin listener"),
            log,
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running").to_string();
        assert!(
            std::process::Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// One request of `key` through `addr`, recorded, waiting up to 30 s for its answer.
async fn post(
    recorder: &Recorder,
    gateway: usize,
    addr: std::net::SocketAddr,
    key: &str,
    delay_ms: u64,
) -> (u16, String, bool) {
    let outcome = client::send(
        recorder,
        Send {
            gateway,
            addr,
            key,
            body: r#"{"amount":1}"#,
            delay_ms,
            hang_up: None,
            timeout: Duration::from_secs(30),
        },
    )
    .await;
    match outcome {
        Outcome::Answer {
            status,
            body,
            replayed,
        } => (
            status,
            String::from_utf8_lossy(&body).into_owned(),
            replayed,
        ),
        Outcome::Lost => panic!("no answer for {key} through gateway {gateway}"),
    }
}

async fn a_paused_gateways_late_completion_is_refused(store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Recorder::new();
    let up = Upstream::start(recorder.clone()).await.unwrap();
    // Apart from any gateway a developer runs on the same server; the keys are new.
    let namespace = "idem_nemesis_fencing";
    let a = Gateway::start(up.addr(), store, namespace, dir.path(), 0).await;
    let b = Gateway::start(up.addr(), store, namespace, dir.path(), 1).await;
    let key = format!("fenced-{}", uuid::Uuid::new_v4());

    // A's attempt reaches the upstream, which takes 3 s to answer; A stops meanwhile.
    let first = {
        let (recorder, key) = (recorder.clone(), key.clone());
        let addr = a.addr;
        tokio::spawn(async move { post(&recorder, 0, addr, &key, 3000).await })
    };
    idem_test_support::eventually(
        "A's attempt reached the upstream",
        idem_test_support::WAIT,
        async || recorder.executions_so_far() == 1,
    )
    .await;
    a.signal("-STOP");

    // B takes the key over once A's lease lapses (409 until then), as attempt 2.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let taken_over = loop {
        let answer = post(&recorder, 1, b.addr, &key, 0).await;
        if answer.0 != 409 {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "B never took the key over"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(taken_over.0, 201, "{taken_over:?}");
    assert!(!taken_over.2, "B executed it: {taken_over:?}");
    assert!(taken_over.1.contains(r#""attempt":2"#), "{taken_over:?}");

    // A wakes up; its upstream call has long returned; its completion is fenced, and
    // its client gets the key's answer, B's, replayed: not its own, which the record
    // contradicts.
    a.signal("-CONT");
    let late = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("A answers")
        .unwrap();
    assert_eq!(
        (late.0, late.1.as_str(), late.2),
        (201, taken_over.1.as_str(), true),
        "{late:?}"
    );
    idem_test_support::eventually(
        "A says its answer was not recorded",
        idem_test_support::WAIT,
        async || {
            a.logs()
                .contains("the record was taken over before this attempt finished")
        },
    )
    .await;

    // The record is B's: every replay, through either gateway, is B's answer.
    for (g, addr) in [(0, a.addr), (1, b.addr)] {
        let replay = post(&recorder, g, addr, &key, 0).await;
        assert_eq!(
            (replay.0, replay.1.as_str(), replay.2),
            (201, taken_over.1.as_str(), true),
            "through gateway {g}"
        );
    }
    let executions: Vec<Option<u32>> = recorder
        .history(std::slice::from_ref(&key))
        .executions
        .iter()
        .map(|e| e.attempt)
        .collect();
    assert_eq!(executions, [Some(1), Some(2)]);
    let (status, _, body) = client::get(
        a.admin,
        "/keys?ambiguous=true&limit=1000",
        Duration::from_secs(10),
    )
    .await
    .expect("a listing");
    assert_eq!(status, 200);
    let listed: Vec<serde_json::Value> = String::from_utf8_lossy(&body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["key"] == key.as_str())
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            listed[0]["ambiguous"].as_str(),
            listed[0]["attempt"].as_u64()
        ),
        (Some("takeover"), Some(2))
    );

    // The checker calls it a listed double, and no answer changed.
    let mut history = recorder.history(std::slice::from_ref(&key));
    history.listed = vec![idem_nemesis::Listed {
        key: key.clone(),
        reason: "takeover".into(),
        attempt: 2,
    }];
    history.bound = Duration::from_secs(3600);
    let report = idem_nemesis::check(&history);
    assert!(report.clean(), "{report}");
    assert_eq!(
        (report.doubles_listed, report.changed_listed),
        (1, 0),
        "{report}"
    );
}

/// Whether the shared store at `url` can be opened; loud when not.
async fn reachable(kind: &str, url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(10), idem_gateway::store::open(url)).await {
        Ok(Ok(store)) => match store.ping().await {
            Ok(()) => true,
            Err(e) => service_unavailable::<()>(kind, url, &e).is_some(),
        },
        Ok(Err(e)) => service_unavailable::<()>(kind, url, &e).is_some(),
        Err(e) => service_unavailable::<()>(kind, url, &e).is_some(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_gateways_late_completion_is_refused_on_postgres() {
    let url = postgres_url();
    if reachable("PostgreSQL", &url).await {
        a_paused_gateways_late_completion_is_refused(&url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_gateways_late_completion_is_refused_on_redis() {
    let url = redis_url();
    if reachable("Redis", &url).await {
        a_paused_gateways_late_completion_is_refused(&url).await;
    }
}
