//! Sealed records over Redis (SPEC S17): the record's value, as `GET` and `DUMP` (what
//! an RDB file holds) return it, has no recorded body or header in plain text; the
//! sealing cases hold.

use std::sync::Arc;

use idem_core::testing::sealing::{self, KNOWN_BODY, KNOWN_HEADER, known_answer, ring};
use idem_core::{Reservation, Scope, Sealed, Store};
use idem_redis::RedisStore;
use idem_test_support::service_unavailable;
use idem_test_support::services::redis_url;

async fn store(ns: &str) -> Option<Arc<RedisStore>> {
    let url = redis_url();
    match RedisStore::builder()
        .key_prefix(format!("idem-test:{ns}:"))
        .connect(&url)
        .await
    {
        Ok(store) => Some(Arc::new(store)),
        Err(e) => service_unavailable("Redis", &url, &e),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The record's bytes as Redis returns them to `DUMP`, and as it returns its value;
/// the key is deleted afterwards.
async fn raw(store: &RedisStore, scope: &Scope) -> Vec<u8> {
    let mut conn = redis::Client::open(redis_url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = store.record_key(scope);
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut bytes: Vec<u8> = redis::cmd("DUMP")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let value: redis::Value = match kind.as_str() {
        "hash" => redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap(),
        _ => redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap(),
    };
    bytes.extend(format!("{value:?}").into_bytes());
    if let redis::Value::BulkString(v) = value {
        bytes.extend(v);
    }
    let _: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    bytes
}

#[tokio::test]
async fn the_record_holds_no_sealed_body_or_header() {
    let ns = idem_core::testing::unique_namespace("sealed_raw");
    let Some(inner) = store(&ns).await else {
        return;
    };
    // The control: unsealed, the value shows the body, so the search below can see it.
    let plain = sealing::record_known_answer(&*inner).await;
    let bytes = raw(&inner, &plain.scope).await;
    assert!(contains(&bytes, KNOWN_BODY) && contains(&bytes, KNOWN_HEADER));

    let sealed = Sealed::new(inner.clone(), ring("k1", 1));
    let request = sealing::record_known_answer(&sealed).await;
    match sealed.reserve(&request).await.unwrap() {
        Reservation::Replay(answer) => assert_eq!(answer, known_answer()),
        other => panic!("{other:?}"),
    }
    let bytes = raw(&inner, &request.scope).await;
    assert!(!bytes.is_empty());
    assert!(!contains(&bytes, KNOWN_BODY), "the body is in the value");
    assert!(
        !contains(&bytes, b"4242424242424242"),
        "the card is in the value"
    );
    assert!(!contains(&bytes, KNOWN_HEADER), "a header is in the value");
}

#[tokio::test]
async fn sealing_cases_hold_over_redis() {
    let ns = idem_core::testing::unique_namespace("sealed_cases");
    let Some(inner) = store(&ns).await else {
        return;
    };
    sealing::all(inner).await;
}
