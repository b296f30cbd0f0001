//! Messages per second with and without the inbox, on SQLite and PostgreSQL.
//!
//! Two measurements per backend, each the median of 5 runs (with and without
//! alternating, so that load from elsewhere on the machine hits both alike):
//! - `db`: the effect (one ledger insert) in its own transaction, straight to the
//!   database (4 at a time on PostgreSQL, one at a time on SQLite, which has a
//!   single writer), without and with the processed-message row;
//! - `jetstream`: the same through `JetStreamInbox` from a JetStream stream, acking
//!   after commit; "without" uses a pass-through inbox that opens and commits the
//!   transaction but records nothing.
//!
//! Run with `cargo bench -p idem-inbox --bench throughput`. Needs PostgreSQL and NATS
//! (the `IDEM_TEST_*_URL` variables, else the local defaults); skips what is missing.
//! `IDEM_BENCH_MESSAGES` sets the messages per run (default 2000).

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem_inbox::{
    BoxFuture, Delivery, Error, Inbox, JetStreamInbox, NatsOptions, Outcome, PgInbox, Publisher,
    SqliteInbox,
};
use sqlx::{AssertSqlSafe, PgPool, Postgres, Sqlite, SqlitePool, Transaction};

const RUNS: usize = 5;
/// Messages in flight on PostgreSQL. SQLite has one writer at a time, and writers that
/// collide back off in SQLite's busy handler, so its consumers run one at a time.
const PG_CONCURRENCY: usize = 4;
const SQLITE_CONCURRENCY: usize = 1;

/// The baseline: the same transaction around the effects, no processed-message row.
#[derive(Clone)]
struct Plain<P>(P, &'static str);

macro_rules! plain_inbox {
    ($pool:ty, $db:ty) => {
        impl Inbox for Plain<$pool> {
            type Tx = Transaction<'static, $db>;
            fn consumer(&self) -> &str {
                self.1
            }
            fn retention(&self) -> Duration {
                Duration::MAX
            }
            async fn process<T, E, F>(&self, _id: &str, effects: F) -> Result<Outcome<T>, E>
            where
                T: Send,
                E: From<Error> + Send,
                F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<T, E>> + Send,
            {
                let mut tx = self.0.begin().await.map_err(Error::from)?;
                let value = effects(&mut tx).await?;
                tx.commit().await.map_err(Error::from)?;
                Ok(Outcome::Processed(value))
            }
            async fn contains(&self, _id: &str) -> Result<bool, Error> {
                Ok(false)
            }
            async fn purge_expired(&self, _limit: usize) -> Result<usize, Error> {
                Ok(0)
            }
        }
    };
}
plain_inbox!(SqlitePool, Sqlite);
plain_inbox!(PgPool, Postgres);

fn sqlite_credit<'t>(
    id: String,
    tx: &'t mut Transaction<'static, Sqlite>,
) -> BoxFuture<'t, Result<(), Error>> {
    Box::pin(async move {
        sqlx::query("INSERT INTO bench_ledger (message_id, amount) VALUES (?1, 1)")
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
}

fn pg_credit<'t>(
    ledger: String,
    id: String,
    tx: &'t mut Transaction<'static, Postgres>,
) -> BoxFuture<'t, Result<(), Error>> {
    Box::pin(async move {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {ledger} (message_id, amount) VALUES ($1, 1)"
        )))
        .bind(id)
        .execute(&mut **tx)
        .await?;
        Ok(())
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs `plain` and `inbox` RUNS times each, alternating so that load from elsewhere
/// on the machine hits both alike, and returns their median rates.
async fn median_rates<P, PF, I, IF>(n: usize, mut plain: P, mut inbox: I) -> (f64, f64)
where
    P: FnMut(usize) -> PF,
    PF: Future<Output = Duration>,
    I: FnMut(usize) -> IF,
    IF: Future<Output = Duration>,
{
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let (mut p, mut i) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        p.push(rate(plain(run).await));
        i.push(rate(inbox(run).await));
    }
    (median(p), median(i))
}

