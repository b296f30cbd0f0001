//! A reservation the store confirms late (SPEC S7): the store commits the reserve, its
//! reply is held up (a one-way partition, a slow link) while time passes, on the
//! store's clock and on the runtime's, both moved by hand. A reply that comes half a
//! lease or more after the reserve was sent is not executed under: the key is given
//! back if still its own, and the client gets 503 `reservation-late`; a takeover that
//! ran meanwhile is the only execution.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idem_core::{
    Lease, ManualClock, MemoryStore, RecordState, Reservation, ReserveRequest, Store, Tenant,
};
use idem_test_support::{HookedStore, StoreHooks, scope};
use idem_tower::{Handled, IdempotencyBody, IdempotencyLayer, Outcome, Profile};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

const LEASE: Duration = Duration::from_secs(10);

/// Holds the reply to the next reserve once armed: the store has acted (`committed` is
/// notified), and the reply waits for a permit of `reply`. Records when each renewal
/// was asked for.
struct Held {
    armed: AtomicBool,
    committed: Notify,
    reply: Semaphore,
    renewed_at: Mutex<Vec<Instant>>,
}

impl Default for Held {
    fn default() -> Held {
        Held {
            armed: AtomicBool::new(false),
            committed: Notify::new(),
            reply: Semaphore::new(0),
            renewed_at: Mutex::default(),
        }
    }
}

struct HoldsReply(Arc<Held>);

#[async_trait]
impl StoreHooks<MemoryStore> for HoldsReply {
    async fn reserve(
        &self,
        inner: &MemoryStore,
        request: &ReserveRequest,
    ) -> idem_core::Result<Reservation> {
        let reply = inner.reserve(request).await;
        if self.0.armed.swap(false, Ordering::SeqCst) {
            self.0.committed.notify_one();
            self.0.reply.acquire().await.expect("open").forget();
        }
        reply
    }

    async fn renew(
        &self,
        inner: &MemoryStore,
        lease: &Lease,
        lease_for: Duration,
    ) -> idem_core::Result<()> {
        self.0.renewed_at.lock().unwrap().push(Instant::now());
        inner.renew(lease, lease_for).await
    }
}

type Charges = tower::util::BoxCloneService<
    Request<Full<Bytes>>,
    Response<IdempotencyBody<Full<Bytes>>>,
    Infallible,
>;

/// A layer with a 10 s lease over a memory store on `clock` whose reserve replies
/// `held` can hold, around a handler that counts its runs in `runs` and, once started,
/// waits for a permit of `gate` (closed if `gated`).
struct Bench {
    clock: ManualClock,
    store: Arc<HookedStore<MemoryStore, HoldsReply>>,
    held: Arc<Held>,
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    service: Charges,
}

