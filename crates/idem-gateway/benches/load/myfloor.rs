//! The MariaDB (MySQL) floor: what the server does at best for a keyed request, two
//! synced commits, measured with the gateway's own load in the same run. There is no
//! `pgbench` for MySQL that runs a custom script for a time, so a driver here does
//! it: `clients` connections, each looping on a fresh key, an insert-if-absent of its
//! row and then an update of it, each statement its own autocommit (so its own redo
//! log write, synced as the server's `innodb_flush_log_at_trx_commit` says), prepared.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{ConnectOptions, Executor, MySqlPool};

use crate::others::FloorFigures;

/// The floor's table (`idem_load_floor`, apart from any records table), made afresh.
const CREATE: [&str; 2] = [
    "DROP TABLE IF EXISTS idem_load_floor",
    "CREATE TABLE idem_load_floor (id VARBINARY(64) PRIMARY KEY, \
     state VARCHAR(16) NOT NULL, at BIGINT NOT NULL, body BLOB) ENGINE=InnoDB",
];
/// A request's first commit: its key reserved, if absent.
const INSERT: &str =
    "INSERT IGNORE INTO idem_load_floor (id, state, at) VALUES (?, 'in_progress', 1)";
/// Its second: the answer recorded.
const UPDATE: &str =
    "UPDATE idem_load_floor SET state = 'completed', at = 2, body = 'ok' WHERE id = ?";

/// The driver and its pool, one connection per client.
pub struct MyFloor {
    pool: MySqlPool,
}

impl MyFloor {
    /// Connects `clients` connections to `url` and makes the floor's table afresh.
    pub async fn new(url: &str, clients: usize) -> MyFloor {
        let options: MySqlConnectOptions = url.parse().expect("a MySQL URL");
        let options = options.disable_statement_logging();
        let pool = MySqlPoolOptions::new()
            .min_connections(clients as u32)
            .max_connections(clients as u32)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .expect("the MySQL floor connects");
        for statement in CREATE {
            pool.execute(statement).await.expect("the floor's table");
        }
        MyFloor { pool }
    }

    /// One run of `secs` seconds at `clients` clients; every transaction's latency.
    pub async fn run(&self, clients: usize, secs: u64) -> FloorFigures {
        // Each run starts on an empty table, as pgbench's fresh keys do on a table the
        // run fills: the table's growth over rounds is not the floor's.
        self.pool
            .execute("TRUNCATE TABLE idem_load_floor")
            .await
            .expect("the floor's table emptied");
        static RUN: AtomicU64 = AtomicU64::new(0);
        let run = RUN.fetch_add(1, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for client in 0..clients {
            let (pool, stop) = (self.pool.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut conn = pool.acquire().await.expect("a floor connection");
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("{run}-{client}-{n}");
                    n += 1;
                    let t = Instant::now();
                    sqlx::query(INSERT)
                        .bind(&key)
                        .execute(&mut *conn)
                        .await
                        .expect("the floor's insert");
                    sqlx::query(UPDATE)
                        .bind(&key)
                        .execute(&mut *conn)
                        .await
                        .expect("the floor's update");
                    latencies.push(t.elapsed());
                }
                latencies
            }));
        }
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.store(true, Ordering::Relaxed);
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.expect("a floor client"));
        }
        let secs_run = started.elapsed().as_secs_f64();
        latencies.sort_unstable();
        let pct = |p: f64| {
            latencies
                .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        FloorFigures {
            transactions: latencies.len(),
            secs: secs_run,
            p50: pct(0.50),
            p99: pct(0.99),
        }
    }
}

/// The CPU time so far of every `mariadbd` (and `mysqld`) process on the machine:
/// the server behind both the MySQL floor and the gateway's MySQL store.
pub fn server_cpu() -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| matches!(c.trim(), "mariadbd" | "mysqld"))
        })
        .map(|pid| idem_test_support::cpu_time(&pid.to_string()))
        .sum()
}
