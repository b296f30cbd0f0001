//! The store contract suite (SPEC S10) and helpers for tests that need a live service.
//!
//! A store crate runs the whole suite with one macro call in an integration test:
//!
//! ```ignore
//! idem_core::store_contract_tests!(|clock: idem_core::ManualClock, _ns: String| async move {
//!     Some(idem_core::MemoryStore::with_clock(std::sync::Arc::new(clock)))
//! });
//! ```
//!
//! The macro expands to one `#[tokio::test]` per contract case, named after the case,
//! so the test output lists every case for every store. The factory receives the
//! case's [`ManualClock`] (the store must read time from it) and a namespace unique to
//! the case (a table prefix, key prefix or file name), so that cases running in
//! parallel against one shared server never see each other's records. A factory
//! returns `None` to skip when its service is unreachable; see [`service_unavailable`].

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::{
    Clock, Endpoint, Fingerprint, FingerprintOptions, Key, Lease, ManualClock, RecordState,
    Reservation, ReserveRequest, Scope, ScopeMode, Store, StoreError, StoredResponse, Tenant,
};

/// Runs every contract case as its own `#[tokio::test]`. See the [module docs](self).
#[macro_export]
macro_rules! store_contract_tests {
    ($factory:expr) => {
        $crate::store_contract_tests!(@cases $factory;
            concurrent_reservers_exactly_one_wins,
            concurrent_takeover_exactly_one_wins,
            replays_completed_response,
            large_binary_body_round_trips,
            referenced_answer_round_trips,
            mismatched_payload_is_rejected,
            live_lease_is_in_progress_with_retry_after,
            expired_lease_is_taken_over_as_next_attempt,
            stale_token_cannot_complete_renew_or_release,
            renew_extends_the_lease,
            complete_is_idempotent_for_the_same_lease,
            release_lets_the_key_execute_again,
            expired_record_counts_as_absent,
            completed_record_expires_at_its_ttl_though_the_lease_is_longer,
            purge_removes_only_expired_in_bounded_batches,
            scopes_never_collide,
            get_and_remove_show_and_delete_records,
            secret_is_stored_once_and_never_purged
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let clock = $crate::ManualClock::starting_now();
                let ns = $crate::testing::unique_namespace(stringify!($case));
                let factory = $factory;
                let Some(store) = factory(clock.clone(), ns).await else {
                    return;
                };
                $crate::testing::cases::$case(store, clock).await;
            }
        )*
    };
}

/// A namespace unique to this process and case: lower-case ASCII letters, digits and
/// `_`, at most 40 characters, safe as a SQL identifier suffix or a key prefix.
pub fn unique_namespace(case: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let rand = getrandom::u32().unwrap_or(0);
    let short: String = case
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(20)
        .collect::<String>()
        .to_ascii_lowercase();
    format!("{short}_{rand:08x}{n}")
}

/// Whether CI demands that every service be reachable (`IDEM_REQUIRE_SERVICES=1`).
pub fn services_required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// The URL of a test service: the environment variable's value, else `default`.
pub fn service_url(env_var: &str, default: &str) -> String {
    std::env::var(env_var).unwrap_or_else(|_| default.to_owned())
}

/// Reports an unreachable service: panics under `IDEM_REQUIRE_SERVICES=1`, otherwise
/// prints a loud notice to stderr so the skip is seen. Returns `None` for a factory to
/// pass on.
pub fn service_unavailable<T>(
    service: &str,
    url: &str,
    error: &dyn std::fmt::Display,
) -> Option<T> {
    assert!(
        !services_required(),
        "{service} at {url} is unreachable and IDEM_REQUIRE_SERVICES=1: {error}"
    );
    eprintln!(
        "\n*** SKIPPED: {service} at {url} is unreachable ({error}); \
         set IDEM_REQUIRE_SERVICES=1 to make this a failure ***\n"
    );
    None
}

/// A scope for tests: a fresh random tenant, so cases never collide even in one
/// namespace.
pub fn test_scope(endpoint: &str, key: &str) -> Scope {
    Scope::new(
        ScopeMode::Public,
        Tenant::new(format!("tenant-{:016x}", getrandom::u64().unwrap_or(0))),
        Endpoint::new("POST", endpoint),
        Key::new(key).expect("test keys are valid"),
    )
}

/// The value now of the figure `name` among `store`'s [`Store::metrics`]; panics,
/// listing the names there are, when the store reports no such figure.
pub fn figure(store: &dyn Store, name: &str) -> u64 {
    let figures = store.metrics();
    match figures.iter().find(|m| m.name == name) {
        Some(m) => m.value,
        None => {
            let names: Vec<&str> = figures.iter().map(|m| m.name).collect();
            panic!("the store reports no {name}; it reports {names:?}")
        }
    }
}

/// A fingerprint of `body` for tests.
pub fn test_fingerprint(body: &str) -> Fingerprint {
    Fingerprint::compute(
        "POST",
        "POST /test",
        Some("application/json"),
        body.as_bytes(),
        &FingerprintOptions::default(),
    )
}

