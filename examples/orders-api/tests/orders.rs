//! The orders API end to end over a real SQLite file: the key answers retries while its
//! record lives (SPEC S5), the order number answers them after it expired (S8), and the
//! order and the key's completion commit together or not at all (S9).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::ManualClock;
use idem_outbox::Outbox;
use idem_sqlite::SqliteStore;
use idem_tower::{Observer, Outcome};
use orders_api::{CRASH_EXIT_CODE, DEFAULT_KEY_TTL, DEFAULT_LEASE, ORDER_NUMBER_TAKEN, Settings};
use serde_json::{Value, json};
use tower::ServiceExt;

/// Every request in these tests answers well within this, or the test fails.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// Counts the layer's outcomes: `executed` and `released` are runs of the handler.
#[derive(Default)]
struct Outcomes(Mutex<HashMap<&'static str, usize>>);

impl Observer for Outcomes {
    fn outcome(&self, outcome: Outcome) {
        *self.0.lock().unwrap().entry(outcome.as_str()).or_default() += 1;
    }
}

impl Outcomes {
    fn count(&self, outcome: Outcome) -> usize {
        self.0
            .lock()
            .unwrap()
            .get(outcome.as_str())
            .copied()
            .unwrap_or(0)
    }

    /// How many times a handler ran, whatever it answered.
    fn handler_runs(&self) -> usize {
        self.count(Outcome::Executed) + self.count(Outcome::Released)
    }
}

struct Api {
    router: Router,
    store: SqliteStore,
    clock: ManualClock,
    outcomes: Arc<Outcomes>,
    _dir: tempfile::TempDir,
}

/// One answer, read whole.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    location: Option<String>,
    retry_after: Option<String>,
    body: Value,
}

impl Api {
    async fn new() -> Api {
        Api::on(tempfile::tempdir().unwrap()).await
    }

    /// The API over `orders.db` in `dir`, which may hold what an earlier process left.
    async fn on(dir: tempfile::TempDir) -> Api {
        Api::with(dir, Settings::default()).await
    }

    async fn with(dir: tempfile::TempDir, settings: Settings) -> Api {
        let url = db_url(&dir);
        let clock = ManualClock::starting_now();
        let store = orders_api::open(&url, Arc::new(clock.clone()))
            .await
            .unwrap();
        let outcomes = Arc::new(Outcomes::default());
        let settings = Settings {
            observer: Some(outcomes.clone()),
            ..settings
        };
        let (router, _) = orders_api::app(store.clone(), settings);
        Api {
            router,
            store,
            clock,
            outcomes,
            _dir: dir,
        }
    }

    async fn send(&self, request: Request<Body>) -> Answer {
        let response = tokio::time::timeout(ANSWER_WITHIN, self.router.clone().oneshot(request))
            .await
            .expect("answered in time")
            .unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let (status, location, retry_after) =
            (response.status(), header("location"), header("retry-after"));
        let replayed = header("idempotent-replayed").is_some_and(|v| v == "true");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Answer {
            status,
            replayed,
            location,
            retry_after,
            body,
        }
    }

    async fn create(&self, key: Option<&str>, order: &Value) -> Answer {
        self.send(order_request(key, None, order)).await
    }

    async fn scalar(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    async fn orders(&self) -> i64 {
        self.scalar("SELECT count(*) FROM orders").await
    }

    /// `order.created` events staged in the outbox.
    async fn events(&self) -> i64 {
        self.scalar("SELECT count(*) FROM idem_outbox").await
    }

    /// Key records in the file, live or not.
    async fn key_records(&self) -> i64 {
        self.scalar("SELECT count(*) FROM idem_records").await
    }
}

fn db_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("orders.db").display())
}

fn order_request(key: Option<&str>, authorization: Option<&str>, order: &Value) -> Request<Body> {
    let mut builder = Request::post("/v1/orders").header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    if let Some(authorization) = authorization {
        builder = builder.header("authorization", authorization);
    }
    builder.body(Body::from(order.to_string())).unwrap()
}

fn tea(order_number: &str) -> Value {
    json!({ "order_number": order_number, "sku": "tea", "qty": 2, "amount_cents": 1200 })
}

