//! The crash scenario: the three processes killed with SIGKILL at random points while a
//! client sends orders, then the books checked.

use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_client::{Client, RetryBudget, RetryPolicy};
use idem_outbox::{Outbox, SqliteOutbox};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::{BoxError, Broker, DURABLE, env};

/// What to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The broker.
    pub broker: Broker,
    /// Its URL.
    pub broker_url: String,
    /// Orders the client creates.
    pub orders: usize,
    /// Orders in flight at once.
    pub concurrency: usize,
    /// Each of the three processes is killed at least this often.
    pub kills_each: usize,
    /// Every `lose_every`-th order first goes out once with its answer thrown away.
    pub lose_every: usize,
    /// A client worker's pause between two orders, so that the kills fall among the
    /// requests rather than after them.
    pub pace: Duration,
    /// The whole run gives up (an error) after this.
    pub deadline: Duration,
    /// Seeds the random kill points.
    pub seed: u64,
}

impl Scenario {
    /// A small run: 24 orders, each process killed twice.
    pub fn small(broker: Broker, broker_url: String) -> Scenario {
        Scenario {
            broker,
            broker_url,
            orders: 24,
            concurrency: 4,
            kills_each: 2,
            lose_every: 3,
            pace: Duration::from_millis(300),
            deadline: Duration::from_secs(150),
            seed: 0x5eed,
        }
    }
}

/// Where the three child programs are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `orders-outbox-service`.
    pub service: PathBuf,
    /// `orders-outbox-relay`.
    pub relay: PathBuf,
    /// `orders-outbox-consumer`.
    pub consumer: PathBuf,
}

impl Binaries {
    /// The programs beside the running executable (as `cargo run` builds them).
    pub fn beside_current_exe() -> Result<Binaries, BoxError> {
        let dir = std::env::current_exe()?
            .parent()
            .ok_or("the executable has no directory")?
            .to_owned();
        Ok(Binaries {
            service: dir.join("orders-outbox-service"),
            relay: dir.join("orders-outbox-relay"),
            consumer: dir.join("orders-outbox-consumer"),
        })
    }
}

/// What a run saw, and the books at its end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Orders the client was told were created.
    pub orders_answered: usize,
    /// Orders in the service's table.
    pub orders: i64,
    /// Distinct order numbers in it.
    pub distinct_orders: i64,
    /// Events published by the relay (marked).
    pub published: u64,
    /// Events staged and never published (must be 0).
    pub unpublished: u64,
    /// Events parked (must be 0).
    pub parked: u64,
    /// Ledger rows (credits).
    pub ledger_rows: i64,
    /// Distinct orders credited.
    pub ledger_orders: i64,
    /// The ledger's total.
    pub ledger_total: i64,
    /// What the total must be.
    pub expected_total: i64,
    /// SIGKILLs of the service, the relay, the consumer.
    pub kills: [usize; 3],
    /// Orders whose first answer was thrown away.
    pub lost_answers: u64,
    /// Replays the client got.
    pub replays: u64,
    /// HTTP attempts the client made.
    pub attempts: u64,
    /// How long it took.
    pub elapsed: Duration,
}

impl Report {
    /// Every order once, every event published and credited once, nothing lost.
    pub fn is_exact(&self, orders: usize) -> bool {
        let n = orders as i64;
        self.orders_answered == orders
            && self.orders == n
            && self.distinct_orders == n
            && self.published == orders as u64
            && self.unpublished == 0
            && self.parked == 0
            && self.ledger_rows == n
            && self.ledger_orders == n
            && self.ledger_total == self.expected_total
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "orders: {} answered, {} in the table ({} distinct)",
            self.orders_answered, self.orders, self.distinct_orders
        )?;
        writeln!(
            f,
            "events: {} published, {} unpublished, {} parked",
            self.published, self.unpublished, self.parked
        )?;
        writeln!(
            f,
            "ledger: {} credits for {} orders, total {} (expected {})",
            self.ledger_rows, self.ledger_orders, self.ledger_total, self.expected_total
        )?;
        writeln!(
            f,
            "kill -9: service {}, relay {}, consumer {}; {} lost answers, {} attempts, {} replays; {:.1?}",
            self.kills[0],
            self.kills[1],
            self.kills[2],
            self.lost_answers,
            self.attempts,
            self.replays,
            self.elapsed
        )
    }
}

