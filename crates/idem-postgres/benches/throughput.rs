//! Reserve + complete per second through `PgStore` at 1 and 64 concurrent callers,
//! batched (the default) and with batching off, next to the server's own figure for the
//! same two writes driven by `pgbench` in the same run, and the ratios.
//!
//! `cargo bench -p idem-postgres --bench throughput`. Reads `IDEM_TEST_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`); `IDEM_BENCH_SECONDS` sets the
//! length of each measured round (default 3). Each figure is the median of three
//! rounds after a one-second warm-up. Connections per run equal the callers, for both
//! sides.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{FencingToken, Reservation, ReserveRequest, Store, StoredResponse};
use idem_postgres::{PgStore, schema};
use idem_test_support::services::postgres_url;

const ROUNDS: usize = 3;
const CALLERS: [usize; 2] = [1, 64];
const BODY: &[u8] = br#"{"id":"ch_1","object":"charge","amount":100,"currency":"eur","ok":1}"#;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let url = postgres_url();
    let secs: u64 = std::env::var("IDEM_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let round = Duration::from_secs(secs.max(1));
    let suffix = format!("{:08x}", FencingToken::generate().as_u64() as u32);
    let store_table = format!("idem_bench_store_{suffix}");
    let raw_table = format!("idem_bench_raw_{suffix}");

    // Both tables come from the same migration: same columns, same indexes.
    let admin = match PgStore::builder()
        .table(&store_table)
        .max_connections(2)
        .connect(&url)
        .await
    {
        Ok(s) => s,
        Err(e) => {
            println!("SKIPPED: PostgreSQL at {url} is unreachable ({e})");
            return;
        }
    };
    let raw = PgStore::builder()
        .table(&raw_table)
        .max_connections(1)
        .connect(&url)
        .await
        .expect("raw table");
    let script = pgbench_script(&raw_table);
    let have_pgbench = Command::new("pgbench").arg("--version").output().is_ok();

    let settings: Vec<String> = sqlx::query_scalar(
        "SELECT name || '=' || setting FROM pg_settings \
         WHERE name IN ('server_version', 'synchronous_commit', 'fsync') ORDER BY name",
    )
    .fetch_all(admin.pool())
    .await
    .expect("server settings");
    println!("server: {}", settings.join(", "));
    println!(
        "reserve+complete per second, median of {ROUNDS} rounds of {}s",
        round.as_secs()
    );
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>8} {:>8}",
        "callers", "PgStore", "unbatched", "pgbench", "ratio", "unbatched"
    );
    for callers in CALLERS {
        let mut figures = [0.0; 2];
        for (figure, batching) in figures.iter_mut().zip([true, false]) {
            let store = PgStore::builder()
                .table(&store_table)
                .max_connections(callers as u32)
                .acquire_timeout(Duration::from_secs(30))
                .batching(batching)
                .migrate(false)
                .connect(&url)
                .await
                .expect("bench store");
            let _ = store_round(&store, callers, Duration::from_secs(1)).await;
            let mut runs = Vec::new();
            for _ in 0..ROUNDS {
                runs.push(store_round(&store, callers, round).await);
            }
            store.pool().close().await;
            *figure = median(runs);
        }
        let [ours, unbatched] = figures;

        let theirs = if have_pgbench {
            let _ = pgbench(&url, &script, callers, 1);
            let runs: Vec<f64> = (0..ROUNDS)
                .filter_map(|_| pgbench(&url, &script, callers, round.as_secs()))
                .collect();
            (!runs.is_empty()).then(|| median(runs))
        } else {
            None
        };
        match theirs {
            Some(t) => println!(
                "{callers:>8} {ours:>14.0} {unbatched:>14.0} {t:>14.0} {:>7.2}x {:>7.2}x",
                ours / t,
                unbatched / t
            ),
            None => println!(
                "{callers:>8} {ours:>14.0} {unbatched:>14.0} {:>14} {:>8} {:>8}",
                "n/a", "n/a", "n/a"
            ),
        }
    }
    if !have_pgbench {
        println!("pgbench is not installed: no raw server figure");
    }
    println!(
        "pgbench runs the same two statements per transaction on an identical table: \
         INSERT ... ON CONFLICT DO NOTHING, then the completing UPDATE (-M prepared)"
    );
    let _ = std::fs::remove_file(&script);
    for table in [&store_table, &raw_table] {
        schema::drop_table(admin.pool(), table)
            .await
            .expect("drop bench table");
    }
    drop(raw);
}

/// `callers` tasks reserve a fresh key and complete it, over and over, for `length`.
async fn store_round(store: &PgStore, callers: usize, length: Duration) -> f64 {
    static ROUND: AtomicU64 = AtomicU64::new(0);
    let round = ROUND.fetch_add(1, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let response = StoredResponse::new(201, BODY).with_header("content-type", "application/json");
    let fingerprint = test_fingerprint(r#"{"amount":100}"#);
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (store, stop, done, response) =
                (store.clone(), stop.clone(), done.clone(), response.clone());
            tokio::spawn(async move {
                let mut i = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    let scope = test_scope("/v1/charges", &format!("r{round}-c{c}-{i}"));
                    let req = ReserveRequest::new(scope, fingerprint);
                    let Reservation::Acquired(lease) = store.reserve(&req).await.expect("reserve")
                    else {
                        panic!("a fresh key must be acquired")
                    };
                    store.complete(&lease, &response).await.expect("complete");
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// The server's figure for the same writes: one transaction = the reserve's insert and
/// the completing update, each its own autocommit statement, as the store issues them.
fn pgbench_script(table: &str) -> std::path::PathBuf {
    let fingerprint = "\\x".to_owned() + &"ab".repeat(32);
    let headers = "\\x".to_owned()
        + &hex(&idem_core::codec::encode_headers(&[(
            "content-type".into(),
            bytes_of(b"application/json"),
        )]));
    let body = "\\x".to_owned() + &hex(BODY);
    let script = format!(
        "\\set k random(1, 1000000000000)
INSERT INTO {table} (tenant, endpoint, idem_key, fingerprint, created_at, expires_at, attempt, token, state, lease_until) VALUES ('tenant-bench', 'POST /v1/charges', CAST(:k AS text), '{fingerprint}', 1, 86400001, 1, :k, 'in_progress', 60001) ON CONFLICT (tenant, endpoint, idem_key) DO NOTHING;
UPDATE {table} SET state = 'completed', lease_until = NULL, status = 201, headers = '{headers}', body = '{body}', completed_at = 2 WHERE tenant = 'tenant-bench' AND endpoint = 'POST /v1/charges' AND idem_key = CAST(:k AS text) AND token = :k AND expires_at > 2 AND state = 'in_progress';
"
    );
    let path = std::env::temp_dir().join(format!("{table}.sql"));
    std::fs::write(&path, script).expect("write pgbench script");
    path
}

fn bytes_of(b: &'static [u8]) -> bytes::Bytes {
    bytes::Bytes::from_static(b)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One pgbench run; its "tps" (transactions of the script per second).
fn pgbench(url: &str, script: &std::path::Path, clients: usize, secs: u64) -> Option<f64> {
    let out = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-T", &secs.to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .arg("-f")
        .arg(script)
        .arg(url)
        .output()
        .ok()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        eprintln!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    stdout
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
