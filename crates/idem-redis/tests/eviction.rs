//! The store reads the server's memory settings as it connects and says when they let
//! Redis evict records. The test sets them on the test server with `CONFIG SET` and puts
//! them back afterwards, panic or not; it is the only test in this binary, so no other
//! test of the crate runs while they are changed.

use idem_redis::RedisStore;
use idem_test_support::services::redis_url;
use idem_test_support::{figure, service_unavailable};
use redis::aio::ConnectionManager;

/// Puts `maxmemory` and `maxmemory-policy` back as they were when dropped.
struct Restore {
    url: String,
    settings: Vec<(String, String)>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        // A connection of its own, used synchronously: the test's runtime, which drives
        // the test's connections, is blocked in this drop.
        let connected = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection());
        let mut conn = match connected {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("could not reconnect to put the memory settings back: {e}");
                return;
            }
        };
        for (name, value) in &self.settings {
            let set: redis::RedisResult<()> = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query(&mut conn);
            if let Err(e) = set {
                eprintln!("could not put {name} back to {value}: {e}");
            }
        }
    }
}

async fn config_get(raw: &mut ConnectionManager, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(raw)
        .await
        .expect("CONFIG GET");
    pair.into_iter().nth(1).expect("a value")
}

async fn config_set(raw: &mut ConnectionManager, name: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(raw)
        .await
        .expect("CONFIG SET");
}

#[tokio::test]
async fn the_store_says_when_the_server_may_evict_its_records() {
    let url = redis_url();
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    let mut raw = match ConnectionManager::new(client).await {
        Ok(raw) => raw,
        Err(e) => {
            service_unavailable::<()>("Redis", &url, &e);
            return;
        }
    };
    let mut settings = Vec::new();
    for name in ["maxmemory", "maxmemory-policy"] {
        settings.push((name.to_owned(), config_get(&mut raw, name).await));
    }
    let _restore = Restore {
        url: url.clone(),
        settings,
    };

    // 4 GiB: far above anything the tests store, so nothing is evicted meanwhile.
    let bound = 4u64 << 30;
    for (maxmemory, policy, evicts) in [
        ("0", "allkeys-lru", false),
        ("4294967296", "noeviction", false),
        ("4294967296", "allkeys-lru", true),
        ("4294967296", "volatile-ttl", true),
    ] {
        config_set(&mut raw, "maxmemory", maxmemory).await;
        config_set(&mut raw, "maxmemory-policy", policy).await;
        let store = RedisStore::connect(&url).await.expect("connect");
        let risk = store.eviction_risk();
        assert_eq!(risk.is_some(), evicts, "{maxmemory} {policy}: {risk:?}");
        if let Some(risk) = risk {
            assert_eq!(risk.maxmemory, bound);
            assert_eq!(risk.policy, policy);
        }
        assert_eq!(
            figure(&store, "idem_redis_server_may_evict"),
            u64::from(evicts)
        );
    }
}
