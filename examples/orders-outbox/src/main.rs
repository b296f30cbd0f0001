//! `orders-outbox`: the crash scenario by hand, at the size you ask for.
//!
//! ```text
//! cargo build -p orders-outbox && cargo run -p orders-outbox -- nats 200 5
//! cargo run -p orders-outbox -- rabbitmq 200 5
//! ```
//!
//! Arguments: the broker (`nats` or `rabbitmq`), the orders (default 100), the kills
//! of each process (default 3). The broker's URL: `ORDERS_OUTBOX_BROKER_URL`, else the
//! local server. Exits non-zero unless the books are exact.

use orders_outbox::scenario::{Binaries, Scenario, run};
use orders_outbox::{BoxError, Broker};

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let broker = match args.first().map(String::as_str) {
        None | Some("nats") => Broker::Nats,
        Some("rabbitmq") => Broker::RabbitMq,
        Some(other) => return Err(format!("unknown broker {other:?}: nats or rabbitmq").into()),
    };
    let url = std::env::var(orders_outbox::env::BROKER_URL).unwrap_or_else(|_| match broker {
        Broker::Nats => "nats://127.0.0.1:4222".to_owned(),
        Broker::RabbitMq => "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
    });
    let mut scenario = Scenario::small(broker, url);
    scenario.orders = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(100);
    scenario.kills_each = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(3);
    scenario.deadline = std::time::Duration::from_secs(600);
    // About as long for the orders as for the kills.
    let kills = (scenario.kills_each * 3) as u32;
    scenario.pace = std::time::Duration::from_millis(450) * kills * scenario.concurrency as u32
        / scenario.orders.max(1) as u32;
    let report = run(&scenario, &Binaries::beside_current_exe()?).await?;
    print!("{report}");
    if report.is_exact(scenario.orders) {
        println!("exact: every order once, every event published and credited once");
        Ok(())
    } else {
        Err("the books are not exact".into())
    }
}
