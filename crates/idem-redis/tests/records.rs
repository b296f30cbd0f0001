//! What `RedisStore` leaves in Redis: the key layout, the hash fields, the native TTLs,
//! and that every script touches one key only (Redis Cluster safety).

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{
    service_unavailable, service_url, test_fingerprint, test_scope, unique_namespace,
};
use idem_core::{
    Clock, Endpoint, Key, ManualClock, RecordState, Reservation, ReserveRequest, Scope, ScopeMode,
    Store, StoreError, StoredResponse, Tenant,
};
use idem_redis::{DEFAULT_TTL_GRACE, RedisStore};
use redis::aio::ConnectionManager;

struct Fixture {
    store: RedisStore,
    raw: ConnectionManager,
    clock: ManualClock,
}

async fn fixture(case: &str) -> Option<Fixture> {
    let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let clock = ManualClock::starting_now();
    let store = match RedisStore::builder(url.as_str())
        .clock(Arc::new(clock.clone()))
        .key_prefix(format!("idem-test:{}:", unique_namespace(case)))
        .connect()
        .await
    {
        Ok(s) => s,
        Err(e) => return service_unavailable("Redis", &url, &e),
    };
    let client = redis::Client::open(url.as_str()).expect("URL");
    let raw = ConnectionManager::new(client)
        .await
        .expect("raw connection");
    Some(Fixture { store, raw, clock })
}

impl Fixture {
    async fn pttl(&self, scope: &Scope) -> i64 {
        redis::cmd("PTTL")
            .arg(self.store.record_key(scope))
            .query_async(&mut self.raw.clone())
            .await
            .expect("PTTL")
    }

    async fn fields(&self, scope: &Scope) -> Vec<String> {
        let mut names: Vec<String> = redis::cmd("HKEYS")
            .arg(self.store.record_key(scope))
            .query_async(&mut self.raw.clone())
            .await
            .expect("HKEYS");
        names.sort();
        names
    }

    async fn field(&self, scope: &Scope, name: &str) -> Option<Vec<u8>> {
        redis::cmd("HGET")
            .arg(self.store.record_key(scope))
            .arg(name)
            .query_async(&mut self.raw.clone())
            .await
            .expect("HGET")
    }
}

fn acquired(r: Reservation) -> idem_core::Lease {
    match r {
        Reservation::Acquired(l) => l,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// Asserts a native TTL of `expected` give or take the real time the test took.
fn assert_ttl_near(pttl: i64, expected: Duration) {
    let expected = expected.as_millis() as i64;
    assert!(
        pttl <= expected && pttl > expected - 5_000,
        "PTTL {pttl} ms, expected about {expected} ms"
    );
}

#[tokio::test]
async fn record_is_one_hash_tagged_key_with_readable_scope_fields() {
    let Some(f) = fixture("layout").await else {
        return;
    };
    let scope = test_scope("/v1/orders", "layout-key");
    let key = f.store.record_key(&scope);
    assert_eq!(
        key,
        format!("{}{{{}}}", f.store.key_prefix(), scope.digest()),
        "the digest is the cluster hash tag"
    );
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    let lease = acquired(f.store.reserve(&req).await.expect("reserve"));
    assert_eq!(
        f.fields(&scope).await,
        [
            "attempt",
            "created_at",
            "endpoint",
            "expires_at",
            "fingerprint",
            "key",
            "lease_until",
            "state",
            "tenant",
            "token"
        ]
    );
    assert_eq!(
        f.field(&scope, "tenant").await.expect("tenant"),
        scope.tenant().as_str().as_bytes()
    );
    assert_eq!(
        f.field(&scope, "endpoint").await.expect("endpoint"),
        b"POST /v1/orders"
    );
    assert_eq!(f.field(&scope, "key").await.expect("key"), b"layout-key");
    assert_eq!(
        f.field(&scope, "fingerprint").await.expect("fingerprint"),
        test_fingerprint("{}").as_bytes()
    );
    assert_eq!(
        f.field(&scope, "state").await.expect("state"),
        b"in_progress"
    );

    let response = StoredResponse::new(201, vec![0u8, 1, 2, 255])
        .with_header("content-type", "application/octet-stream");
    f.store.complete(&lease, &response).await.expect("complete");
    assert_eq!(
        f.fields(&scope).await,
        [
            "attempt",
            "body",
            "completed_at",
            "created_at",
            "endpoint",
            "expires_at",
            "fingerprint",
            "headers",
            "key",
            "state",
            "status",
            "tenant",
            "token"
        ]
    );
    assert_eq!(f.field(&scope, "body").await.expect("body"), [0, 1, 2, 255]);
    assert_eq!(f.field(&scope, "status").await.expect("status"), b"201");
    f.store.remove(&scope).await.expect("clean up");
}

#[tokio::test]
async fn internal_mode_record_reads_back_without_endpoint() {
    let Some(f) = fixture("internal").await else {
        return;
    };
    let scope = Scope::new(
        ScopeMode::Internal,
        Tenant::new(unique_namespace("tenant")),
        Endpoint::new("POST", "/ignored"),
        Key::new("internal-key").expect("key"),
    );
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    acquired(f.store.reserve(&req).await.expect("reserve"));
    let record = f.store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.scope, scope);
    assert_eq!(record.scope.endpoint(), None);
    f.store.remove(&scope).await.expect("clean up");
}

#[tokio::test]
async fn native_ttl_follows_expiry_plus_grace_through_renew_and_takeover() {
    let Some(f) = fixture("native_ttl").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "ttl-key");
    let ttl = Duration::from_secs(100);
    let lease = Duration::from_secs(30);
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
        .ttl(ttl)
        .lease(lease);
    let first = acquired(f.store.reserve(&req).await.expect("reserve"));
    assert_ttl_near(f.pttl(&scope).await, ttl + DEFAULT_TTL_GRACE);

    // A renewal that outlives the record pushes its expiry, natively too.
    f.clock.advance(Duration::from_secs(90));
    f.store.renew(&first, lease).await.expect("renew");
    let record = f.store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.expires_at, f.clock.now().plus(lease));
    assert_ttl_near(f.pttl(&scope).await, lease + DEFAULT_TTL_GRACE);

    f.store.remove(&scope).await.expect("clean up");

    // So does a takeover whose lease outlives the record; it keeps created_at.
    let scope = test_scope("/v1/charges", "ttl-takeover-key");
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
        .ttl(ttl)
        .lease(lease);
    let start = f.clock.now();
    acquired(f.store.reserve(&req).await.expect("reserve"));
    f.clock.advance(Duration::from_secs(80));
    let second = acquired(f.store.reserve(&req).await.expect("reserve"));
    assert_eq!(second.attempt, 2);
    let record = f.store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.created_at, start);
    assert_eq!(record.expires_at, f.clock.now().plus(lease));
    assert_ttl_near(f.pttl(&scope).await, lease + DEFAULT_TTL_GRACE);
    f.store.remove(&scope).await.expect("clean up");
}

