//! The consumer child process of the crash tests (`tests/crash.rs`).
//!
//! It credits `"account amount"` messages from a JetStream consumer to a ledger table
//! through an inbox (SQLite or PostgreSQL). With `IDEM_INBOX_CRASH` set it stops dead at
//! a point of the first message's life, prints `CRASH-POINT {mode} {message id}` and
//! waits to be killed (`kill -9`):
//!
//! - `before-commit`: the effects and the processed-message row are written but the
//!   transaction is not committed;
//! - `after-commit`: the transaction committed but the message is not acked.
//!
//! Without it, it consumes until the JetStream consumer is drained, prints
//! `DONE processed={n} duplicates={n} failed={n}` and exits.
//!
//! Settings (environment): `IDEM_INBOX_DATABASE` (`sqlite:PATH` or a `postgres://`
//! URL), `IDEM_INBOX_TABLE` (the processed-message table), `IDEM_INBOX_LEDGER`,
//! `IDEM_INBOX_NATS`, `IDEM_INBOX_STREAM`, `IDEM_INBOX_CONSUMER`, `IDEM_INBOX_CRASH`,
//! `IDEM_INBOX_DEADLINE_SECS` (default 60: the process gives up with exit code 2).

use std::io::Write;
use std::time::Duration;

use futures_util::StreamExt;
use idem_inbox::{BoxFuture, Delivery, Error, Inbox, JetStreamInbox, NatsOptions, PgInbox};
use idem_inbox::{SqliteInbox, handler};
use sqlx::AssertSqlSafe;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    BeforeCommit,
    AfterCommit,
}

struct Settings {
    database: String,
    table: String,
    ledger: String,
    nats: String,
    stream: String,
    consumer: String,
    crash: Option<Crash>,
    deadline: Duration,
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let crash = match std::env::var("IDEM_INBOX_CRASH").ok().as_deref() {
            None | Some("") => None,
            Some("before-commit") => Some(Crash::BeforeCommit),
            Some("after-commit") => Some(Crash::AfterCommit),
            Some(other) => return Err(format!("unknown IDEM_INBOX_CRASH {other:?}")),
        };
        let deadline = std::env::var("IDEM_INBOX_DEADLINE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60);
        Ok(Settings {
            database: env("IDEM_INBOX_DATABASE")?,
            table: env("IDEM_INBOX_TABLE")?,
            ledger: env("IDEM_INBOX_LEDGER")?,
            nats: env("IDEM_INBOX_NATS")?,
            stream: env("IDEM_INBOX_STREAM")?,
            consumer: env("IDEM_INBOX_CONSUMER")?,
            crash,
            deadline: Duration::from_secs(deadline),
        })
    }
}

/// Says where the process stopped, then never returns: the test kills it here.
async fn stop_dead(mode: &str, message_id: &str) -> ! {
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "CRASH-POINT {mode} {message_id}");
        let _ = out.flush();
    }
    std::future::pending::<()>().await;
    unreachable!()
}

fn parse(payload: &[u8]) -> Result<(String, i64), Error> {
    let text = std::str::from_utf8(payload).map_err(Error::handler)?;
    let (account, amount) = text
        .split_once(' ')
        .ok_or_else(|| Error::handler(format!("bad payload {text:?}")))?;
    Ok((account.to_owned(), amount.parse().map_err(Error::handler)?))
}