/// `url` (`scheme://[user[:password]@]host[:port][/path][?query]`) split around its
/// `host[:port]`: what comes before it, it, and what comes after.
fn split_authority(url: &str) -> (&str, &str, &str) {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let host_start = rest[..authority_end].rfind('@').map_or(0, |at| at + 1);
    let (head, tail) = url.split_at(scheme_end + authority_end);
    let (head, host_port) = head.split_at(scheme_end + host_start);
    (head, host_port, tail)
}

/// `url` with its host and port replaced by `addr`, everything else (user, password,
/// database, query) kept: the URL of a service seen through a [`Relay`].
pub fn url_via(url: &str, addr: std::net::SocketAddr) -> String {
    let (head, _, tail) = split_authority(url);
    format!("{head}{addr}{tail}")
}

/// The address `url`'s host and port resolve to (`default_port` when it names none).
///
/// # Panics
///
/// When the host does not resolve.
pub async fn service_addr(url: &str, default_port: u16) -> std::net::SocketAddr {
    let (_, host_port, _) = split_authority(url);
    let has_port = host_port
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
    let host_port = if has_port {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    };
    tokio::net::lookup_host(&host_port)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("{host_port} does not resolve"))
}

/// A process's user + system CPU time so far, from `/proc/PID/stat` (`pid` "self" for
/// this process), for benches that report CPU per request; zero where there is no
/// `/proc`.
pub fn cpu_time(pid: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // After the parenthesised command name, utime and stime are the 12th and 13th
    // fields, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// A TCP relay on a loopback port to a service, for tests that make a store unreachable
/// ([`cut`](Relay::cut), [`set_mode`](Relay::set_mode)) or lose a reply after the
/// service acted on the request ([`lose_reply_to`](Relay::lose_reply_to)). Point the
/// store's URL at [`addr`](Relay::addr). Dropping it cuts everything.
pub struct Relay {
    addr: std::net::SocketAddr,
    shared: Arc<RelayShared>,
}

/// What a [`Relay`] does with connections, old and new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
    /// Passes bytes both ways.
    Forward,
    /// The service is down: the port is closed, so connecting is refused, and live
    /// connections are reset. Leaving this mode opens the same port again.
    Refuse,
    /// The link is broken: connections are accepted and reset at once, and live ones
    /// are reset.
    Reset,
    /// The service stopped answering: connections are accepted and held, and nothing
    /// is passed on either way. Leaving this mode resets the held connections.
    Stall,
}

struct RelayShared {
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Bytes whose appearance in a request loses the next reply on its connection.
    marker: std::sync::Mutex<Option<Vec<u8>>>,
    lost: AtomicU64,
    mode: tokio::sync::watch::Sender<RelayMode>,
}

impl Relay {
    /// Relays from a fresh loopback port to `target`.
    pub async fn start(target: std::net::SocketAddr) -> Relay {
        Relay::start_at(([127, 0, 0, 1], 0).into(), target).await
    }