#[tokio::test]
async fn expired_record_is_replaced_whole_without_its_old_answer() {
    let Some(f) = fixture("replace").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "replace-key");
    let ttl = Duration::from_secs(10);
    let req = ReserveRequest::new(scope.clone(), test_fingerprint(r#"{"a":1}"#))
        .ttl(ttl)
        .lease(Duration::from_secs(5));
    let old = acquired(f.store.reserve(&req).await.expect("reserve"));
    f.store
        .complete(&old, &StoredResponse::new(200, "old answer"))
        .await
        .expect("complete");
    f.clock.advance(ttl);
    let again = ReserveRequest::new(scope.clone(), test_fingerprint(r#"{"a":2}"#));
    let new = acquired(f.store.reserve(&again).await.expect("reserve"));
    assert_eq!(new.attempt, 1);
    for stale in ["body", "status", "headers", "completed_at"] {
        assert_eq!(f.field(&scope, stale).await, None, "{stale} survived");
    }
    let record = f.store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.created_at, f.clock.now());
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    f.store.remove(&scope).await.expect("clean up");
}

#[tokio::test]
async fn foreign_value_at_a_record_key_is_corrupt_not_unavailable() {
    let Some(f) = fixture("foreign").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "foreign-key");
    let () = redis::cmd("SET")
        .arg(f.store.record_key(&scope))
        .arg("not a record")
        .arg("EX")
        .arg(60)
        .query_async(&mut f.raw.clone())
        .await
        .expect("SET");
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    assert!(matches!(
        f.store.reserve(&req).await,
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        f.store.get(&scope).await,
        Err(StoreError::Corrupt(_))
    ));
    // Purge skips it rather than failing.
    f.clock.advance(Duration::from_secs(3600 * 48));
    assert_eq!(f.store.purge_expired(10).await.expect("purge"), 0);
    assert!(f.store.remove(&scope).await.expect("remove"));
}

/// Redis Cluster runs a script only when all its keys hash to one slot; these touch
/// exactly one, declared as `KEYS[1]`, and never build key names.
#[test]
fn every_script_touches_only_its_one_declared_key() {
    let scripts = [
        include_str!("../scripts/reserve.lua"),
        include_str!("../scripts/complete.lua"),
        include_str!("../scripts/renew.lua"),
        include_str!("../scripts/release.lua"),
        include_str!("../scripts/purge.lua"),
    ];
    for script in scripts {
        let code: String = script
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut rest = code.as_str();
        let mut uses = 0;
        while let Some(at) = rest.find("KEYS[") {
            assert!(
                rest[at..].starts_with("KEYS[1]"),
                "a script touches another key: {}",
                &rest[at..at + 8]
            );
            uses += 1;
            rest = &rest[at + 5..];
        }
        assert!(uses > 0);
        // Every redis.call's key argument is KEYS[1].
        for call in code.split("redis.call(").skip(1) {
            let args: Vec<&str> = call.splitn(3, ',').collect();
            if args.len() > 1 {
                assert!(
                    args[1].trim().starts_with("KEYS[1]"),
                    "redis.call({call:.40}…) does not name KEYS[1]"
                );
            }
        }
    }
}

#[tokio::test]
async fn unbounded_ttl_still_gets_a_native_expiry() {
    let Some(f) = fixture("unbounded").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "forever-key");
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}")).ttl(Duration::MAX);
    let lease = acquired(f.store.reserve(&req).await.expect("reserve"));
    f.store
        .complete(&lease, &StoredResponse::new(200, "kept"))
        .await
        .expect("complete");
    assert!(
        f.pttl(&scope).await > 0,
        "a record without a TTL would never leave"
    );
    f.clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    assert_eq!(
        f.store.reserve(&req).await.expect("reserve"),
        Reservation::Replay(StoredResponse::new(200, "kept"))
    );
    f.store.remove(&scope).await.expect("clean up");
}
