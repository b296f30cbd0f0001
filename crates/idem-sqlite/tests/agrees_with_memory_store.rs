//! The upsert's WHERE must say what `idem_core::decide` says. MemoryStore decides with
//! `decide` itself, so both stores are driven through the same random histories on one
//! clock and must answer alike at every step.

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::test_fingerprint;
use idem_core::{
    Endpoint, FencingToken, Key, Lease, ManualClock, MemoryStore, Record, Reservation,
    ReserveRequest, Scope, ScopeMode, Store, StoreError, StoredResponse, Tenant,
};
use idem_sqlite::SqliteStore;

/// xorshift64*: a small deterministic generator, so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What an outcome says once tokens (random per store) are replaced by which lease
/// they belong to.
#[derive(Debug, PartialEq)]
enum Seen {
    Acquired { attempt: u32 },
    Replay(StoredResponse),
    InProgress(Duration),
    Mismatch,
    Gone(idem_core::Timestamp, u16),
    Ok,
    Fenced,
    Purged(usize),
    Record(Option<(Record, Option<usize>)>),
}

fn reservation(r: Reservation, leases: &mut Vec<Lease>) -> Seen {
    match r {
        Reservation::Acquired(l) => {
            let attempt = l.attempt;
            leases.push(l);
            Seen::Acquired { attempt }
        }
        Reservation::Replay(r) => Seen::Replay(r),
        Reservation::InProgress { retry_after } => Seen::InProgress(retry_after),
        Reservation::Mismatch => Seen::Mismatch,
        Reservation::Gone {
            completed_at,
            status,
        } => Seen::Gone(completed_at, status),
    }
}

fn unit(r: idem_core::Result<()>) -> Seen {
    match r {
        Ok(()) => Seen::Ok,
        Err(StoreError::Fenced) => Seen::Fenced,
        Err(e) => panic!("store failed: {e}"),
    }
}

fn record(r: Option<Record>, leases: &[Lease]) -> Seen {
    Seen::Record(r.map(|mut r| {
        let owner = leases.iter().position(|l| l.token == r.token);
        r.token = FencingToken::from_u64(0);
        (r, owner)
    }))
}

#[tokio::test]
async fn agrees_with_memory_store_on_random_histories() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("diff.db").display());
    let clock = ManualClock::starting_now();
    let shared: idem_core::SharedClock = Arc::new(clock.clone());
    let sqlite = SqliteStore::builder()
        .clock(shared.clone())
        .connect(&url)
        .await
        .unwrap();
    let memory = MemoryStore::with_clock(shared);
    let tenant = Tenant::new("t");
    let scopes: Vec<Scope> = (0..4)
        .map(|i| {
            let mode = if i == 3 {
                ScopeMode::Internal
            } else {
                ScopeMode::Public
            };
            Scope::new(
                mode,
                tenant.clone(),
                Endpoint::new("POST", "/v1/x"),
                Key::new(format!("k{}", i % 3)).unwrap(),
            )
        })
        .collect();
    let fingerprints = [test_fingerprint("{}"), test_fingerprint(r#"{"a":1}"#)];
    // Short TTLs and leases against clock steps of similar size reach every row of the
    // decision table many times.
    let ttls = [Duration::from_secs(20), Duration::from_secs(90)];
    let leases_for = [Duration::from_secs(5), Duration::from_secs(30)];
    let tombstones = [Duration::ZERO, Duration::from_secs(40)];

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut mem_leases, mut sql_leases) = (Vec::new(), Vec::new());
    let mut counts = [0usize; 8];
    let mut answers = std::collections::HashMap::<&str, usize>::new();
    for step in 0..3000 {
        let op = rng.below(8);
        counts[op as usize] += 1;
        let scope = &scopes[rng.below(4) as usize];
        let (m, s) = match op {
            0..=2 => {
                let req = ReserveRequest::new(scope.clone(), fingerprints[rng.below(2) as usize])
                    .ttl(ttls[rng.below(2) as usize])
                    .lease(leases_for[rng.below(2) as usize])
                    .tombstone(tombstones[rng.below(2) as usize]);
                (
                    reservation(memory.reserve(&req).await.unwrap(), &mut mem_leases),
                    reservation(sqlite.reserve(&req).await.unwrap(), &mut sql_leases),
                )
            }
            3 | 4 if !mem_leases.is_empty() => {
                // Recent leases mostly, so completions usually land.
                let n = mem_leases.len() as u64;
                let i = (n - 1 - rng.below(n.min(4))) as usize;
                let resp = StoredResponse::new(200 + step as u16 % 300, format!("step {step}"))
                    .with_header("content-type", "text/plain");
                match rng.below(3) {
                    0 => (
                        unit(memory.release(&mem_leases[i]).await),
                        unit(sqlite.release(&sql_leases[i]).await),
                    ),
                    1 => {
                        let d = leases_for[rng.below(2) as usize];
                        (
                            unit(memory.renew(&mem_leases[i], d).await),
                            unit(sqlite.renew(&sql_leases[i], d).await),
                        )
                    }
                    _ => (
                        unit(memory.complete(&mem_leases[i], &resp).await),
                        unit(sqlite.complete(&sql_leases[i], &resp).await),
                    ),
                }
            }
            5 => {
                clock.advance(Duration::from_millis(rng.below(15_000)));
                continue;
            }
            6 => {
                let limit = 1 + rng.below(3) as usize;
                (
                    Seen::Purged(memory.purge_expired(limit).await.unwrap()),
                    Seen::Purged(sqlite.purge_expired(limit).await.unwrap()),
                )
            }
            _ => (
                record(memory.get(scope).await.unwrap(), &mem_leases),
                record(sqlite.get(scope).await.unwrap(), &sql_leases),
            ),
        };
        assert_eq!(m, s, "step {step}: op {op} on {scope:?}");
        let kind = match m {
            Seen::Acquired { attempt: 1 } => "acquired",
            Seen::Acquired { .. } => "taken over",
            Seen::Replay(_) => "replay",
            Seen::InProgress(_) => "in progress",
            Seen::Mismatch => "mismatch",
            Seen::Gone(..) => "gone",
            Seen::Ok => "ok",
            Seen::Fenced => "fenced",
            Seen::Purged(0) => "purged none",
            Seen::Purged(_) => "purged",
            Seen::Record(None) => "no record",
            Seen::Record(Some(_)) => "record",
        };
        *answers.entry(kind).or_default() += 1;
    }
    // The histories reached every answer of the decision table and of the fenced
    // writes, many times over.
    println!("{answers:?}");
    assert_eq!(answers.len(), 12, "{answers:?}");
    assert!(answers.values().all(|&n| n >= 10), "{answers:?}");
    // Every kind of operation ran many times.
    assert!(counts.iter().all(|&c| c > 200), "{counts:?}");
}
