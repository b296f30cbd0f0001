//! Each store under each nemesis, at the size `.ci/run` runs (one seed per store, one
//! fault per nemesis), and the longer run by hand.
//!
//! What the checker must find, and what it may (each documented, with its bound, in
//! the `idem-nemesis` README):
//!
//! - never a silent double execution, a silently changed answer or an unfinished key,
//!   but where a failover loses writes Redis had not yet replicated (`redis` without
//!   `?wait=1`): a reservation or a completion lost with its master lets a retry
//!   execute again as a first attempt, and its client may then get that execution's
//!   answer (a change, silent, on that same key and no other);
//! - a double execution listed in the feed where a fault outlasted the lease (a pause,
//!   a partition, a kill), and the paused attempt's own answer reaching its client
//!   (a listed change);
//! - an acknowledged key executed again (`lost`) only where the store could not record
//!   the answer the client got for longer than the lease: listed in the feed.

use idem_nemesis::{Config, Nemesis, Phase, StoreKind, Unavailable, Violation, run};
use idem_test_support::{service_unavailable, services_required};

use crate::binary;

/// The seed of a store's run: `IDEM_NEMESIS_SEED` when set, else fixed per store.
fn seed(kind: StoreKind) -> u64 {
    std::env::var("IDEM_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1d3a_0000 + kind as u64)
}

/// Runs `config`; `None` (said loudly, a failure under `IDEM_REQUIRE_SERVICES=1`) when
/// this machine cannot make namespaces or start the store.
async fn phases(config: &Config) -> Option<Vec<Phase>> {
    match run(config).await {
        Ok(phases) => Some(
            phases
                .into_iter()
                .map(|p| p.unwrap_or_else(|e| panic!("{}: {e}", config.store.name())))
                .collect(),
        ),
        Err(Unavailable::Namespaces(why)) => {
            assert!(
                !services_required(),
                "network namespaces cannot be made here and IDEM_REQUIRE_SERVICES=1: {why}"
            );
            eprintln!(
                "\n*** SKIPPED: the nemesis tests need network namespaces (root and iproute2): \
                 {why} ***\n"
            );
            None
        }
        Err(Unavailable::Store(why)) => {
            service_unavailable(config.store.name(), "a private server", &why)
        }
    }
}

/// Whether `phase` may show silent doubles and losses, and changed answers on those
/// keys: Redis without `wait` loses the writes a failover's dead master had not yet
/// replicated.
fn may_lose_writes(kind: StoreKind, nemesis: Nemesis) -> bool {
    kind == StoreKind::Redis && nemesis == Nemesis::Failover
}

/// Prints the table and asserts what must hold.
fn judge(kind: StoreKind, phases: &[Phase], logs: &std::path::Path) {
    println!("{}", idem_nemesis::Report::TABLE_HEAD);
    for p in phases {
        println!("{}", p.report.row(kind.name(), p.nemesis.name()));
    }
    for p in phases {
        let r = &p.report;
        let what = format!(
            "{} under {}: {r}\n(gateway logs in {})",
            kind.name(),
            p.nemesis.name(),
            logs.display()
        );
        assert_eq!(r.unfinished, 0, "{what}");
        if may_lose_writes(kind, p.nemesis) {
            // A lost write re-executes its key: a change is allowed only there.
            let doubled = |key: &str| {
                r.findings
                    .iter()
                    .any(|f| f.violation == Violation::SilentDouble && f.key == key)
            };
            for f in &r.findings {
                if f.violation == Violation::ChangedAnswer {
                    assert!(doubled(&f.key), "a change without a lost write: {what}");
                }
            }
        } else {
            assert_eq!(r.changed_silent, 0, "{what}");
            assert_eq!(r.doubles_silent, 0, "{what}");
            assert_eq!(r.lost, 0, "{what}");
        }
        assert!(r.executions >= r.keys, "{what}");
    }
}

async fn every_nemesis(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let config = Config::small(binary(), kind, seed(kind), logs.clone());
    let Some(phases) = phases(&config).await else {
        return;
    };
    judge(kind, &phases, &logs);
    // Kept on failure for a person to read; removed when every assertion held.
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_under_every_nemesis() {
    every_nemesis(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_under_every_nemesis() {
    every_nemesis(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_with_wait_under_every_nemesis() {
    every_nemesis(StoreKind::RedisWait).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_under_every_nemesis() {
    every_nemesis(StoreKind::RedisCluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_under_every_nemesis() {
    every_nemesis(StoreKind::MySql).await;
}

/// The longer run, by hand: `IDEM_NEMESIS_KEYS` keys per phase (default 200),
/// `IDEM_NEMESIS_CYCLES` faults per phase (default 3), `IDEM_NEMESIS_SEED`,
/// `IDEM_NEMESIS_STORES` (names, comma-separated; default all) and `IDEM_NEMESIS`
/// (nemesis names; default all). Prints one table; asserts nothing but that it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the longer run, by hand (see the idem-nemesis README)"]
async fn long_run() {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let number =
        |name: &str, default: usize| env(name).and_then(|v| v.parse().ok()).unwrap_or(default);
    let stores: Vec<StoreKind> = match env("IDEM_NEMESIS_STORES") {
        Some(names) => names
            .split(',')
            .map(|n| {
                *StoreKind::ALL
                    .iter()
                    .find(|k| k.name() == n.trim())
                    .unwrap_or_else(|| panic!("no store {n}"))
            })
            .collect(),
        None => StoreKind::ALL.to_vec(),
    };
    let nemeses: Vec<Nemesis> = match env("IDEM_NEMESIS") {
        Some(names) => names
            .split(',')
            .map(|n| Nemesis::named(n.trim()).unwrap_or_else(|| panic!("no nemesis {n}")))
            .collect(),
        None => Nemesis::ALL.to_vec(),
    };
    let mut rows = Vec::new();
    for kind in stores {
        // Kept for a person to read: the gateways' logs of a long run.
        let dir = tempfile::tempdir().unwrap().keep();
        eprintln!(
            "{}: the gateways' logs are in {}",
            kind.name(),
            dir.display()
        );
        let mut config = Config::small(binary(), kind, seed(kind), dir.join("logs"));
        config.keys = number("IDEM_NEMESIS_KEYS", 200);
        config.cycles = number("IDEM_NEMESIS_CYCLES", 3);
        config.nemeses = nemeses.clone();
        let Some(phases) = phases(&config).await else {
            return;
        };
        for p in &phases {
            let row = p.report.row(kind.name(), p.nemesis.name());
            eprintln!("{row}\n  {}", p.report);
            rows.push(row);
        }
    }
    println!("{}", idem_nemesis::Report::TABLE_HEAD);
    for row in rows {
        println!("{row}");
    }
}

/// A Redis failover's phase whose findings are `findings` (violation, key).
fn failover_phase(findings: &[(Violation, &str)]) -> Phase {
    let count = |v: Violation| findings.iter().filter(|(f, _)| *f == v).count();
    Phase {
        nemesis: Nemesis::Failover,
        report: idem_nemesis::Report {
            keys: 2,
            operations: 6,
            executions: 3,
            doubles_silent: count(Violation::SilentDouble),
            changed_silent: count(Violation::ChangedAnswer),
            lost: count(Violation::Lost),
            findings: findings
                .iter()
                .map(|(violation, key)| idem_nemesis::Finding {
                    violation: *violation,
                    key: (*key).to_owned(),
                    detail: String::new(),
                })
                .collect(),
            ..Default::default()
        },
        history: Default::default(),
    }
}

#[test]
fn a_write_redis_lost_in_a_failover_may_change_its_own_keys_answer() {
    let lost_write = [
        (Violation::SilentDouble, "k1"),
        (Violation::ChangedAnswer, "k1"),
        (Violation::Lost, "k1"),
    ];
    judge(
        StoreKind::Redis,
        &[failover_phase(&lost_write)],
        std::path::Path::new("-"),
    );
}

#[test]
#[should_panic(expected = "a change without a lost write")]
fn a_changed_answer_on_a_key_no_lost_write_touched_fails_even_there() {
    let findings = [
        (Violation::SilentDouble, "k1"),
        (Violation::ChangedAnswer, "k2"),
    ];
    judge(
        StoreKind::Redis,
        &[failover_phase(&findings)],
        std::path::Path::new("-"),
    );
}

#[test]
#[should_panic]
fn with_wait_a_silent_double_fails_a_failover() {
    judge(
        StoreKind::RedisWait,
        &[failover_phase(&[(Violation::SilentDouble, "k1")])],
        std::path::Path::new("-"),
    );
}