    /// Relays from `listen` (a loopback address, port 0 for any) to `target`.
    pub async fn start_at(listen: std::net::SocketAddr, target: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .expect("the relay binds");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let shared = Arc::new(RelayShared {
            tasks: std::sync::Mutex::default(),
            marker: std::sync::Mutex::default(),
            lost: AtomicU64::new(0),
            mode: tokio::sync::watch::Sender::new(RelayMode::Forward),
        });
        let accept = tokio::spawn(accept(listener, addr, target, shared.clone()));
        shared.tasks.lock().unwrap().push(accept);
        Relay { addr, shared }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Drops every relayed connection and stops accepting new ones, for good.
    pub fn cut(&self) {
        for t in self.shared.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    /// Switches what the relay does with connections, live and new; see [`RelayMode`].
    pub fn set_mode(&self, mode: RelayMode) {
        self.shared.mode.send_replace(mode);
    }

    /// Once a request containing `marker` has been passed on, the next bytes the
    /// service sends on that connection are thrown away and the connection is dropped
    /// both ways: the service acted on the request, and the client never learns what
    /// happened. Mark with something only the request of interest carries (its key,
    /// say), so that replies to earlier requests still get through. Once only.
    pub fn lose_reply_to(&self, marker: &[u8]) {
        *self.shared.marker.lock().unwrap() = Some(marker.to_vec());
    }

    /// How many replies were thrown away.
    pub fn replies_lost(&self) -> u64 {
        self.shared.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Accepts connections and hands each to [`relay_one`]; in [`RelayMode::Refuse`] the
/// port is closed until the mode changes.
async fn accept(
    mut listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
    target: std::net::SocketAddr,
    shared: Arc<RelayShared>,
) {
    let mut mode = shared.mode.subscribe();
    loop {
        if *mode.borrow_and_update() == RelayMode::Refuse {
            drop(listener);
            if mode.wait_for(|m| *m != RelayMode::Refuse).await.is_err() {
                return;
            }
            // The same port again, so that the client's URL stays valid.
            listener = tokio::net::TcpListener::bind(addr)
                .await
                .expect("the relay binds its port again");
            continue;
        }
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                let conn = tokio::spawn(relay_one(inbound, target, shared.clone()));
                shared.tasks.lock().unwrap().push(conn);
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// Closes with a reset rather than a clean FIN, as a dead link does.
fn reset(stream: tokio::net::TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Whether the relay passes bytes on now.
fn forwarding(shared: &RelayShared) -> bool {
    *shared.mode.borrow() == RelayMode::Forward
}

/// Serves one connection by the relay's mode, following the mode as it changes.
async fn relay_one(
    client: tokio::net::TcpStream,
    target: std::net::SocketAddr,
    shared: Arc<RelayShared>,
) {
    let mut mode = shared.mode.subscribe();
    let now = *mode.borrow_and_update();
    match now {
        RelayMode::Forward => {}
        RelayMode::Refuse | RelayMode::Reset => return reset(client),
        RelayMode::Stall => {
            let _ = mode.changed().await;
            return reset(client);
        }
    }
    let Ok(server) = tokio::net::TcpStream::connect(target).await else {
        return reset(client);
    };
    let mut pair = (client, server);
    let stalled = tokio::select! {
        () = forward(&mut pair.0, &mut pair.1, &shared) => return,
        changed = mode.wait_for(|m| *m != RelayMode::Forward) => {
            changed.is_ok_and(|m| *m == RelayMode::Stall)
        }
    };
    // Stalled: hold both ends, passing nothing on, until the mode changes again.
    if stalled {
        let _ = mode.changed().await;
    }
    reset(pair.0);
    reset(pair.1);
}

/// Passes bytes both ways until either side stops, throwing away the reply to a
/// request that carries the relay's marker. Once the relay leaves
/// [`RelayMode::Forward`] it passes nothing more on, and waits for its caller to act
/// on the new mode: bytes a client sends after [`Relay::set_mode`] returned never
/// reach the service, however late this task notices the change.
async fn forward(
    client: &mut tokio::net::TcpStream,
    server: &mut tokio::net::TcpStream,
    shared: &RelayShared,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_rx, mut client_tx) = client.split();
    let (mut server_rx, mut server_tx) = server.split();
    // Set once a request carrying the marker went through: its reply is lost.
    let armed = std::sync::atomic::AtomicBool::new(false);
    let requests = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            {
                let mut marker = shared.marker.lock().unwrap();
                if marker
                    .as_deref()
                    .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m))
                {
                    *marker = None;
                    armed.store(true, Ordering::SeqCst);
                }
            }
            if !forwarding(shared) {
                std::future::pending::<()>().await;
            }
            if server_tx.write_all(chunk).await.is_err() {
                break;
            }
        }
        let _ = server_tx.shutdown().await;
    };
    let replies = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if armed.load(Ordering::SeqCst) {
                shared.lost.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if !forwarding(shared) {
                std::future::pending::<()>().await;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // The connection ends, both ways, when the replies stop (or are lost).
    tokio::select! {
        () = replies => {}
        () = async { requests.await; std::future::pending::<()>().await } => {}
    }
}

/// The contract cases. Each takes a store reading time from `clock`.
pub mod cases {
    use super::*;

    const LEASE: Duration = Duration::from_secs(60);
    const TTL: Duration = Duration::from_secs(24 * 3600);

    fn request(scope: &Scope, body: &str) -> ReserveRequest {
        ReserveRequest::new(scope.clone(), test_fingerprint(body))
            .ttl(TTL)
            .lease(LEASE)
    }

    async fn acquire<S: Store>(store: &S, req: &ReserveRequest) -> Lease {
        match store.reserve(req).await.expect("reserve") {
            Reservation::Acquired(lease) => lease,
            other => panic!("expected to acquire {:?}, got {other:?}", req.scope),
        }
    }

    fn response() -> StoredResponse {
        StoredResponse::new(201, r#"{"id":"ch_1"}"#)
            .with_header("content-type", "application/json")
            .with_header("location", "/v1/charges/ch_1")
    }

    fn assert_fenced(result: crate::Result<()>, what: &str) {
        match result {
            Err(StoreError::Fenced) => {}
            other => panic!("{what} with a stale token must fail Fenced, got {other:?}"),
        }
    }

    /// 64 tasks reserve one key at once: exactly one acquires; every other sees the
    /// record in progress.
    pub async fn concurrent_reservers_exactly_one_wins<S: Store>(store: S, _clock: ManualClock) {
        let store = Arc::new(store);
        let scope = test_scope("/race", "race-key");
        let req = request(&scope, r#"{"amount":100}"#);
        let barrier = Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (store, req, barrier) = (store.clone(), req.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.reserve(&req).await.expect("reserve")
                })
            })
            .collect();
        let mut acquired = 0;
        let mut in_progress = 0;
        for t in tasks {
            match t.await.expect("task") {
                Reservation::Acquired(l) => {
                    assert_eq!(l.attempt, 1);
                    acquired += 1;
                }
                Reservation::InProgress { retry_after } => {
                    assert!(retry_after >= Duration::from_secs(1));
                    in_progress += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(acquired, 1, "exactly one reserver may win");
        assert_eq!(in_progress, 63);
    }

    /// After the lease lapses, 64 tasks race to take over: exactly one gets attempt 2.
    pub async fn concurrent_takeover_exactly_one_wins<S: Store>(store: S, clock: ManualClock) {
        let store = Arc::new(store);
        let scope = test_scope("/race", "takeover-key");
        let req = request(&scope, "{}");
        acquire(&*store, &req).await;
        clock.advance(LEASE + Duration::from_millis(1));
        let barrier = Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (store, req, barrier) = (store.clone(), req.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.reserve(&req).await.expect("reserve")
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.expect("task") {
                Reservation::Acquired(l) => winners.push(l),
                Reservation::InProgress { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one taker-over may win");
        assert_eq!(winners[0].attempt, 2);
        assert!(winners[0].recovered());
    }

    /// A completed record replays status, headers and body byte for byte.
    pub async fn replays_completed_response<S: Store>(store: S, _clock: ManualClock) {
        let scope = test_scope("/v1/charges", "replay-key");
        let req = request(&scope, r#"{"amount":100}"#);
        let lease = acquire(&store, &req).await;
        store.complete(&lease, &response()).await.expect("complete");
        for _ in 0..2 {
            assert_eq!(
                store.reserve(&req).await.expect("reserve"),
                Reservation::Replay(response())
            );
        }
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert!(record.is_completed());
        assert_eq!(record.attempt, 1);
        assert_eq!(record.token, lease.token);
    }

    /// A 1 MiB body of every byte value survives storage unchanged.
    pub async fn large_binary_body_round_trips<S: Store>(store: S, _clock: ManualClock) {
        let scope = test_scope("/blob", "blob-key");
        let req = request(&scope, "{}");
        let lease = acquire(&store, &req).await;
        let body: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
        let resp = StoredResponse {
            status: 200,
            headers: vec![("x-bin".into(), Bytes::from_static(&[0, 0xff, b'\r', b'\n']))],
            body: Bytes::from(body),
        };
        store.complete(&lease, &resp).await.expect("complete");
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::Replay(resp)
        );
    }

    /// An answer recorded as a reference to a resource (SPEC S6) replays with its
    /// reference, apart from its HTTP headers.
    pub async fn referenced_answer_round_trips<S: Store>(store: S, _clock: ManualClock) {
        let scope = test_scope("/v1/reports", "reference-key");
        let req = request(&scope, "{}");
        let lease = acquire(&store, &req).await;
        let resp = StoredResponse::new(201, Bytes::new())
            .with_header("location", "/v1/reports/42")
            .with_reference("/v1/reports/42?format=csv");
        store.complete(&lease, &resp).await.expect("complete");
        let Reservation::Replay(replay) = store.reserve(&req).await.expect("reserve") else {
            panic!("not a replay");
        };
        assert_eq!(replay, resp);
        assert_eq!(replay.reference(), Some("/v1/reports/42?format=csv"));
        let http: Vec<_> = replay.http_headers().map(|(n, _)| n.as_str()).collect();
        assert_eq!(http, ["location"]);
    }

    /// A different payload under the same key is a mismatch, in progress or completed.
    pub async fn mismatched_payload_is_rejected<S: Store>(store: S, _clock: ManualClock) {
        let scope = test_scope("/v1/charges", "mismatch-key");
        let lease = acquire(&store, &request(&scope, r#"{"amount":100}"#)).await;
        let other = request(&scope, r#"{"amount":1000}"#);
        assert_eq!(
            store.reserve(&other).await.expect("reserve"),
            Reservation::Mismatch
        );
        store.complete(&lease, &response()).await.expect("complete");
        assert_eq!(
            store.reserve(&other).await.expect("reserve"),
            Reservation::Mismatch
        );
        // The mismatch changed nothing.
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert_eq!(record.fingerprint, test_fingerprint(r#"{"amount":100}"#));
        assert!(record.is_completed());
    }

    /// A live lease answers in progress, asking to wait as long as the record has
    /// existed (at least a second) but no longer than the lease has left, rounded up to
    /// seconds.
    pub async fn live_lease_is_in_progress_with_retry_after<S: Store>(
        store: S,
        clock: ManualClock,
    ) {
        let scope = test_scope("/v1/charges", "busy-key");
        let req = request(&scope, "{}");
        acquire(&store, &req).await;
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::InProgress {
                retry_after: Duration::from_secs(1)
            }
        );
        clock.advance(Duration::from_millis(4_200));
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::InProgress {
                retry_after: Duration::from_secs(5)
            }
        );
        clock.advance(Duration::from_millis(46_300));
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::InProgress {
                retry_after: Duration::from_secs(10)
            }
        );
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert!(matches!(record.state, RecordState::InProgress { .. }));
    }

    /// A lapsed lease is taken over as attempt n+1, marked recovered, with a new token.
    pub async fn expired_lease_is_taken_over_as_next_attempt<S: Store>(
        store: S,
        clock: ManualClock,
    ) {
        use crate::Clock;
        let scope = test_scope("/v1/charges", "takeover-key");
        let req = request(&scope, "{}");
        let start = clock.now();
        let first = acquire(&store, &req).await;
        assert!(!first.recovered());
        clock.advance(LEASE);
        let second = acquire(&store, &req).await;
        assert_eq!(second.attempt, 2);
        assert!(second.recovered());
        assert_ne!(second.token, first.token);
        clock.advance(LEASE + Duration::from_secs(1));
        let third = acquire(&store, &req).await;
        assert_eq!(third.attempt, 3);
        store.complete(&third, &response()).await.expect("complete");
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert_eq!(record.attempt, 3);
        // Takeover keeps the creation time: expiry counts from the first attempt.
        assert_eq!(record.created_at, start);
        assert_eq!(record.expires_at, start.plus(TTL));
    }

    /// The attempt whose lease was taken over cannot complete, renew or release; the
    /// new attempt's record is untouched.
    pub async fn stale_token_cannot_complete_renew_or_release<S: Store>(
        store: S,
        clock: ManualClock,
    ) {
        let scope = test_scope("/v1/charges", "fence-key");
        let req = request(&scope, "{}");
        let stale = acquire(&store, &req).await;
        clock.advance(LEASE + Duration::from_secs(1));
        let current = acquire(&store, &req).await;
        assert_fenced(
            store
                .complete(&stale, &StoredResponse::new(500, "late"))
                .await,
            "complete",
        );
        assert_fenced(store.renew(&stale, LEASE).await, "renew");
        assert_fenced(store.release(&stale).await, "release");
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert_eq!(record.token, current.token);
        assert!(matches!(record.state, RecordState::InProgress { .. }));
        store
            .complete(&current, &response())
            .await
            .expect("complete");
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::Replay(response())
        );
        // A forged token is no better than a stale one.
        let forged = Lease {
            token: crate::FencingToken::generate(),
            ..current
        };
        assert_fenced(store.release(&forged).await, "release");
    }

    /// Renewal pushes the lease out, so a running attempt is not taken over.
    pub async fn renew_extends_the_lease<S: Store>(store: S, clock: ManualClock) {
        let scope = test_scope("/v1/charges", "renew-key");
        let req = request(&scope, "{}");
        let lease = acquire(&store, &req).await;
        for _ in 0..3 {
            clock.advance(Duration::from_secs(50));
            store.renew(&lease, LEASE).await.expect("renew");
        }
        clock.advance(Duration::from_secs(50));
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::InProgress {
                retry_after: Duration::from_secs(10)
            }
        );
        store.complete(&lease, &response()).await.expect("complete");
        assert_fenced(store.renew(&lease, LEASE).await, "renew after complete");
    }

    /// Completing twice with one lease keeps the first response (SPEC S9).
    pub async fn complete_is_idempotent_for_the_same_lease<S: Store>(
        store: S,
        _clock: ManualClock,
    ) {
        let scope = test_scope("/v1/charges", "twice-key");
        let req = request(&scope, "{}");
        let lease = acquire(&store, &req).await;
        store.complete(&lease, &response()).await.expect("complete");
        store
            .complete(&lease, &StoredResponse::new(500, "second"))
            .await
            .expect("second complete with the same lease");
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::Replay(response())
        );
        // A completed record is not released.
        assert_fenced(store.release(&lease).await, "release after complete");
        assert!(store.get(&scope).await.expect("get").is_some());
    }

    /// A released key executes again as a fresh first attempt.
    pub async fn release_lets_the_key_execute_again<S: Store>(store: S, _clock: ManualClock) {
        let scope = test_scope("/v1/charges", "release-key");
        let req = request(&scope, r#"{"amount":1}"#);
        let lease = acquire(&store, &req).await;
        store.release(&lease).await.expect("release");
        assert!(store.get(&scope).await.expect("get").is_none());
        // Even a corrected payload may now use the key.
        let corrected = request(&scope, r#"{"amount":2}"#);
        let again = acquire(&store, &corrected).await;
        assert_eq!(again.attempt, 1);
        assert!(!again.recovered());
        assert_ne!(again.token, lease.token);
    }

    /// An expired record counts as absent: the key executes again, any payload.
    pub async fn expired_record_counts_as_absent<S: Store>(store: S, clock: ManualClock) {
        let scope = test_scope("/v1/charges", "expiry-key");
        let req = request(&scope, r#"{"amount":1}"#);
        let lease = acquire(&store, &req).await;
        store.complete(&lease, &response()).await.expect("complete");
        clock.advance(TTL - Duration::from_secs(1));
        assert_eq!(
            store.reserve(&req).await.expect("reserve"),
            Reservation::Replay(response())
        );
        clock.advance(Duration::from_secs(1));
        let other = request(&scope, r#"{"amount":2}"#);
        let again = acquire(&store, &other).await;
        assert_eq!(again.attempt, 1);
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert_eq!(record.fingerprint, test_fingerprint(r#"{"amount":2}"#));
        assert!(!record.is_completed());
        // The old attempt cannot write into the new record.
        assert_fenced(
            store
                .complete(&lease, &StoredResponse::new(200, "old"))
                .await,
            "complete after expiry",
        );
    }

    /// 32 tasks offer different secrets under one name at once: every one gets the same
    /// value back, one of those offered, and later callers get it too. A purge after
    /// every record's expiry leaves it, and another name is a secret of its own.
    pub async fn secret_is_stored_once_and_never_purged<S: Store>(store: S, clock: ManualClock) {
        let store = Arc::new(store);
        let name = crate::TENANT_SECRET_NAME;
        let barrier = Arc::new(tokio::sync::Barrier::new(32));
        let candidates: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 32]).collect();
        let tasks: Vec<_> = candidates
            .iter()
            .cloned()
            .map(|candidate| {
                let (store, barrier) = (store.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .init_secret(name, &candidate)
                        .await
                        .expect("init_secret")
                })
            })
            .collect();
        let mut got = HashSet::new();
        for t in tasks {
            got.insert(t.await.expect("task"));
        }
        assert_eq!(got.len(), 1, "callers at once got different secrets");
        let stored = got.into_iter().next().expect("one secret");
        assert!(candidates.contains(&stored), "the secret is one offered");
        assert_eq!(
            store.init_secret(name, &[0xff; 32]).await.expect("again"),
            stored,
            "a later caller gets the stored secret"
        );
        let other = store
            .init_secret("other", &[0xee; 40])
            .await
            .expect("other");
        assert_eq!(other, vec![0xee; 40], "another name is its own secret");

        let lease = acquire(&*store, &request(&test_scope("/secret", "k"), "{}")).await;
        store.complete(&lease, &response()).await.expect("complete");
        clock.advance(TTL * 3);
        while store.purge_expired(100).await.expect("purge") > 0 {}
        assert_eq!(
            store
                .init_secret(name, &[0xfe; 32])
                .await
                .expect("after purge"),
            stored,
            "a purge deleted the secret"
        );
    }

    /// A TTL shorter than the lease (SPEC S8): the lease keeps a running attempt's record
    /// alive past the TTL, but a completed record expires at its creation plus the TTL,
    /// and purge removes it then.
    pub async fn completed_record_expires_at_its_ttl_though_the_lease_is_longer<S: Store>(
        store: S,
        clock: ManualClock,
    ) {
        let ttl = Duration::from_secs(2);
        let short = |scope: &Scope| {
            ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
                .ttl(ttl)
                .lease(LEASE)
        };
        let start = clock.now();
        // Completed within the TTL: replayed until creation + TTL, then absent.
        let done = test_scope("/short-ttl", "completed");
        let lease = acquire(&store, &short(&done)).await;
        // Running past the TTL: still in progress, as its lease says.
        let running = test_scope("/short-ttl", "running");
        let running_lease = acquire(&store, &short(&running)).await;
        clock.advance(Duration::from_secs(1));
        store.complete(&lease, &response()).await.expect("complete");
        clock.advance(Duration::from_millis(999));
        assert_eq!(
            store.reserve(&short(&done)).await.expect("reserve"),
            Reservation::Replay(response())
        );
        let record = store.get(&done).await.expect("get").expect("stored");
        assert_eq!(record.expires_at, start.plus(ttl), "creation + TTL");
        clock.advance(Duration::from_millis(1));
        assert!(matches!(
            store.reserve(&short(&running)).await.expect("reserve"),
            Reservation::InProgress { .. }
        ));
        assert_eq!(
            store.purge_expired(100).await.expect("purge"),
            1,
            "the completed record, not the running one"
        );
        assert!(store.get(&done).await.expect("get").is_none());
        let again = acquire(&store, &short(&done)).await;
        assert_eq!((again.attempt, again.recovered()), (1, false));

        // An attempt that outlives the TTL is recorded, and its record expires at once:
        // the TTL is how long an answer is kept, counted from the first request.
        clock.advance(Duration::from_secs(30));
        store.renew(&running_lease, LEASE).await.expect("renew");
        store
            .complete(&running_lease, &response())
            .await
            .expect("complete past the TTL");
        let next = acquire(&store, &short(&running)).await;
        assert_eq!((next.attempt, next.recovered()), (1, false));
    }

    /// Purge deletes only expired records, at most `limit` per call.
    pub async fn purge_removes_only_expired_in_bounded_batches<S: Store>(
        store: S,
        clock: ManualClock,
    ) {
        let short = Duration::from_secs(10);
        let mut old = Vec::new();
        for i in 0..25 {
            let scope = test_scope("/purge", &format!("old-{i}"));
            let req = ReserveRequest::new(scope.clone(), test_fingerprint("{}"))
                .ttl(short)
                .lease(Duration::from_secs(5));
            let lease = acquire(&store, &req).await;
            if i % 2 == 0 {
                store.complete(&lease, &response()).await.expect("complete");
            }
            old.push(scope);
        }
        let mut live = Vec::new();
        for i in 0..5 {
            let scope = test_scope("/purge", &format!("live-{i}"));
            let lease = acquire(&store, &request(&scope, "{}")).await;
            store.complete(&lease, &response()).await.expect("complete");
            live.push(scope);
        }
        assert_eq!(
            store.purge_expired(100).await.expect("purge"),
            0,
            "nothing expired yet"
        );
        clock.advance(short);
        let mut purged = 0;
        let mut calls = 0;
        loop {
            let n = store.purge_expired(10).await.expect("purge");
            assert!(n <= 10, "a batch removed {n} > 10 records");
            purged += n;
            calls += 1;
            if n == 0 {
                break;
            }
            assert!(calls < 100, "purge does not converge");
        }
        assert_eq!(purged, 25);
        assert!(
            calls >= 3,
            "25 records in batches of 10 take at least 3 calls"
        );
        for s in &old {
            assert!(
                store.get(s).await.expect("get").is_none(),
                "{s:?} not purged"
            );
        }
        for s in &live {
            assert!(
                store.get(s).await.expect("get").is_some(),
                "{s:?} purged too early"
            );
        }
    }

    /// The same key under two tenants, or two endpoints in public mode, names two
    /// records; in internal mode two endpoints share one.
    pub async fn scopes_never_collide<S: Store>(store: S, _clock: ManualClock) {
        let key = Key::new("shared-key").expect("key");
        let a = Tenant::new(format!("a-{:x}", getrandom::u64().unwrap_or(1)));
        let b = Tenant::new(format!("b-{:x}", getrandom::u64().unwrap_or(2)));
        let ep1 = Endpoint::new("POST", "/v1/orders");
        let ep2 = Endpoint::new("POST", "/v1/refunds");
        let scopes = [
            Scope::new(ScopeMode::Public, a.clone(), ep1.clone(), key.clone()),
            Scope::new(ScopeMode::Public, b.clone(), ep1.clone(), key.clone()),
            Scope::new(ScopeMode::Public, a.clone(), ep2.clone(), key.clone()),
            Scope::new(ScopeMode::Internal, a.clone(), ep1.clone(), key.clone()),
        ];
        let mut tokens = HashSet::new();
        for (i, scope) in scopes.iter().enumerate() {
            let lease = acquire(&store, &request(scope, "{}")).await;
            tokens.insert(lease.token);
            let resp = StoredResponse::new(200, format!("answer {i}"));
            store.complete(&lease, &resp).await.expect("complete");
        }
        assert_eq!(tokens.len(), 4);
        for (i, scope) in scopes.iter().enumerate() {
            assert_eq!(
                store.reserve(&request(scope, "{}")).await.expect("reserve"),
                Reservation::Replay(StoredResponse::new(200, format!("answer {i}"))),
                "{scope:?} must see only its own answer"
            );
        }
        let internal_other_endpoint = Scope::new(ScopeMode::Internal, a, ep2, key);
        assert_eq!(
            store
                .reserve(&request(&internal_other_endpoint, "{}"))
                .await
                .expect("reserve"),
            Reservation::Replay(StoredResponse::new(200, "answer 3"))
        );
    }

    /// `get` shows every field of a record; `remove` deletes it whatever its state.
    pub async fn get_and_remove_show_and_delete_records<S: Store>(store: S, clock: ManualClock) {
        use crate::Clock;
        let scope = test_scope("/v1/charges", "inspect-key");
        assert!(store.get(&scope).await.expect("get").is_none());
        assert!(!store.remove(&scope).await.expect("remove"));
        let start = clock.now();
        let lease = acquire(&store, &request(&scope, r#"{"a":1}"#)).await;
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert_eq!(record.scope, scope);
        assert_eq!(record.fingerprint, test_fingerprint(r#"{"a":1}"#));
        assert_eq!(record.created_at, start);
        assert_eq!(record.expires_at, start.plus(TTL));
        assert_eq!(record.attempt, 1);
        assert_eq!(record.token, lease.token);
        assert_eq!(
            record.state,
            RecordState::InProgress {
                lease_until: start.plus(LEASE)
            }
        );
        clock.advance(Duration::from_secs(3));
        store.complete(&lease, &response()).await.expect("complete");
        let record = store.get(&scope).await.expect("get").expect("stored");
        assert_eq!(
            record.state,
            RecordState::Completed {
                response: response(),
                completed_at: start.plus(Duration::from_secs(3))
            }
        );
        assert!(store.remove(&scope).await.expect("remove"));
        assert!(store.get(&scope).await.expect("get").is_none());
        assert_fenced(
            store.complete(&lease, &response()).await,
            "complete after remove",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_via_replaces_only_host_and_port() {
        let addr: std::net::SocketAddr = "10.0.0.9:7000".parse().unwrap();
        for (url, via) in [
            ("redis://127.0.0.1:6379", "redis://10.0.0.9:7000"),
            ("redis://:pw@db:6379/2", "redis://:pw@10.0.0.9:7000/2"),
            (
                "postgres://postgres@127.0.0.1:5432/test",
                "postgres://postgres@10.0.0.9:7000/test",
            ),
            (
                "postgres://u:p@db/idem?sslmode=disable",
                "postgres://u:p@10.0.0.9:7000/idem?sslmode=disable",
            ),
        ] {
            assert_eq!(url_via(url, addr), via, "{url}");
        }
    }

    /// A loopback echo server, for the relay's tests.
    async fn echo() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut rx, mut tx) = conn.split();
                    let _ = tokio::io::copy(&mut rx, &mut tx).await;
                });
            }
        });
        addr
    }

    /// Sends `ping` on `conn` and reads what comes back within `within`: the echo,
    /// `Some(empty)` for a closed or reset connection, `None` for silence.
    async fn ping(conn: &mut tokio::net::TcpStream, within: Duration) -> Option<Vec<u8>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if conn.write_all(b"ping").await.is_err() {
            return Some(Vec::new());
        }
        let mut buf = [0u8; 4];
        match tokio::time::timeout(within, conn.read(&mut buf)).await {
            Err(_) => None,
            Ok(Ok(n)) => Some(buf[..n].to_vec()),
            Ok(Err(_)) => Some(Vec::new()),
        }
    }

    async fn connect(relay: &Relay) -> std::io::Result<tokio::net::TcpStream> {
        tokio::net::TcpStream::connect(relay.addr()).await
    }

    const ANSWER: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn relay_modes_refuse_reset_and_stall_then_forward_again() {
        let relay = Relay::start(echo().await).await;
        let mut live = connect(&relay).await.unwrap();
        assert_eq!(ping(&mut live, ANSWER).await.unwrap(), b"ping");

        // Down: the live connection is reset, a new one refused; back on the same port.
        relay.set_mode(RelayMode::Refuse);
        assert_eq!(ping(&mut live, ANSWER).await.unwrap(), b"");
        let refused = async {
            loop {
                if connect(&relay).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(ANSWER, refused)
            .await
            .expect("the port closes");
        relay.set_mode(RelayMode::Forward);
        let again = async {
            loop {
                if let Ok(conn) = connect(&relay).await {
                    return conn;
                }
                tokio::task::yield_now().await;
            }
        };
        let mut conn = tokio::time::timeout(ANSWER, again)
            .await
            .expect("the port reopens");
        assert_eq!(ping(&mut conn, ANSWER).await.unwrap(), b"ping");

        // A broken link: live and new connections are reset.
        relay.set_mode(RelayMode::Reset);
        assert_eq!(ping(&mut conn, ANSWER).await.unwrap(), b"");
        let mut new = connect(&relay).await.unwrap();
        assert_eq!(ping(&mut new, ANSWER).await.unwrap(), b"");

        // A silent service: nothing comes back on live or new connections, until the
        // mode changes and they are reset.
        relay.set_mode(RelayMode::Forward);
        let mut held = connect(&relay).await.unwrap();
        assert_eq!(ping(&mut held, ANSWER).await.unwrap(), b"ping");
        relay.set_mode(RelayMode::Stall);
        let mut stalled = connect(&relay).await.unwrap();
        let quiet = Duration::from_millis(200);
        assert_eq!(
            ping(&mut held, quiet).await,
            None,
            "a held connection is silent"
        );
        assert_eq!(ping(&mut stalled, quiet).await, None, "a new one too");
        relay.set_mode(RelayMode::Forward);
        let mut buf = [0u8; 4];
        use tokio::io::AsyncReadExt;
        for conn in [&mut held, &mut stalled] {
            let read = tokio::time::timeout(ANSWER, conn.read(&mut buf)).await;
            assert!(
                matches!(read, Ok(Ok(0)) | Ok(Err(_))),
                "reset when the stall ends"
            );
        }
        let mut fresh = connect(&relay).await.unwrap();
        assert_eq!(ping(&mut fresh, ANSWER).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn service_addr_adds_the_default_port() {
        let named = service_addr("redis://127.0.0.1:6380", 6379).await;
        assert_eq!(named, "127.0.0.1:6380".parse().unwrap());
        let default = service_addr("postgres://u@127.0.0.1/test", 5432).await;
        assert_eq!(default, "127.0.0.1:5432".parse().unwrap());
    }
}