/// One killable child process.
struct Proc {
    name: &'static str,
    bin: PathBuf,
    envs: Vec<(&'static str, String)>,
    child: Option<Child>,
}

impl Proc {
    async fn start(&mut self) -> Result<(), BoxError> {
        let mut child = Command::new(&self.bin)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.bin.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
        if !matches!(ready, Ok(Ok(Some(ref l))) if l == "READY") {
            return Err(format!("the {} did not start: {ready:?}", self.name).into());
        }
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL, as a power cut would stop it.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A small xorshift generator: random kill points, repeatable from a seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Runs `scenario` with the programs in `bins`, in a temporary directory, and returns
/// the books. The broker's stream or queue is made for the run and deleted after it.
pub async fn run(scenario: &Scenario, bins: &Binaries) -> Result<Report, BoxError> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let ns = format!(
        "{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
            % 1_000_000_000
    );
    let subject = format!("orders_outbox.{ns}");
    let stream = format!("ORDERS_OUTBOX_{ns}");
    let broker = BrokerSetup::create(scenario, &subject, &stream).await?;
    let result = tokio::time::timeout(
        scenario.deadline,
        drive(scenario, bins, dir.path(), &subject, &stream, started),
    )
    .await;
    broker.delete(scenario, &subject, &stream).await;
    match result {
        Ok(report) => report,
        Err(_) => Err(format!("the scenario did not finish within {:?}", scenario.deadline).into()),
    }
}

async fn drive(
    scenario: &Scenario,
    bins: &Binaries,
    dir: &std::path::Path,
    subject: &str,
    stream: &str,
    started: Instant,
) -> Result<Report, BoxError> {
    let orders_db = dir.join("orders.db").display().to_string();
    let ledger_db = dir.join("ledger.db").display().to_string();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let addr = format!("127.0.0.1:{port}");
    let envs = vec![
        (env::ORDERS_DB, orders_db.clone()),
        (env::LEDGER_DB, ledger_db.clone()),
        (env::ADDR, addr.clone()),
        (env::BROKER, scenario.broker.name().to_owned()),
        (env::BROKER_URL, scenario.broker_url.clone()),
        (env::SUBJECT, subject.to_owned()),
        (env::STREAM, stream.to_owned()),
    ];
    let procs: Vec<Arc<Mutex<Proc>>> = [
        ("service", &bins.service),
        ("relay", &bins.relay),
        ("consumer", &bins.consumer),
    ]
    .into_iter()
    .map(|(name, bin)| {
        Arc::new(Mutex::new(Proc {
            name,
            bin: bin.clone(),
            envs: envs.clone(),
            child: None,
        }))
    })
    .collect();
    // The service first: it creates the tables the relay reads.
    for p in &procs {
        p.lock().await.start().await?;
    }

    let clients_done = Arc::new(AtomicBool::new(false));
    let chaos = {
        let procs = procs.clone();
        let done = clients_done.clone();
        let (kills_each, seed) = (scenario.kills_each, scenario.seed);
        tokio::spawn(async move {
            let mut rng = Rng(seed | 1);
            let mut kills = [0usize; 3];
            while !(done.load(Ordering::SeqCst) && kills.iter().all(|&k| k >= kills_each)) {
                tokio::time::sleep(Duration::from_millis(150 + rng.below(450))).await;
                let i = rng.below(3) as usize;
                let mut p = procs[i].lock().await;
                p.kill().await;
                kills[i] += 1;
                tokio::time::sleep(Duration::from_millis(rng.below(200))).await;
                p.start().await?;
            }
            Ok::<_, BoxError>(kills)
        })
    };

    let (answered, lost, attempts, replays) = send_orders(scenario, &addr).await;
    clients_done.store(true, Ordering::SeqCst);
    let kills = chaos.await??;

    // Let the survivors finish: every event published and credited.
    let orders_pool = crate::sqlite(&orders_db).await?;
    let ledger_pool = crate::sqlite(&ledger_db).await?;
    let outbox = SqliteOutbox::new(orders_pool.clone());
    let n = scenario.orders as i64;
    loop {
        let stats = outbox.stats().await?;
        let (_, credited, _) = crate::ledger_totals(&ledger_pool).await?;
        if stats.unpublished == 0 && credited >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A moment for a redelivery in flight to show up as a double credit, if one could.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in &procs {
        p.lock().await.kill().await;
    }
    let (orders, distinct_orders): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT order_number) FROM orders")
            .fetch_one(&orders_pool)
            .await?;
    let stats = outbox.stats().await?;
    let (ledger_rows, ledger_orders, ledger_total) = crate::ledger_totals(&ledger_pool).await?;
    Ok(Report {
        orders_answered: answered,
        orders,
        distinct_orders,
        published: stats.published,
        unpublished: stats.unpublished,
        parked: stats.parked,
        ledger_rows,
        ledger_orders,
        ledger_total,
        expected_total: (1..=n).sum(),
        kills,
        lost_answers: lost,
        replays,
        attempts,
        elapsed: started.elapsed(),
    })
}

/// Sends the orders (order `i` for `i` cents), `concurrency` at a time; returns how
/// many were answered 2xx, lost on purpose, the attempts and the replays.
async fn send_orders(scenario: &Scenario, addr: &str) -> (usize, u64, u64, u64) {
    let client = Client::builder()
        .policy(
            RetryPolicy::default()
                .max_attempts(200)
                .base_delay(Duration::from_millis(50))
                .max_delay(Duration::from_millis(500))
                .attempt_timeout(Duration::from_secs(5))
                .deadline(scenario.deadline),
        )
        // Every retry is allowed: the service is down on purpose.
        .budget(RetryBudget::default().ratio(1000.0).min_retries(100_000))
        .build()
        .expect("a client");
    let url = format!("http://{addr}/v1/orders");
    let next = AtomicU64::new(1);
    let (answered, lost, attempts, replays) = (
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    );
    let worker = async || {
        loop {
            let i = next.fetch_add(1, Ordering::SeqCst);
            if i > scenario.orders as u64 {
                break;
            }
            let order = serde_json::json!({
                "order_number": format!("E-{i}"), "sku": "tea", "qty": 1, "amount_cents": i,
            });
            // The key is fixed here, before any attempt.
            let op = client.post(&url).json(&order);
            if i.is_multiple_of(scenario.lose_every.max(1) as u64) {
                // A first attempt whose answer is lost: sent, then given up on at a
                // random moment, executed or not.
                let http = client.http().clone();
                let (url, key) = (url.clone(), op.key().as_str().to_owned());
                let body = order.to_string();
                let lost_one = tokio::spawn(async move {
                    let _ = http
                        .post(url)
                        .header("idempotency-key", key)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await;
                });
                tokio::time::sleep(Duration::from_millis(i % 40)).await;
                lost_one.abort();
                lost.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(scenario.pace).await;
            match op.send().await {
                Ok(outcome) if outcome.status().is_success() => {
                    answered.fetch_add(1, Ordering::SeqCst);
                    attempts.fetch_add(u64::from(outcome.attempts()), Ordering::SeqCst);
                    if outcome.replayed() {
                        replays.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(outcome) => eprintln!("order {i}: {}", outcome.status()),
                Err(e) => eprintln!("order {i}: {e}"),
            }
        }
    };
    let workers = (0..scenario.concurrency.max(1)).map(|_| worker());
    futures_util::future::join_all(workers).await;
    let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
    (
        get(&answered) as usize,
        get(&lost),
        get(&attempts),
        get(&replays),
    )
}

/// The run's own stream (NATS) or queue (RabbitMQ).
struct BrokerSetup;

impl BrokerSetup {
    async fn create(
        scenario: &Scenario,
        subject: &str,
        stream: &str,
    ) -> Result<BrokerSetup, BoxError> {
        match scenario.broker {
            Broker::Nats => {
                use async_nats::jetstream::{consumer, stream as js_stream};
                let js =
                    async_nats::jetstream::new(async_nats::connect(&scenario.broker_url).await?);
                let created = js
                    .create_stream(js_stream::Config {
                        name: stream.to_owned(),
                        subjects: vec![subject.to_owned()],
                        max_age: Duration::from_secs(3600),
                        duplicate_window: Duration::from_secs(120),
                        ..Default::default()
                    })
                    .await?;
                created
                    .create_consumer(consumer::pull::Config {
                        durable_name: Some(DURABLE.to_owned()),
                        ack_policy: consumer::AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(2),
                        ..Default::default()
                    })
                    .await?;
            }
            Broker::RabbitMq => {
                idem_inbox::RabbitInbox::<idem_inbox::SqliteInbox>::declare_queue(
                    &scenario.broker_url,
                    subject,
                    idem_inbox::QueueType::Quorum,
                )
                .await?;
            }
        }
        Ok(BrokerSetup)
    }

    async fn delete(self, scenario: &Scenario, subject: &str, stream: &str) {
        match scenario.broker {
            Broker::Nats => {
                if let Ok(client) = async_nats::connect(&scenario.broker_url).await {
                    let _ = async_nats::jetstream::new(client)
                        .delete_stream(stream)
                        .await;
                }
            }
            Broker::RabbitMq => {
                let props = lapin::ConnectionProperties::default();
                if let Ok(c) = lapin::Connection::connect(&scenario.broker_url, props).await
                    && let Ok(ch) = c.create_channel().await
                {
                    let _ = ch
                        .queue_delete(
                            subject.into(),
                            lapin::options::QueueDeleteOptions::default(),
                        )
                        .await;
                    let _ = c.close(200, "done".into()).await;
                }
            }
        }
    }
}