impl Bench {
    fn new(profile: Profile, gated: bool) -> Bench {
        let clock = ManualClock::starting_now();
        let held = Arc::new(Held::default());
        let inner = MemoryStore::with_clock(Arc::new(clock.clone()));
        let store = Arc::new(HookedStore::new(inner, HoldsReply(held.clone())));
        let (runs, gate) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(Semaphore::new(if gated { 0 } else { 1000 })),
        );
        let handler = tower::service_fn({
            let (runs, gate) = (runs.clone(), gate.clone());
            move |_: Request<IdempotencyBody<Full<Bytes>>>| {
                let (runs, gate) = (runs.clone(), gate.clone());
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    gate.acquire().await.expect("open").forget();
                    let mut response = Response::new(Full::new(Bytes::from(format!("charge {n}"))));
                    *response.status_mut() = http::StatusCode::CREATED;
                    Ok::<_, Infallible>(response)
                }
            }
        });
        let layer = IdempotencyLayer::from_arc(store.clone())
            .lease(LEASE)
            .profile(profile);
        let service = tower::util::BoxCloneService::new(layer.layer(handler));
        Bench {
            clock,
            store,
            held,
            runs,
            gate,
            service,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Sends a charge with `key` from a task of its own; with `hold`, its reserve's
    /// reply is held, and this returns once the store has acted on it.
    async fn send(&self, key: &str, hold: bool) -> tokio::task::JoinHandle<Answer> {
        self.held.armed.store(hold, Ordering::SeqCst);
        let mut service = self.service.clone();
        let request = Request::post("/charges")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(br#"{"amount":100}"#)))
            .expect("request");
        let task = tokio::spawn(async move {
            let response = service.ready().await.unwrap().call(request).await.unwrap();
            Answer::read(response).await
        });
        if hold {
            self.held.committed.notified().await;
        }
        task
    }

    /// Time passes for the store and for the layer alike.
    async fn pass(&self, d: Duration) {
        self.clock.advance(d);
        tokio::time::advance(d).await;
    }

    async fn state(&self, key: &str) -> Option<(u32, bool)> {
        let record = self
            .store
            .get(&scope(Tenant::anonymous(), "/charges", key))
            .await;
        let record = record.expect("the store answers")?;
        Some((
            record.attempt,
            matches!(record.state, RecordState::Completed { .. }),
        ))
    }
}

/// What came back.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    replayed: bool,
    outcome: Option<Outcome>,
    body: serde_json::Value,
}

impl Answer {
    async fn read(response: Response<IdempotencyBody<Full<Bytes>>>) -> Answer {
        let (head, body) = response.into_parts();
        let bytes = body.collect().await.expect("body").to_bytes();
        let header = |name: &str| {
            let value = head.headers.get(name)?;
            Some(value.to_str().expect("ascii").to_owned())
        };
        Answer {
            status: head.status.as_u16(),
            retry_after: header("retry-after"),
            replayed: header("idempotent-replayed").is_some(),
            outcome: head.extensions.get::<Handled>().map(|h| h.outcome),
            body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        }
    }

    fn assert_late(&self) {
        assert_eq!(self.status, 503, "{self:?}");
        assert_eq!(self.retry_after.as_deref(), Some("1"), "{self:?}");
        assert_eq!(self.outcome, Some(Outcome::ReservationLate), "{self:?}");
        assert_eq!(
            self.body["type"], "https://idem.dev/problems/reservation-late",
            "{self:?}"
        );
    }
}

/// The mechanism seen in the nemesis harness: the first reserve commits, its reply is
/// late past the lease, a retry takes the key over and executes; the late reply then
/// arrives. The late attempt does not execute: 503, the takeover's record untouched,
/// one execution in all, and the client's retry gets the takeover's answer.
#[tokio::test(start_paused = true)]
async fn a_reservation_confirmed_after_its_lease_lapsed_never_executes() {
    let b = Bench::new(Profile::Ietf, false);
    let late = b.send("k-late", true).await;
    b.pass(LEASE + Duration::from_millis(1)).await;

    let taken_over = b.send("k-late", false).await.await.unwrap();
    assert_eq!(taken_over.status, 201, "{taken_over:?}");
    assert_eq!(b.runs(), 1);
    assert_eq!(b.state("k-late").await, Some((2, true)));

    b.held.reply.add_permits(1);
    let late = late.await.unwrap();
    late.assert_late();
    assert_eq!(b.runs(), 1, "the late reservation did not execute");
    assert_eq!(
        b.state("k-late").await,
        Some((2, true)),
        "the takeover's record is left as it is"
    );

    let retry = b.send("k-late", false).await.await.unwrap();
    assert!(retry.replayed, "{retry:?}");
    assert_eq!(retry.status, 201);
    assert_eq!(b.runs(), 1);
}

