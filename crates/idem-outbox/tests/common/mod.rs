//! What the outbox's tests share: a broker in memory that records what it confirmed,
//! service connections, and the cases both SQL backends run.

#![allow(dead_code, unused_imports)]

pub mod cases;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_outbox::{Message, Publish, PublishError};
use idem_test_support::service_unavailable;
pub use idem_test_support::services::{nats_url, postgres_url};

/// A broker in memory: it confirms every message unless told to fail one once, to
/// refuse one, or to stop dead right after confirming (a relay killed between the
/// broker's confirmation and its mark).
#[derive(Clone, Default)]
pub struct FakeBroker {
    state: Arc<Mutex<FakeState>>,
    confirmed: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct FakeState {
    delivered: Vec<Message>,
    fail_once: HashSet<String>,
    refuse: HashSet<String>,
    hang_after_confirm: bool,
}

impl FakeBroker {
    pub fn delivered(&self) -> Vec<Message> {
        self.state.lock().unwrap().delivered.clone()
    }

    pub fn delivered_ids(&self) -> Vec<String> {
        self.delivered().into_iter().map(|m| m.id).collect()
    }

    pub fn fail_once(&self, id: &str) {
        self.state.lock().unwrap().fail_once.insert(id.to_owned());
    }

    pub fn refuse(&self, id: &str) {
        self.state.lock().unwrap().refuse.insert(id.to_owned());
    }

    pub fn hang_after_confirm(&self, on: bool) {
        self.state.lock().unwrap().hang_after_confirm = on;
    }

    /// Waits until a batch was confirmed.
    pub async fn wait_confirmed(&self) {
        self.confirmed.notified().await;
    }
}

impl Publish for FakeBroker {
    async fn publish_all<'a>(
        &'a self,
        messages: &'a [&'a Message],
    ) -> Vec<Result<(), PublishError>> {
        let (results, hang) = {
            let mut s = self.state.lock().unwrap();
            let results = messages
                .iter()
                .map(|m| {
                    if s.refuse.contains(&m.id) {
                        Err(PublishError::Refused(format!("{} is too large", m.id)))
                    } else if s.fail_once.remove(&m.id) {
                        Err(PublishError::Transient("connection reset".into()))
                    } else {
                        s.delivered.push((*m).clone());
                        Ok(())
                    }
                })
                .collect();
            (results, s.hang_after_confirm)
        };
        if hang {
            self.confirmed.notify_one();
            std::future::pending::<()>().await;
        }
        results
    }
}

/// A PostgreSQL pool, or `None` (skipped loudly) when the server is unreachable.
pub async fn pg_pool(max_connections: u32) -> Option<sqlx::PgPool> {
    let url = postgres_url();
    let connect = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => service_unavailable("PostgreSQL", &url, &e),
        Err(e) => service_unavailable("PostgreSQL", &url, &e),
    }
}

/// A MySQL or MariaDB pool (`IDEM_TEST_MYSQL_URL`), or `None` (skipped loudly) when
/// the server is unreachable.
#[cfg(feature = "mysql")]
pub async fn mysql_pool(max_connections: u32) -> Option<sqlx::MySqlPool> {
    let url = idem_test_support::services::mysql_url();
    let connect = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => service_unavailable("MySQL", &url, &e),
        Err(e) => service_unavailable("MySQL", &url, &e),
    }
}

/// The RabbitMQ URL: `IDEM_TEST_RABBITMQ_URL`, else the local server.
pub fn rabbitmq_url() -> String {
    idem_test_support::services::rabbitmq_url()
}

/// A table name unique to this test run (at most 36 bytes).
pub fn unique(case: &str) -> String {
    format!("ob_{}", idem_core::testing::unique_namespace(case))
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Wraps a shared publisher so that one broker can serve several relays.
pub struct Shared<P>(pub Arc<P>);

impl<P: Publish> Publish for Shared<P> {
    fn publish_all<'a>(
        &'a self,
        messages: &'a [&'a Message],
    ) -> impl std::future::Future<Output = Vec<Result<(), PublishError>>> + Send + 'a {
        self.0.publish_all(messages)
    }
}
