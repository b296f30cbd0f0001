//! What `RedisStore` leaves in Redis: the key layout, the record's bytes, the native
//! TTLs, what it makes of a key holding something else (a record of the older hash
//! format among them), and that every script touches one key only (Redis Cluster
//! safety).

use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{
    Clock, Endpoint, FencingToken, Key, Lease, ManualClock, RecordState, Reservation,
    ReserveRequest, Scope, ScopeMode, Store, StoreError, StoredResponse, Tenant,
};
use idem_redis::{DEFAULT_TTL_GRACE, RedisStore};
use idem_test_support::service_unavailable;
use idem_test_support::services::redis_url;
use redis::aio::ConnectionManager;

struct Fixture {
    store: RedisStore,
    raw: ConnectionManager,
    clock: ManualClock,
}

async fn fixture(case: &str) -> Option<Fixture> {
    let url = redis_url();
    let clock = ManualClock::starting_now();
    let store = match RedisStore::builder()
        .clock(Arc::new(clock.clone()))
        .key_prefix(format!("idem-test:{}:", unique_namespace(case)))
        // Five times the default response timeout, so that a loaded machine does not
        // turn a slow answer into an outage.
        .timeout(Duration::from_secs(5))
        .connect(&url)
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

    /// The record's value as Redis holds it.
    async fn value(&self, scope: &Scope) -> Option<Vec<u8>> {
        redis::cmd("GET")
            .arg(self.store.record_key(scope))
            .query_async(&mut self.raw.clone())
            .await
            .expect("GET")
    }

    async fn key_type(&self, scope: &Scope) -> String {
        redis::cmd("TYPE")
            .arg(self.store.record_key(scope))
            .query_async(&mut self.raw.clone())
            .await
            .expect("TYPE")
    }
}