/// A reply late by half the lease, with no takeover: the reservation is released (it
/// was still its own, and nothing ran under it), so the retry executes, once, as a first
/// attempt. Just under half the lease, the reservation is executed under.
#[tokio::test(start_paused = true)]
async fn a_late_reservation_still_its_own_is_released_for_the_retry() {
    let b = Bench::new(Profile::Ietf, false);
    let late = b.send("k-half", true).await;
    b.pass(LEASE / 2).await;
    b.held.reply.add_permits(1);
    late.await.unwrap().assert_late();
    assert_eq!(b.runs(), 0);
    assert_eq!(b.state("k-half").await, None, "released");

    let retry = b.send("k-half", false).await.await.unwrap();
    assert_eq!((retry.status, retry.replayed), (201, false), "{retry:?}");
    assert_eq!(b.runs(), 1);
    assert_eq!(b.state("k-half").await, Some((1, true)));

    let in_time = b.send("k-in-time", true).await;
    b.pass(LEASE / 2 - Duration::from_millis(1)).await;
    b.held.reply.add_permits(1);
    assert_eq!(in_time.await.unwrap().status, 201);
    assert_eq!(b.runs(), 2);
}

/// A late takeover (attempt 2) is left lapsed rather than released, so that the next
/// retry takes the key over as a recovered attempt, as it would have without it.
#[tokio::test(start_paused = true)]
async fn a_late_takeover_is_left_lapsed_for_a_recovered_retry() {
    let b = Bench::new(Profile::Ietf, true);
    let first = b.send("k-again", false).await;
    tokio::task::yield_now().await;
    while b.runs() == 0 {
        tokio::task::yield_now().await;
    }
    // The first attempt's worker stalls past its lease (its renewals held back with it).
    b.clock.advance(LEASE + Duration::from_millis(1));
    let late = b.send("k-again", true).await;
    b.pass(LEASE / 2).await;
    b.held.reply.add_permits(1);
    late.await.unwrap().assert_late();
    assert_eq!(b.state("k-again").await, Some((2, false)));
    b.gate.add_permits(1000);
    let retry = b.send("k-again", false).await.await.unwrap();
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(
        b.state("k-again").await,
        Some((3, true)),
        "recovered as attempt 3"
    );
    drop(first);
}

/// The heartbeat counts from the reserve's send, not its reply: a reply a third of the
/// lease late gets its first renewal as the handler starts, not a third of a lease
/// later, when the lease may have lapsed.
#[tokio::test(start_paused = true)]
async fn the_first_renewal_is_due_a_third_of_the_lease_after_the_reserve_was_sent() {
    let b = Bench::new(Profile::Stripe, true);
    let sent = Instant::now();
    let slow = b.send("k-beat", true).await;
    b.pass(LEASE * 2 / 5).await;
    b.held.reply.add_permits(1);
    // Yielding keeps the paused clock where it is: only a renewal due now can run.
    for _ in 0..1000 {
        if !b.held.renewed_at.lock().unwrap().is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    let renewed = b.held.renewed_at.lock().unwrap().first().copied();
    let first = renewed.expect("renewed as the handler started, the first beat overdue");
    assert_eq!(
        first - sent,
        LEASE * 2 / 5,
        "renewed as the handler started"
    );
    b.gate.add_permits(1);
    assert_eq!(slow.await.unwrap().status, 201);
    assert_eq!(b.runs(), 1);
}

/// In the Stripe dialect, the refusal is Stripe's error envelope, still a 503 with
/// `Retry-After`.
#[tokio::test(start_paused = true)]
async fn a_late_reservation_is_refused_in_the_routes_dialect() {
    let b = Bench::new(Profile::Stripe, false);
    let late = b.send("k-stripe", true).await;
    b.pass(LEASE).await;
    b.held.reply.add_permits(1);
    let answer = late.await.unwrap();
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    assert_eq!(answer.body["error"]["type"], "api_error");
    assert_eq!(
        answer.body["error"]["doc_url"],
        "https://idem.dev/problems/reservation-late"
    );
    assert_eq!(b.runs(), 0);
}
