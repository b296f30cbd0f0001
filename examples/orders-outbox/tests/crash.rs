//! The crash scenario at a small size (issue 41 §3): the service, the relay and the
//! consumer killed with SIGKILL at random points, twice each at least, while a client
//! sends orders with lost answers and retries; the books must be exact.

use orders_outbox::Broker;
use orders_outbox::scenario::{Binaries, Scenario, run};

fn bins() -> Binaries {
    Binaries {
        service: env!("CARGO_BIN_EXE_orders-outbox-service").into(),
        relay: env!("CARGO_BIN_EXE_orders-outbox-relay").into(),
        consumer: env!("CARGO_BIN_EXE_orders-outbox-consumer").into(),
    }
}

async fn reachable(broker: Broker, url: &str, port: u16) -> bool {
    let addr = idem_test_support::service_addr(url, port).await;
    match tokio::net::TcpStream::connect(addr).await {
        Ok(_) => true,
        Err(e) => idem_test_support::service_unavailable::<()>(broker.name(), url, &e).is_some(),
    }
}

async fn scenario(broker: Broker, url: String, port: u16) {
    if !reachable(broker, &url, port).await {
        return;
    }
    let scenario = Scenario::small(broker, url);
    let report = run(&scenario, &bins()).await.expect("the scenario ran");
    eprint!("{report}");
    assert!(report.is_exact(scenario.orders), "{report}");
    assert!(
        report.kills.iter().all(|&k| k >= scenario.kills_each),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_survive_kill_9_anywhere_through_jetstream() {
    scenario(Broker::Nats, idem_test_support::services::nats_url(), 4222).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_survive_kill_9_anywhere_through_rabbitmq() {
    let url = idem_test_support::services::rabbitmq_url();
    scenario(Broker::RabbitMq, url, 5672).await;
}