/// The bytes of an in-progress record's scope, as the layout puts them after the head:
/// three `u32` lengths, then the parts.
fn scope_bytes(scope: &Scope) -> Vec<u8> {
    let parts = [
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    ];
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
    }
    for part in parts {
        out.extend_from_slice(part.as_bytes());
    }
    out
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
async fn record_is_one_string_at_a_hash_tagged_key_in_the_documented_layout() {
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
    let now = f.clock.now().as_millis();
    let ttl = Duration::from_secs(100);
    let lease_for = Duration::from_secs(30);
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
        .ttl(ttl)
        .lease(lease_for);
    let lease = acquired(f.store.reserve(&req).await.expect("reserve"));
    assert_eq!(f.key_type(&scope).await, "string");
    let value = f.value(&scope).await.expect("stored");
    assert_eq!(&value[0..2], b"I1", "format");
    assert_eq!(value[2..10], lease.token.as_u64().to_be_bytes(), "token");
    let ms = |d: Duration| now + d.as_millis() as i64;
    assert_eq!(value[10..18], ms(ttl).to_be_bytes(), "expires_at");
    assert_eq!(value[18..26], ms(lease_for).to_be_bytes(), "lease_until");
    assert_eq!(value[26], b'P', "state");
    assert_eq!(value[27..35], now.to_be_bytes(), "created_at");
    assert_eq!(value[35..39], 1u32.to_be_bytes(), "attempt");
    assert_eq!(
        &value[39..71],
        test_fingerprint("{}").as_bytes(),
        "fingerprint"
    );
    let scope_part = scope_bytes(&scope);
    assert_eq!(&value[71..], &scope_part[..], "scope, and nothing after it");
    assert!(
        value.ends_with(b"POST /v1/orderslayout-key"),
        "the endpoint and the key read in plain text"
    );

    f.clock.advance(Duration::from_secs(2));
    let response = StoredResponse::new(201, vec![0u8, 1, 2, 255])
        .with_header("content-type", "application/octet-stream");
    f.store.complete(&lease, &response).await.expect("complete");
    let done = f.value(&scope).await.expect("stored");
    // The head up to the lease is kept, and from the state on but for the state itself.
    assert_eq!(done[..18], value[..18]);
    assert_eq!(
        done[18..26],
        (now + 2_000).to_be_bytes(),
        "completed_at where the lease was"
    );
    assert_eq!(done[26], b'C', "state");
    assert_eq!(done[27..value.len()], value[27..]);
    // Then the answer: status, headers with their length, and the body to the end.
    let answer = &done[value.len()..];
    assert_eq!(answer[0..2], 201u16.to_be_bytes());
    let headers = idem_core::codec::encode_headers(&response.headers);
    assert_eq!(answer[2..6], (headers.len() as u32).to_be_bytes());
    assert_eq!(&answer[6..6 + headers.len()], &headers[..]);
    assert_eq!(&answer[6 + headers.len()..], [0, 1, 2, 255]);
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

/// Completing brings a record that a renewal kept alive past its TTL back to creation
/// + TTL, natively too, so Redis does not hold the answer for the lease's extra time.
#[tokio::test]
async fn native_ttl_returns_to_creation_plus_ttl_on_completion() {
    let Some(f) = fixture("native_ttl_completion").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "ttl-complete-key");
    let (ttl, lease) = (Duration::from_secs(100), Duration::from_secs(30));
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
        .ttl(ttl)
        .lease(lease);
    let start = f.clock.now();
    let first = acquired(f.store.reserve(&req).await.expect("reserve"));
    f.clock.advance(Duration::from_secs(90));
    f.store.renew(&first, lease).await.expect("renew");
    assert_ttl_near(f.pttl(&scope).await, lease + DEFAULT_TTL_GRACE);
    f.clock.advance(Duration::from_secs(5));
    f.store
        .complete(&first, &StoredResponse::new(201, "done"))
        .await
        .expect("complete");
    let record = f.store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.expires_at, start.plus(ttl));
    assert_ttl_near(
        f.pttl(&scope).await,
        Duration::from_secs(5) + DEFAULT_TTL_GRACE,
    );
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
    let value = f.value(&scope).await.expect("stored");
    assert_eq!(value[26], b'P');
    assert_eq!(
        &value[71..],
        &scope_bytes(&scope)[..],
        "nothing of the old answer survives"
    );
    let record = f.store.get(&scope).await.expect("get").expect("stored");
    assert_eq!(record.created_at, f.clock.now());
    assert!(matches!(record.state, RecordState::InProgress { .. }));
    f.store.remove(&scope).await.expect("clean up");
}

/// A lease for `scope` that the store never handed out, to aim complete, renew and
/// release at whatever the key holds.
fn stray_lease(scope: &Scope) -> Lease {
    Lease {
        scope: scope.clone(),
        token: FencingToken::generate(),
        fingerprint: idem_core::testing::test_fingerprint("{}"),
        attempt: 1,
        ttl: idem_core::DEFAULT_TTL,
        tombstone: std::time::Duration::ZERO,
    }
}

/// Every operation on a key that does not hold a record of this store fails as
/// corrupt, never as unavailable and never with a reservation; purge leaves the key
/// alone and remove deletes it.
async fn assert_every_operation_is_corrupt(f: &Fixture, scope: &Scope, why: &str) {
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    let corrupt = |what: &str, result: Result<(), StoreError>| match result {
        Err(StoreError::Corrupt(message)) => assert!(
            message.contains(why),
            "{what}: the message does not say {why:?}: {message}"
        ),
        other => panic!("{what}: expected corrupt, got {other:?}"),
    };
    corrupt(
        "reserve",
        f.store.reserve(&req).await.map(|r| panic!("{r:?}")),
    );
    corrupt("get", f.store.get(scope).await.map(|r| panic!("{r:?}")));
    let lease = stray_lease(scope);
    corrupt(
        "complete",
        f.store
            .complete(&lease, &StoredResponse::new(200, "x"))
            .await,
    );
    corrupt(
        "renew",
        f.store.renew(&lease, Duration::from_secs(60)).await,
    );
    corrupt("release", f.store.release(&lease).await);
    // Purge skips it rather than failing, however late it is.
    f.clock.advance(Duration::from_secs(3600 * 48));
    assert_eq!(f.store.purge_expired(10).await.expect("purge"), 0);
    assert!(f.store.remove(scope).await.expect("remove"));
}

