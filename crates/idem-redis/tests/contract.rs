//! The idem-core store contract (SPEC S10) against the live Redis server.

use std::sync::Arc;

use idem_core::ManualClock;
use idem_core::testing::{service_unavailable, service_url};
use idem_redis::RedisStore;

async fn store(clock: ManualClock, ns: String) -> Option<RedisStore> {
    let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    match RedisStore::builder(url.as_str())
        .clock(Arc::new(clock))
        .key_prefix(format!("idem-test:{ns}:"))
        .connect()
        .await
    {
        Ok(store) => Some(store),
        Err(e) => service_unavailable("Redis", &url, &e),
    }
}

idem_core::store_contract_tests!(store);