async fn consume<I: Inbox, H>(
    settings: &Settings,
    js: async_nats::jetstream::Context,
    inbox: I,
    handler: H,
) -> Result<(), Error>
where
    H: for<'t> Fn(Delivery, &'t mut I::Tx) -> BoxFuture<'t, Result<(), Error>> + Send + Sync,
{
    let consumer = JetStreamInbox::new(
        js,
        &settings.stream,
        &settings.consumer,
        inbox,
        NatsOptions::default(),
    )
    .await?;
    if settings.crash == Some(Crash::AfterCommit) {
        let mut messages = consumer
            .consumer()
            .messages()
            .await
            .map_err(Error::broker)?;
        let message = messages
            .next()
            .await
            .ok_or_else(|| Error::broker("the message stream ended"))?
            .map_err(Error::broker)?;
        let outcome = consumer.process_message(&message, &handler).await?;
        let (id, _) = consumer.message_id(&message)?;
        if outcome.is_duplicate() {
            return Err(Error::handler(format!("{id} was already processed")));
        }
        stop_dead("after-commit", &id).await;
    }
    // Consume until nothing is pending or awaiting an ack.
    let mut watched = consumer.consumer().clone();
    let drained = async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            if let Ok(info) = watched.info().await
                && info.num_pending == 0
                && info.num_ack_pending == 0
            {
                return;
            }
        }
    };
    let stats = consumer.run(handler, drained).await?;
    println!(
        "DONE processed={} duplicates={} failed={}",
        stats.processed, stats.duplicates, stats.failed
    );
    Ok(())
}

async fn main_async(settings: Settings) -> Result<(), Error> {
    let client = async_nats::connect(&settings.nats)
        .await
        .map_err(Error::broker)?;
    let js = async_nats::jetstream::new(client);
    let crash = settings.crash;
    let ledger = settings.ledger.clone();
    if let Some(path) = settings.database.strip_prefix("sqlite:") {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = sqlx::SqlitePool::connect_with(options).await?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {ledger} \
             (message_id TEXT NOT NULL, account TEXT NOT NULL, amount INTEGER NOT NULL)"
        )))
        .execute(&pool)
        .await?;
        let inbox = SqliteInbox::new(pool, &settings.consumer)?.with_table(&settings.table)?;
        inbox.migrate().await?;
        let credit = handler(
            move |d: Delivery, tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>| {
                let ledger = ledger.clone();
                Box::pin(async move {
                    let (account, amount) = parse(&d.payload)?;
                    sqlx::query(AssertSqlSafe(format!(
                        "INSERT INTO {ledger} (message_id, account, amount) VALUES (?1, ?2, ?3)"
                    )))
                    .bind(&d.message_id)
                    .bind(account)
                    .bind(amount)
                    .execute(&mut **tx)
                    .await?;
                    if crash == Some(Crash::BeforeCommit) {
                        stop_dead("before-commit", &d.message_id).await;
                    }
                    Ok(())
                })
            },
        );
        consume(&settings, js, inbox, credit).await
    } else {
        let pool = sqlx::PgPool::connect(&settings.database).await?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {ledger} \
             (message_id TEXT NOT NULL, account TEXT NOT NULL, amount BIGINT NOT NULL)"
        )))
        .execute(&pool)
        .await?;
        let inbox = PgInbox::new(pool, &settings.consumer)?.with_table(&settings.table)?;
        inbox.migrate().await?;
        let credit = handler(
            move |d: Delivery, tx: &mut sqlx::Transaction<'static, sqlx::Postgres>| {
                let ledger = ledger.clone();
                Box::pin(async move {
                    let (account, amount) = parse(&d.payload)?;
                    sqlx::query(AssertSqlSafe(format!(
                        "INSERT INTO {ledger} (message_id, account, amount) VALUES ($1, $2, $3)"
                    )))
                    .bind(&d.message_id)
                    .bind(account)
                    .bind(amount)
                    .execute(&mut **tx)
                    .await?;
                    if crash == Some(Crash::BeforeCommit) {
                        stop_dead("before-commit", &d.message_id).await;
                    }
                    Ok(())
                })
            },
        );
        consume(&settings, js, inbox, credit).await
    }
}

fn main() {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("crash consumer: {e}");
            std::process::exit(64);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let deadline = settings.deadline;
    let result = runtime.block_on(async {
        tokio::time::timeout(deadline, main_async(settings))
            .await
            .map_err(|_| format!("gave up after {deadline:?}"))?
            .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        eprintln!("crash consumer: {e}");
        std::process::exit(2);
    }
}