#[tokio::test]
async fn a_new_order_its_key_and_its_event_commit_together_and_a_replay_stages_nothing() {
    let api = Api::new().await;
    let first = api.create(Some("k-ev"), &tea("A-1001")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let staged = orders_api::outbox(api.store.pool())
        .claim("test", 10)
        .await
        .unwrap()
        .1;
    assert_eq!(staged.len(), 1);
    let event = &staged[0].message;
    assert_eq!(event.id, "order-1.created");
    assert_eq!(
        event.destination,
        idem_outbox::Destination::subject(orders_api::ORDER_CREATED)
    );
    let body: Value = serde_json::from_slice(&event.body).unwrap();
    assert_eq!(
        (body["order_id"].clone(), body["amount_cents"].clone()),
        (json!(1), json!(1200))
    );
    // The replay and a duplicate under another key (the order number answers it) stage
    // nothing more.
    assert!(api.create(Some("k-ev"), &tea("A-1001")).await.replayed);
    assert_eq!(
        api.create(Some("k-ev2"), &tea("A-1001")).await.status,
        StatusCode::OK
    );
    assert_eq!(api.events().await, 1);
}

#[tokio::test]
async fn first_request_creates_one_order() {
    let api = Api::new().await;
    let first = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!((first.status, first.replayed), (StatusCode::CREATED, false));
    assert_eq!(first.location.as_deref(), Some("/v1/orders/1"));
    assert_eq!(
        first.body,
        json!({ "id": 1, "order_number": "A-1001", "sku": "tea", "qty": 2,
                "amount_cents": 1200, "status": "created" })
    );
    assert_eq!(api.orders().await, 1);
    assert_eq!(api.outcomes.handler_runs(), 1);
    // The key's record was completed with that answer.
    assert_eq!(
        api.scalar("SELECT count(*) FROM idem_records WHERE state = 'completed' AND status = 201")
            .await,
        1
    );
}

#[tokio::test]
async fn retry_with_the_key_replays_without_running_the_handler() {
    let api = Api::new().await;
    let first = api.create(Some("k-1"), &tea("A-1001")).await;
    // Keys reordered: the same JSON, so the same request.
    let same = json!({ "amount_cents": 1200, "qty": 2, "sku": "tea", "order_number": "A-1001" });
    let retry = api.create(Some("k-1"), &same).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, true));
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.location, first.location);
    assert_eq!(api.orders().await, 1);
    assert_eq!(api.outcomes.handler_runs(), 1, "the handler ran once");
    assert_eq!(api.outcomes.count(Outcome::Replayed), 1);
}

#[tokio::test]
async fn reused_key_with_another_order_number_is_422_while_the_key_lives() {
    let api = Api::new().await;
    api.create(Some("k-1"), &tea("A-1001")).await;
    api.clock.advance(DEFAULT_KEY_TTL - Duration::from_secs(1));
    let reused = api.create(Some("k-1"), &tea("A-1002")).await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.body["type"], "https://idem.dev/problems/key-reused");
    assert_eq!(api.orders().await, 1);
    assert_eq!(api.outcomes.handler_runs(), 1);
    assert_eq!(api.events().await, 1);
}

#[tokio::test]
async fn retry_after_key_expiry_answers_with_the_existing_order() {
    let api = Api::new().await;
    let first = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!(first.status, StatusCode::CREATED);

    // The record expires; the client's retry (its first answer was lost) runs the
    // handler again, and the order number's unique constraint answers it.
    api.clock
        .advance(DEFAULT_KEY_TTL + Duration::from_millis(1));
    let late = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!((late.status, late.replayed), (StatusCode::OK, false));
    assert_eq!(late.body, first.body, "the order as first created");
    assert_eq!(late.location, first.location);
    assert_eq!(api.orders().await, 1, "no second order");
    assert_eq!(api.outcomes.handler_runs(), 2, "the handler ran again");

    // That answer is the key's new record: the next retry replays it.
    let again = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!((again.status, again.replayed), (StatusCode::OK, true));
    assert_eq!(again.body, first.body);
    assert_eq!(api.outcomes.handler_runs(), 2);
    assert_eq!(api.orders().await, 1);
}

#[tokio::test]
async fn key_ttl_shorter_than_the_lease_expires_the_answer_on_time() {
    let key_ttl = Duration::from_secs(10);
    assert!(key_ttl < DEFAULT_LEASE);
    let settings = Settings {
        key_ttl,
        ..Settings::default()
    };
    let api = Api::with(tempfile::tempdir().unwrap(), settings).await;
    let first = api.create(Some("k-1"), &tea("A-1001")).await;
    api.clock.advance(key_ttl - Duration::from_millis(1));
    let replay = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!(
        (replay.status, replay.replayed),
        (StatusCode::CREATED, true)
    );
    api.clock.advance(Duration::from_millis(1));
    let late = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!((late.status, late.replayed), (StatusCode::OK, false));
    assert_eq!(late.body, first.body);
    assert_eq!(api.orders().await, 1);
    assert_eq!(api.outcomes.handler_runs(), 2);
}