#[tokio::test]
async fn foreign_value_at_a_record_key_is_corrupt_not_unavailable() {
    let Some(f) = fixture("foreign").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "foreign-key");
    let () = redis::cmd("SET")
        .arg(f.store.record_key(&scope))
        .arg("not a record, though long enough to hold the head of one, which is 83 bytes")
        .arg("EX")
        .arg(60)
        .query_async(&mut f.raw.clone())
        .await
        .expect("SET");
    assert_every_operation_is_corrupt(&f, &scope, "not a record").await;
}

/// Records of the format before this one were hashes; a store of this version meeting
/// one (a deployment that kept its key prefix) reports the key as corrupt, naming the
/// older format, and leaves it as it was.
#[tokio::test]
async fn record_of_the_older_hash_format_is_corrupt_never_acquired() {
    let Some(f) = fixture("old_hash").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "old-hash-key");
    let key = f.store.record_key(&scope);
    let now = f.clock.now().as_millis();
    let mut raw = f.raw.clone();
    let () = redis::cmd("HSET")
        .arg(&key)
        .arg("tenant")
        .arg(scope.tenant().as_str())
        .arg("endpoint")
        .arg(scope.endpoint_str())
        .arg("key")
        .arg(scope.key().as_str())
        .arg("fingerprint")
        .arg(test_fingerprint("{}").as_bytes().as_slice())
        .arg("created_at")
        .arg(now)
        .arg("expires_at")
        .arg(now + 86_400_000)
        .arg("lease_until")
        .arg(now - 1)
        .arg("attempt")
        .arg(1)
        .arg("token")
        .arg(42)
        .arg("state")
        .arg("in_progress")
        .query_async::<i64>(&mut raw)
        .await
        .map(drop)
        .expect("HSET");
    let () = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(60_000)
        .query_async::<i64>(&mut raw)
        .await
        .map(drop)
        .expect("PEXPIRE");
    let before: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .expect("HGETALL");

    // Its lease lapsed with the same payload, which the old store would have taken
    // over: this one must not acquire, nor write.
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    match f.store.reserve(&req).await {
        Err(StoreError::Corrupt(message)) => {
            assert!(message.contains("older format"), "{message}")
        }
        other => panic!("expected corrupt, got {other:?}"),
    }
    let after: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .expect("HGETALL");
    assert_eq!(after, before, "the old record is left as it was");
    assert_eq!(f.key_type(&scope).await, "hash");

    assert_every_operation_is_corrupt(&f, &scope, "older format").await;
}

