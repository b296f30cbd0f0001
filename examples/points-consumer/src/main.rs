//! `points-consumer`: credits points from NATS JetStream to a SQLite ledger, exactly
//! once. See the README.

use std::path::PathBuf;
use std::time::Duration;

use idem_inbox::{Inbox, PurgeConfig, Purger};
use points_consumer::{Credit, Ledger, Names, credit_handler, ensure_stream, publish};

struct Args {
    db: PathBuf,
    nats: String,
    publish: Option<usize>,
    until_drained: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: points-consumer [--db PATH] [--nats URL] [--publish N] [--until-drained]\n\
         \n  --db PATH        the SQLite ledger (default points.db)\
         \n  --nats URL       the NATS server (default nats://127.0.0.1:4222)\
         \n  --publish N      first publish N credits, each twice\
         \n  --until-drained  stop when no message is left, instead of on Ctrl-C"
    );
    std::process::exit(64)
}

fn parse_args() -> Args {
    let mut args = Args {
        db: PathBuf::from("points.db"),
        nats: "nats://127.0.0.1:4222".to_owned(),
        publish: None,
        until_drained: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--db" => args.db = it.next().unwrap_or_else(|| usage()).into(),
            "--nats" => args.nats = it.next().unwrap_or_else(|| usage()),
            "--publish" => {
                let n = it.next().and_then(|n| n.parse().ok());
                args.publish = Some(n.unwrap_or_else(|| usage()));
            }
            "--until-drained" => args.until_drained = true,
            _ => usage(),
        }
    }
    args
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt().with_target(false).init();
    let args = parse_args();
    let client = async_nats::connect(&args.nats).await?;
    let js = async_nats::jetstream::new(client);
    let names = Names::default();
    ensure_stream(&js, &names).await?;

    if let Some(n) = args.publish {
        let credits: Vec<_> = (0..n)
            .map(|i| {
                let credit = Credit {
                    account: format!("acct-{}", i % 10),
                    points: (i % 5) as i64 + 1,
                };
                (format!("credit-{i}"), credit)
            })
            .collect();
        // The second round is a publisher's retry: JetStream drops it by Nats-Msg-Id.
        for round in ["first", "retry"] {
            let (stored, dropped) = publish(&js, &names, &credits).await?;
            println!("published ({round}): {stored} stored, {dropped} dropped as duplicates");
        }
    }

    let ledger = Ledger::open(&args.db).await?;
    let consumer = ledger.consumer(js, &names).await?;
    let _purger = Purger::spawn(
        std::sync::Arc::new(consumer.inbox().clone()),
        Duration::from_secs(3600),
        PurgeConfig::default(),
    );
    println!(
        "consuming {} into {} (retention {:?})",
        names.stream,
        args.db.display(),
        consumer.inbox().retention()
    );

    let mut watched = consumer.consumer().clone();
    let until_drained = args.until_drained;
    let stop = async move {
        if until_drained {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                match watched.info().await {
                    Ok(i) if i.num_pending == 0 && i.num_ack_pending == 0 => return,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "reading the consumer's state failed"),
                }
            }
        } else {
            let _ = tokio::signal::ctrl_c().await;
        }
    };
    let stats = consumer.run(credit_handler(), stop).await?;
    println!(
        "processed {}, skipped {} duplicates, {} failed",
        stats.processed, stats.duplicates, stats.failed
    );
    for (account, points) in ledger.balances().await? {
        println!("{account:<10} {points:>8}");
    }
    Ok(())
}