#[tokio::test]
async fn order_number_of_another_order_is_409_and_releases_the_key() {
    let api = Api::new().await;
    api.create(Some("k-1"), &tea("A-1001")).await;
    // A duplicate under another key: answered with order 1.
    let duplicate = api.create(Some("k-2"), &tea("A-1001")).await;
    assert_eq!(duplicate.status, StatusCode::OK);
    api.clock
        .advance(DEFAULT_KEY_TTL + Duration::from_millis(1));
    let other = json!({ "order_number": "A-1001", "sku": "tea", "qty": 3, "amount_cents": 1800 });
    let taken = api.create(Some("k-1"), &other).await;
    assert_eq!(taken.status, StatusCode::CONFLICT);
    assert_eq!(taken.body["type"], ORDER_NUMBER_TAKEN);
    assert_eq!(api.orders().await, 1);
    // Released, not recorded: the corrected request may use the key.
    assert_eq!(api.outcomes.count(Outcome::Released), 1);
    let fixed = json!({ "order_number": "A-1002", "sku": "tea", "qty": 3, "amount_cents": 1800 });
    let created = api.create(Some("k-1"), &fixed).await;
    assert_eq!(
        (created.status, created.replayed),
        (StatusCode::CREATED, false)
    );
    assert_eq!(created.body["id"], 2, "a conflicting insert takes no id");
    assert_eq!(api.orders().await, 2);
}

