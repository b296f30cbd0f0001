//! Sends operations through a journal, and resumes the ones a killed process left.
//!
//! ```text
//! idem-client-journal --journal FILE send METHOD URL [--data BODY] [--key KEY] [--header 'Name: value']...
//! idem-client-journal --journal FILE resume
//! idem-client-journal --journal FILE list
//! idem-client-journal --journal FILE purge [--older-than-secs N]
//! ```
//!
//! Every result is one line of `name=value` pairs on standard output; the exit status
//! is 0 when every operation got an answer, 1 otherwise, 2 for a usage error.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use idem_client::{Client, Error, Journal, JournaledOperation, Key, Outcome};

const USAGE: &str = "usage: idem-client-journal --journal FILE \
    (send METHOD URL [--data BODY] [--key KEY] [--header 'Name: value']... | resume | list | purge [--older-than-secs N])";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Usage(msg)) => {
            eprintln!("{msg}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

struct Usage(String);

impl From<Error> for Usage {
    fn from(e: Error) -> Usage {
        Usage(e.to_string())
    }
}

async fn run(args: Vec<String>) -> Result<bool, Usage> {
    let mut args = args.into_iter();
    let (Some(flag), Some(path)) = (args.next(), args.next()) else {
        return Err(Usage("missing --journal FILE".into()));
    };
    if flag != "--journal" {
        return Err(Usage(format!("expected --journal, got {flag:?}")));
    }
    let journal = Journal::open(&path).await?;
    let client = Client::new();
    match args.next().as_deref() {
        Some("send") => send(&journal, &client, args).await,
        Some("resume") => {
            let mut ok = true;
            for op in journal.pending(&client).await? {
                ok &= report(&op, op.send().await);
            }
            Ok(ok)
        }
        Some("list") => {
            for e in journal.entries().await? {
                println!(
                    "id={} key={} state={:?} method={} url={} attempts={} status={} replayed={}",
                    e.id,
                    e.key,
                    e.state,
                    e.method,
                    e.url,
                    e.attempts,
                    e.status.map_or("-".into(), |s| s.to_string()),
                    e.replayed.map_or("-".into(), |r| r.to_string()),
                );
            }
            Ok(true)
        }
        Some("purge") => {
            let secs = match (args.next().as_deref(), args.next()) {
                (None, _) => 0,
                (Some("--older-than-secs"), Some(n)) => n
                    .parse()
                    .map_err(|_| Usage(format!("not a number of seconds: {n:?}")))?,
                (Some(other), _) => return Err(Usage(format!("unexpected {other:?}"))),
            };
            let n = journal
                .purge_finished(Duration::from_secs(secs), u32::MAX)
                .await?;
            println!("purged={n}");
            Ok(true)
        }
        Some(other) => Err(Usage(format!("unknown command {other:?}"))),
        None => Err(Usage("missing command".into())),
    }
}

async fn send(
    journal: &Journal,
    client: &Client,
    mut args: impl Iterator<Item = String>,
) -> Result<bool, Usage> {
    let (Some(method), Some(url)) = (args.next(), args.next()) else {
        return Err(Usage("send needs METHOD and URL".into()));
    };
    let method = method
        .to_ascii_uppercase()
        .parse()
        .map_err(|_| Usage(format!("not a method: {method:?}")))?;
    let mut op = client.operation(method, url);
    while let Some(flag) = args.next() {
        let Some(value) = args.next() else {
            return Err(Usage(format!("{flag} needs a value")));
        };
        op = match flag.as_str() {
            "--data" => op.body(value),
            "--key" => op.with_key(Key::new(value).map_err(|e| Usage(e.to_string()))?),
            "--header" => {
                let Some((name, v)) = value.split_once(':') else {
                    return Err(Usage(format!("not 'Name: value': {value:?}")));
                };
                op.header(name.trim(), v.trim())
            }
            other => return Err(Usage(format!("unknown option {other:?}"))),
        };
    }
    let op = journal.persist(op).await?;
    println!("persisted id={} key={}", op.id(), op.key());
    // The parent of this process may be waiting for that line.
    let _ = std::io::stdout().flush();
    Ok(report(&op, op.send().await))
}

fn report(op: &JournaledOperation, result: Result<Outcome, Error>) -> bool {
    match result {
        Ok(o) => {
            println!(
                "id={} key={} status={} replayed={} attempts={}",
                op.id(),
                o.key(),
                o.status().as_u16(),
                o.replayed(),
                o.attempts()
            );
            true
        }
        Err(e) => {
            println!("id={} key={} error={e}", op.id(), op.key());
            false
        }
    }
}