/// The compare-and-set a reserve takes over with: it writes only over the exact head it
/// was given, so of two callers that read the same record, the second finds it changed.
#[tokio::test]
async fn take_over_replaces_only_the_version_it_read() {
    let Some(f) = fixture("take_over").await else {
        return;
    };
    let take_over = redis::Script::new(include_str!("../scripts/take_over.lua"));
    let scope = test_scope("/v1/charges", "cas-key");
    let key = f.store.record_key(&scope);
    let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"));
    acquired(f.store.reserve(&req).await.expect("reserve"));
    let read = f.value(&scope).await.expect("stored");
    let head = &read[..71];
    let mut raw = f.raw.clone();
    let pttl_before = f.pttl(&scope).await;

    let mut stale = head.to_vec();
    stale[9] ^= 1; // another token
    let replaced: i64 = take_over
        .key(&key)
        .arg(stale)
        .arg("changed")
        .arg("")
        .invoke_async(&mut raw)
        .await
        .expect("take_over");
    assert_eq!(replaced, 0);
    assert_eq!(f.value(&scope).await.expect("kept"), read);

    let replaced: i64 = take_over
        .key(&key)
        .arg(head)
        .arg("first")
        .arg("")
        .invoke_async(&mut raw)
        .await
        .expect("take_over");
    assert_eq!(replaced, 1);
    assert_eq!(f.value(&scope).await.expect("replaced"), b"first");
    let pttl = f.pttl(&scope).await;
    assert!(pttl > 0 && pttl <= pttl_before, "the TTL is kept: {pttl}");

    // The second caller read the same record; the first one's write fences it out.
    let replaced: i64 = take_over
        .key(&key)
        .arg(head)
        .arg("second")
        .arg(5_000)
        .invoke_async(&mut raw)
        .await
        .expect("take_over");
    assert_eq!(replaced, 0);
    assert_eq!(f.value(&scope).await.expect("kept"), b"first");

    // Gone is changed too: nothing is written at a free key.
    f.store.remove(&scope).await.expect("remove");
    let replaced: i64 = take_over
        .key(&key)
        .arg(head)
        .arg("third")
        .arg(5_000)
        .invoke_async(&mut raw)
        .await
        .expect("take_over");
    assert_eq!(replaced, 0);
    assert_eq!(f.value(&scope).await, None);
}

/// Redis Cluster runs a script only when all its keys hash to one slot. Each touches
/// only the keys it is given, never building a key name: `KEYS[1]`, the record's, and
/// for the two that write or read a tombstone `KEYS[2]`, the tombstone's, which has the
/// record's hash tag ([`tombstone_key_shares_the_records_slot`]).
#[test]
fn every_script_touches_only_its_declared_keys() {
    let scripts = [
        (include_str!("../scripts/take_over.lua"), 1),
        (include_str!("../scripts/complete.lua"), 2),
        (include_str!("../scripts/renew.lua"), 1),
        (include_str!("../scripts/release.lua"), 1),
        (include_str!("../scripts/purge.lua"), 1),
        (include_str!("../scripts/reserve_tombstoned.lua"), 2),
    ];
    for (script, keys) in scripts {
        let code: String = script
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        let declared = |arg: &str| (1..=keys).any(|k| arg.starts_with(&format!("KEYS[{k}]")));
        let mut rest = code.as_str();
        let mut uses = 0;
        while let Some(at) = rest.find("KEYS[") {
            assert!(
                declared(&rest[at..]),
                "a script touches another key: {}",
                &rest[at..at + 8]
            );
            uses += 1;
            rest = &rest[at + 5..];
        }
        assert!(uses > 0);
        // Every redis.call's key argument is a declared key. A PUBLISH names a channel,
        // not a key, and is sent on one server only: the store passes no channel on a
        // cluster.
        for call in code.split("redis.call(").skip(1) {
            if call.starts_with("'PUBLISH'") {
                continue;
            }
            let args: Vec<&str> = call.splitn(3, ',').collect();
            if args.len() > 1 {
                assert!(
                    declared(args[1].trim()),
                    "redis.call({call:.40}…) does not name a declared key"
                );
            }
        }
    }
}

/// The tombstone's key is the record's with a suffix outside the braces: the same hash
/// tag, so the same Redis Cluster slot, and a name no record key can have.
#[tokio::test]
async fn tombstone_key_shares_the_records_slot() {
    let Some(f) = fixture("tombstone_key").await else {
        return;
    };
    let scope = test_scope("/v1/charges", "k");
    let (record, tombstone) = (f.store.record_key(&scope), f.store.tombstone_key(&scope));
    assert_eq!(tombstone, format!("{record}t"));
    let tag = |key: &str| key[key.find('{').unwrap()..=key.find('}').unwrap()].to_owned();
    assert_eq!(tag(&record), tag(&tombstone));
    assert!(record.ends_with('}'));
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