#[tokio::test]
async fn failure_after_the_insert_leaves_no_order_and_releases_the_key() {
    let api = Api::new().await;
    // Completing a key fails (as a full disk would) after the handler inserted its
    // order in the same transaction.
    sqlx::query(
        "CREATE TRIGGER fail_completion BEFORE UPDATE ON idem_records
         WHEN NEW.state = 'completed'
         BEGIN SELECT RAISE(ABORT, 'disk full'); END",
    )
    .execute(api.store.pool())
    .await
    .unwrap();
    let failed = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed.retry_after.as_deref(), Some("1"));
    assert_eq!(
        api.orders().await,
        0,
        "the order rolled back with the completion"
    );
    assert_eq!(api.key_records().await, 0, "the key was released");
    assert_eq!(api.outcomes.count(Outcome::Released), 1);

    sqlx::query("DROP TRIGGER fail_completion")
        .execute(api.store.pool())
        .await
        .unwrap();
    let retry = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, false));
    assert_eq!(retry.body["id"], 1, "the rolled-back order left no trace");
    assert_eq!(api.orders().await, 1);
    assert_eq!(api.outcomes.handler_runs(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_under_different_keys_make_one_order() {
    let api = Api::new().await;
    const CLIENTS: usize = 8;
    let answers: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let router = api.router.clone();
            let request = order_request(Some(&format!("k-{i}")), None, &tea("A-1001"));
            tokio::spawn(async move {
                let response = tokio::time::timeout(ANSWER_WITHIN, router.oneshot(request))
                    .await
                    .expect("answered in time")
                    .unwrap();
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, serde_json::from_slice::<Value>(&body).unwrap())
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for answer in answers {
        let (status, body) = answer.await.unwrap();
        assert_eq!(
            body["id"], 1,
            "every client is told of the one order: {body}"
        );
        statuses.push(status);
    }
    statuses.sort();
    let mut expected = vec![StatusCode::OK; CLIENTS - 1];
    expected.push(StatusCode::CREATED);
    assert_eq!(statuses, expected, "one created it, the others found it");
    assert_eq!(api.orders().await, 1);
    assert_eq!(api.outcomes.handler_runs(), CLIENTS);
}

#[tokio::test]
async fn order_numbers_are_unique_per_tenant() {
    let api = Api::new().await;
    let alice = api
        .send(order_request(
            Some("k-1"),
            Some("Bearer alice"),
            &tea("A-1001"),
        ))
        .await;
    let bob = api
        .send(order_request(
            Some("k-2"),
            Some("Bearer bob"),
            &tea("A-1001"),
        ))
        .await;
    assert_eq!(
        (alice.status, bob.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert_ne!(
        alice.body["id"], bob.body["id"],
        "bob never sees alice's order"
    );
    assert_eq!(api.orders().await, 2);
}

#[tokio::test]
async fn missing_key_is_400_and_declined_card_stays_declined() {
    let api = Api::new().await;
    let missing = api.create(None, &tea("A-1001")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.body["type"],
        "https://idem.dev/problems/missing-key"
    );
    let big =
        json!({ "order_number": "A-1002", "sku": "car", "qty": 1, "amount_cents": 9_999_999 });
    let declined = api.create(Some("k-3"), &big).await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let again = api.create(Some("k-3"), &big).await;
    assert_eq!(
        (again.status, again.replayed),
        (StatusCode::PAYMENT_REQUIRED, true)
    );
    assert_eq!(api.orders().await, 0);
    assert_eq!(api.outcomes.handler_runs(), 1);
}

#[tokio::test]
async fn invalid_order_is_422_and_releases_the_key() {
    let api = Api::new().await;
    for bad in [
        json!({ "order_number": "A-1001", "sku": "tea", "qty": 0, "amount_cents": 1200 }),
        json!({ "order_number": " ", "sku": "tea", "qty": 2, "amount_cents": 1200 }),
        json!({ "order_number": "A".repeat(65), "sku": "tea", "qty": 2, "amount_cents": 1200 }),
    ] {
        let answer = api.create(Some("k-1"), &bad).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert_eq!(api.key_records().await, 0, "released");
    }
    let fixed = api.create(Some("k-1"), &tea("A-1001")).await;
    assert_eq!(fixed.status, StatusCode::CREATED);
    assert_eq!(api.orders().await, 1);
}

#[tokio::test]
async fn capture_commits_with_its_key_and_replays() {
    let api = Api::new().await;
    api.create(Some("k-1"), &tea("A-1001")).await;
    let capture = || {
        Request::post("/v1/orders/1/capture")
            .header("idempotency-key", "cap-1")
            .body(Body::empty())
            .unwrap()
    };
    let first = api.send(capture()).await;
    assert_eq!((first.status, first.replayed), (StatusCode::OK, false));
    assert_eq!(first.body["status"], "captured");
    let retry = api.send(capture()).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::OK, true));
    assert_eq!(retry.body, first.body);
    assert_eq!(
        api.scalar("SELECT count(*) FROM orders WHERE status = 'captured'")
            .await,
        1
    );
    // Another tenant cannot capture it: 404, released.
    let foreign = Request::post("/v1/orders/1/capture")
        .header("idempotency-key", "cap-2")
        .header("authorization", "Bearer mallory")
        .body(Body::empty())
        .unwrap();
    assert_eq!(api.send(foreign).await.status, StatusCode::NOT_FOUND);
    let read = api
        .send(Request::get("/v1/orders/1").body(Body::empty()).unwrap())
        .await;
    assert_eq!(read.body, first.body);
}

/// Kills the process on drop, so that a failing test leaves none running.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the real binary over the database at `url` until its first new order stops it before the
/// commit (SPEC S9's crash); returns what the client read and the exit status.
fn crash_before_commit(url: &str, key: &str, order: &Value) -> (String, i32) {
    let child = Command::new(env!("CARGO_BIN_EXE_orders-api"))
        .env("ORDERS_API_ADDR", "127.0.0.1:0")
        .env("ORDERS_API_DB", url)
        .env("ORDERS_API_CRASH_BEFORE_COMMIT", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reaped(child);
    let mut banner = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let addr = banner
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .to_owned();
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    let body = order.to_string();
    write!(
        conn,
        "POST /v1/orders HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    // The process dies mid-request: the connection ends (or resets) without an answer.
    let _ = conn.read_to_string(&mut answer);
    let deadline = std::time::Instant::now() + ANSWER_WITHIN;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the process did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (answer, status.code().expect("exited, not killed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_insert_and_commit_leaves_no_order_and_the_key_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let url = db_url(&dir);
    let (answer, code) =
        tokio::task::spawn_blocking(move || crash_before_commit(&url, "k-crash", &tea("A-1001")))
            .await
            .unwrap();
    assert_eq!(answer, "", "the client got no answer");
    assert_eq!(code, CRASH_EXIT_CODE);

    // The service restarts on the same file.
    let api = Api::on(dir).await;
    assert_eq!(api.orders().await, 0, "the order never committed");
    assert_eq!(api.events().await, 0, "nor its event");
    assert_eq!(
        api.scalar("SELECT count(*) FROM idem_records WHERE state = 'in_progress' AND attempt = 1")
            .await,
        1,
        "the key's reservation committed on its own; its completion did not"
    );
    // While the dead attempt's lease lives, the retry is told to come back.
    let early = api.create(Some("k-crash"), &tea("A-1001")).await;
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(
        early.body["type"],
        "https://idem.dev/problems/request-in-progress"
    );
    assert_eq!(api.outcomes.handler_runs(), 0);

    // Then it takes the key over and runs cleanly: one order.
    api.clock.advance(DEFAULT_LEASE);
    let retry = api.create(Some("k-crash"), &tea("A-1001")).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, false));
    assert_eq!(retry.body["id"], 1);
    assert_eq!(api.orders().await, 1);
    assert_eq!(
        api.scalar("SELECT count(*) FROM idem_records WHERE state = 'completed' AND attempt = 2")
            .await,
        1
    );
    let replay = api.create(Some("k-crash"), &tea("A-1001")).await;
    assert_eq!(
        (replay.status, replay.replayed),
        (StatusCode::CREATED, true)
    );
    assert_eq!(api.outcomes.handler_runs(), 1);
    assert_eq!(api.events().await, 1);
}