/// `n` distinct messages straight through `inbox.process`, `concurrency` at a time.
async fn db_run<I, C>(
    inbox: &I,
    prefix: String,
    n: usize,
    concurrency: usize,
    credit: C,
) -> Duration
where
    I: Inbox,
    C: for<'t> Fn(String, &'t mut I::Tx) -> BoxFuture<'t, Result<(), Error>> + Sync,
{
    let start = Instant::now();
    let prefix = &prefix;
    futures_util::stream::iter(0..n)
        .for_each_concurrent(concurrency, |i| {
            let id = format!("{prefix}-{i}");
            let credit = &credit;
            async move {
                let out = inbox
                    .process(&id.clone(), move |tx| credit(id, tx))
                    .await
                    .expect("process");
                assert_eq!(out, Outcome::Processed(()));
            }
        })
        .await;
    start.elapsed()
}

/// Publishes `n` messages to a fresh stream and consumes them through `inbox`.
async fn jetstream_run<I, H>(
    js: &async_nats::jetstream::Context,
    inbox: I,
    n: usize,
    concurrency: usize,
    handler: H,
) -> Duration
where
    I: Inbox,
    H: for<'t> Fn(Delivery, &'t mut I::Tx) -> BoxFuture<'t, Result<(), Error>> + Send + Sync,
{
    use async_nats::jetstream::{consumer, stream};
    let name = format!("INBOX_BENCH_{:08x}", rand_u32());
    let subject = format!("inbox.bench.{name}");
    let created = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("create stream");
    created
        .create_consumer(consumer::pull::Config {
            durable_name: Some("bench".to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("create consumer");
    let publisher = Publisher::new(js.clone());
    let mut acks = Vec::new();
    for i in 0..n {
        acks.push(
            publisher
                .send(
                    subject.clone(),
                    &format!("m-{i}"),
                    Default::default(),
                    "1".into(),
                )
                .await
                .expect("publish"),
        );
    }
    for ack in acks {
        ack.await.expect("publish ack");
    }
    let options = NatsOptions {
        concurrency,
        batch: 200,
        ..NatsOptions::default()
    };
    let consumer = JetStreamInbox::new(js.clone(), &name, "bench", inbox, options)
        .await
        .expect("consumer");
    let mut watched = consumer.consumer().clone();
    let start = Instant::now();
    let drained = async move {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let info = watched.info().await.expect("consumer info");
            if info.num_pending == 0 && info.num_ack_pending == 0 {
                return;
            }
        }
    };
    let stats = tokio::time::timeout(Duration::from_secs(300), consumer.run(handler, drained))
        .await
        .expect("the run finished within 300 s")
        .expect("run");
    let took = start.elapsed();
    assert_eq!(stats.processed, n as u64, "{stats:?}");
    js.delete_stream(&name).await.expect("delete stream");
    took
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now()) as u32
}

fn report(backend: &str, path: &str, plain: f64, inbox: f64) {
    println!(
        "{backend:<10} {path:<10} without inbox {plain:>9.0} msg/s   with inbox {inbox:>9.0} msg/s   ratio {:.2}",
        inbox / plain
    );
}

async fn sqlite_bench(js: Option<&async_nats::jetstream::Context>, n: usize) {
    let dir = std::env::temp_dir().join(format!("idem-inbox-bench-{}", rand_u32()));
    std::fs::create_dir_all(&dir).unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("bench.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE bench_ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let inbox = SqliteInbox::new(pool.clone(), "bench").unwrap();
    inbox.migrate().await.unwrap();
    let plain = Plain(pool.clone(), "bench");

    let c = SQLITE_CONCURRENCY;
    let (p, i) = median_rates(
        n,
        |r| db_run(&plain, format!("p{r}"), n, c, sqlite_credit),
        |r| db_run(&inbox, format!("i{r}"), n, c, sqlite_credit),
    )
    .await;
    report("sqlite", "db", p, i);

    if let Some(js) = js {
        let h = idem_inbox::handler(|d: Delivery, tx: &mut Transaction<'static, Sqlite>| {
            sqlite_credit(d.message_id, tx)
        });
        let (p, i) = median_rates(
            n,
            |_| jetstream_run(js, plain.clone(), n, c, h),
            |r| {
                let inbox = SqliteInbox::new(pool.clone(), format!("bench-js-{r}")).unwrap();
                jetstream_run(js, inbox, n, c, h)
            },
        )
        .await;
        report("sqlite", "jetstream", p, i);
    }
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn pg_bench(js: Option<&async_nats::jetstream::Context>, n: usize) {
    let url = idem_test_support::services::postgres_url();
    let pool = match sqlx::postgres::PgPoolOptions::new()
        .max_connections(PG_CONCURRENCY as u32 + 2)
        .connect(&url)
        .await
    {
        Ok(p) => p,
        Err(e) => {
            println!("postgres   skipped: {url} unreachable ({e})");
            return;
        }
    };
    let ns = format!("{:08x}", rand_u32());
    let (table, ledger) = (format!("bench_inbox_{ns}"), format!("bench_ledger_{ns}"));
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {ledger} (message_id TEXT NOT NULL, amount BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let inbox = PgInbox::new(pool.clone(), "bench")
        .unwrap()
        .with_table(&table)
        .unwrap();
    inbox.migrate().await.unwrap();
    let plain = Plain(pool.clone(), "bench");
    let credit = idem_pg_credit(|id: String, tx: &mut Transaction<'static, Postgres>| {
        pg_credit(ledger.clone(), id, tx)
    });

    let c = PG_CONCURRENCY;
    let (p, i) = median_rates(
        n,
        |r| db_run(&plain, format!("p{r}"), n, c, credit),
        |r| db_run(&inbox, format!("i{r}"), n, c, credit),
    )
    .await;
    report("postgres", "db", p, i);

    if let Some(js) = js {
        let h = idem_inbox::handler(|d: Delivery, tx: &mut Transaction<'static, Postgres>| {
            pg_credit(ledger.clone(), d.message_id, tx)
        });
        let (p, i) = median_rates(
            n,
            |_| jetstream_run(js, plain.clone(), n, c, &h),
            |r| {
                let inbox = PgInbox::new(pool.clone(), format!("bench-js-{r}"))
                    .unwrap()
                    .with_table(&table)
                    .unwrap();
                jetstream_run(js, inbox, n, c, &h)
            },
        )
        .await;
        report("postgres", "jetstream", p, i);
    }
    let sql = format!("DROP TABLE IF EXISTS {table}, {ledger}");
    sqlx::query(AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .unwrap();
}

/// Names the credit closure's higher-ranked type.
fn idem_pg_credit<C>(c: C) -> C
where
    C: for<'t> Fn(
            String,
            &'t mut Transaction<'static, Postgres>,
        ) -> BoxFuture<'t, Result<(), Error>>
        + Copy,
{
    c
}

fn main() {
    let n: usize = std::env::var("IDEM_BENCH_MESSAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let nats_url = idem_test_support::services::nats_url();
        let js = match async_nats::connect(&nats_url).await {
            Ok(client) => Some(async_nats::jetstream::new(client)),
            Err(e) => {
                println!("jetstream  skipped: {nats_url} unreachable ({e})");
                None
            }
        };
        println!(
            "{n} messages per run, median of {RUNS} runs, one ledger insert per message; \
             in flight: PostgreSQL {PG_CONCURRENCY}, SQLite {SQLITE_CONCURRENCY}"
        );
        sqlite_bench(js.as_ref(), n).await;
        pg_bench(js.as_ref(), n).await;
    });
}
