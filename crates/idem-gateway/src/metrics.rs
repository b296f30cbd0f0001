//! Prometheus metrics for the admin listener's `/metrics`: requests by idempotency
//! outcome, a store latency histogram per operation, the in-flight gauge, and the
//! store's own figures.
//!
//! The text exposition format is simple enough that a few atomics and `write!` cover it;
//! no metrics framework is pulled in.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use idem_core::{MetricKind, Store};
use idem_tower::{Observer, Outcome};

use crate::listener::ListenerKind;

/// Histogram bucket upper bounds, in seconds: from a fast in-process store to a slow
/// network round trip.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Outcomes listed even before they first happen, so dashboards see zeros.
const KNOWN_OUTCOMES: [&str; 10] = [
    "executed",
    "replayed",
    "replay_unavailable",
    "conflict",
    "mismatch",
    "released",
    "kept_in_progress",
    "rejected",
    "store_unavailable",
    "passed_through",
];

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

/// The gateway's counters; shared by the proxy, the idempotency layer (as its
/// [`Observer`]) and the admin listener.
#[derive(Default)]
pub struct Metrics {
    outcomes: RwLock<BTreeMap<&'static str, AtomicU64>>,
    store: RwLock<BTreeMap<(&'static str, bool), Histogram>>,
    in_flight: AtomicI64,
    /// Upgraded connections (WebSocket and the like) tunnelled to the upstream now.
    tunnels: AtomicI64,
    upstream_errors: RwLock<BTreeMap<&'static str, AtomicU64>>,
    /// Failed store calls by operation and [`idem_core::StoreError::label`].
    store_errors: RwLock<BTreeMap<(&'static str, &'static str), AtomicU64>>,
    /// Key writes going on in the background, and those given up, by op
    /// ([`KEY_WRITES`]).
    deferred_writes: [AtomicI64; 2],
    abandoned_writes: [AtomicU64; 2],
    /// Connections open now, their caps, the times a listener waited at its cap, and
    /// failed accepts, by listener ([`ListenerKind::index`]).
    connections_open: [AtomicI64; 2],
    connections_max: [AtomicU64; 2],
    connection_waits: [AtomicU64; 2],
    accept_errors: [AtomicU64; 2],
    /// The store whose own figures (`Store::metrics`) are rendered too.
    figures_of: Option<Arc<dyn Store>>,
}

/// The key writes that may go on in the background (see [`Observer::write_deferred`]).
const KEY_WRITES: [&str; 2] = ["complete", "release"];

fn key_write(op: &str) -> Option<usize> {
    KEY_WRITES.iter().position(|w| *w == op)
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn bump<K: Ord + Copy>(map: &RwLock<BTreeMap<K, AtomicU64>>, label: K) {
    if let Some(c) = map.read().expect("metrics lock").get(&label) {
        c.fetch_add(1, Ordering::Relaxed);
        return;
    }
    map.write()
        .expect("metrics lock")
        .entry(label)
        .or_default()
        .fetch_add(1, Ordering::Relaxed);
}

impl Metrics {
    /// Empty metrics with every known outcome at zero.
    pub fn new() -> Metrics {
        let m = Metrics::default();
        {
            let mut o = m.outcomes.write().expect("metrics lock");
            for label in KNOWN_OUTCOMES {
                o.insert(label, AtomicU64::new(0));
            }
        }
        m
    }

    /// Renders `store`'s own figures ([`Store::metrics`]: a SQLite writer's queue and
    /// transactions, a pool's connections) with the rest.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Metrics {
        self.figures_of = Some(store);
        self
    }

    /// Counts one request's outcome by its label.
    pub fn count_outcome(&self, label: &'static str) {
        bump(&self.outcomes, label);
    }

    /// How many requests had an outcome so far.
    pub fn outcome_count(&self, label: &str) -> u64 {
        self.outcomes
            .read()
            .expect("metrics lock")
            .get(label)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Records one store call's latency.
    pub fn observe_store(&self, op: &'static str, elapsed: Duration, ok: bool) {
        if let Some(h) = self.store.read().expect("metrics lock").get(&(op, ok)) {
            h.observe(elapsed);
            return;
        }
        self.store
            .write()
            .expect("metrics lock")
            .entry((op, ok))
            .or_default()
            .observe(elapsed);
    }

    /// Counts an upstream failure by kind (`unreachable`, `timeout`, `failed`).
    pub fn count_upstream_error(&self, kind: &'static str) {
        bump(&self.upstream_errors, kind);
    }

    /// Marks a request in flight until the guard drops.
    pub fn in_flight_guard(self: &Arc<Self>) -> GaugeGuard {
        self.hold(|m| &m.in_flight)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Counts an upgraded connection as open until the guard drops.
    pub fn tunnel_guard(self: &Arc<Self>) -> GaugeGuard {
        self.hold(|m| &m.tunnels)
    }

    /// Raises `gauge` by one until the guard drops.
    fn hold(self: &Arc<Self>, gauge: fn(&Metrics) -> &AtomicI64) -> GaugeGuard {
        gauge(self).fetch_add(1, Ordering::Relaxed);
        GaugeGuard {
            metrics: self.clone(),
            gauge,
        }
    }

    /// Upgraded connections open now.
    pub fn tunnels(&self) -> i64 {
        self.tunnels.load(Ordering::Relaxed)
    }

    /// Counts a connection of `listener` as open until the guard drops.
    pub fn connection_guard(self: &Arc<Self>, listener: ListenerKind) -> GaugeGuard {
        self.hold(match listener {
            ListenerKind::Proxy => |m| &m.connections_open[0],
            ListenerKind::Admin => |m| &m.connections_open[1],
        })
    }

    /// Connections of `listener` open now.
    pub fn connections_open(&self, listener: ListenerKind) -> i64 {
        self.connections_open[listener.index()].load(Ordering::Relaxed)
    }

    /// Sets the most connections `listener` holds open.
    pub fn set_max_connections(&self, listener: ListenerKind, max: usize) {
        let max = u64::try_from(max).unwrap_or(u64::MAX);
        self.connections_max[listener.index()].store(max, Ordering::Relaxed);
    }

    /// Counts one time `listener` reached its cap and waited for a connection to close.
    pub fn count_connection_wait(&self, listener: ListenerKind) {
        self.connection_waits[listener.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one failed accept on `listener`.
    pub fn count_accept_error(&self, listener: ListenerKind) {
        self.accept_errors[listener.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str(
            "# HELP idem_requests_total Requests by idempotency outcome.\n\
             # TYPE idem_requests_total counter\n",
        );
        for (label, c) in self.outcomes.read().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "idem_requests_total{{outcome=\"{label}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        out.push_str(
            "# HELP idem_in_flight_requests Requests the gateway is handling now.\n\
             # TYPE idem_in_flight_requests gauge\n",
        );
        let _ = writeln!(out, "idem_in_flight_requests {}", self.in_flight());
        out.push_str(
            "# HELP idem_upgraded_connections Upgraded connections (WebSocket and the like) \
             tunnelled to the upstream now.\n\
             # TYPE idem_upgraded_connections gauge\n",
        );
        let _ = writeln!(out, "idem_upgraded_connections {}", self.tunnels());
        let by_listener =
            |out: &mut String, name: &str, kind: &str, help: &str, values: [u64; 2]| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for (listener, value) in ListenerKind::ALL.iter().zip(values) {
                    let _ = writeln!(out, "{name}{{listener=\"{}\"}} {value}", listener.as_str());
                }
            };
        let load = |a: &[AtomicU64; 2]| a.each_ref().map(|c| c.load(Ordering::Relaxed));
        by_listener(
            &mut out,
            "idem_connections_open",
            "gauge",
            "Client connections open now, by listener; WebSocket tunnels included.",
            self.connections_open
                .each_ref()
                .map(|c| u64::try_from(c.load(Ordering::Relaxed)).unwrap_or(0)),
        );
        by_listener(
            &mut out,
            "idem_connections_max",
            "gauge",
            "The most connections each listener holds open (the proxy's is \
             --max-connections); at it, the listener accepts no more until one closes.",
            load(&self.connections_max),
        );
        by_listener(
            &mut out,
            "idem_connection_waits_total",
            "counter",
            "Times a listener reached its connection cap and stopped accepting until a \
             connection closed; connections arriving meanwhile wait in the kernel's backlog.",
            load(&self.connection_waits),
        );
        by_listener(
            &mut out,
            "idem_accept_errors_total",
            "counter",
            "Accepts that failed (out of file descriptors and the like), by listener; \
             after each the listener pauses, from 50 ms doubling to 1 s.",
            load(&self.accept_errors),
        );
        out.push_str(
            "# HELP idem_upstream_errors_total Upstream calls that failed, by kind.\n\
             # TYPE idem_upstream_errors_total counter\n",
        );
        for (kind, c) in self.upstream_errors.read().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "idem_upstream_errors_total{{kind=\"{kind}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        out.push_str(
            "# HELP idem_store_errors_total Store calls that failed, by operation and kind \
             (fenced: another attempt had taken the record over, as the lease lapsed; \
             unavailable; full; corrupt).\n\
             # TYPE idem_store_errors_total counter\n",
        );
        for ((op, kind), c) in self.store_errors.read().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "idem_store_errors_total{{op=\"{op}\",kind=\"{kind}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        out.push_str(
            "# HELP idem_store_call_duration_seconds Latency of idempotency store calls.\n\
             # TYPE idem_store_call_duration_seconds histogram\n",
        );
        for ((op, ok), h) in self.store.read().expect("metrics lock").iter() {
            let labels = format!("op=\"{op}\",ok=\"{ok}\"");
            let mut cumulative = 0;
            for (bound, c) in BUCKETS.iter().zip(&h.buckets) {
                cumulative += c.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "idem_store_call_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
            let count = h.count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "idem_store_call_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {count}"
            );
            let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "idem_store_call_duration_seconds_sum{{{labels}}} {sum}"
            );
            let _ = writeln!(
                out,
                "idem_store_call_duration_seconds_count{{{labels}}} {count}"
            );
        }
        out.push_str(
            "# HELP idem_deferred_key_writes Answers being recorded (op complete) or keys \
             being released (op release) in the background, because the store failed \
             every try before the client got its answer; retries of those keys get 409 \
             meanwhile.\n\
             # TYPE idem_deferred_key_writes gauge\n",
        );
        for (op, n) in KEY_WRITES.iter().zip(&self.deferred_writes) {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(out, "idem_deferred_key_writes{{op=\"{op}\"}} {n}");
        }
        out.push_str(
            "# HELP idem_abandoned_key_writes_total Background key writes given up after \
             a lease's length: each key stays in progress until its lease lapses, and after \
             an unrecorded answer (op complete) the next retry runs the upstream again.\n\
             # TYPE idem_abandoned_key_writes_total counter\n",
        );
        for (op, n) in KEY_WRITES.iter().zip(&self.abandoned_writes) {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(out, "idem_abandoned_key_writes_total{{op=\"{op}\"}} {n}");
        }
        for m in self.figures_of.iter().flat_map(|s| s.metrics()) {
            let kind = match m.kind {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
            };
            let (name, help, value) = (m.name, m.help, m.value);
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            );
        }
        out
    }
}

impl Observer for Metrics {
    fn outcome(&self, outcome: Outcome) {
        self.count_outcome(outcome.as_str());
    }

    fn store_call(&self, op: &'static str, elapsed: Duration, ok: bool) {
        self.observe_store(op, elapsed, ok);
    }

    fn store_error(&self, op: &'static str, error: &idem_core::StoreError) {
        bump(&self.store_errors, (op, error.label()));
    }

    fn write_deferred(&self, op: &'static str) {
        if let Some(i) = key_write(op) {
            self.deferred_writes[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn deferred_write_ended(&self, op: &'static str, settled: bool) {
        if let Some(i) = key_write(op) {
            self.deferred_writes[i].fetch_sub(1, Ordering::Relaxed);
            if !settled {
                self.abandoned_writes[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Lowers a gauge (requests in flight, upgraded connections) again when dropped.
#[derive(Debug)]
pub struct GaugeGuard {
    metrics: Arc<Metrics>,
    gauge: fn(&Metrics) -> &AtomicI64,
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        (self.gauge)(&self.metrics).fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_outcomes_histogram_and_gauge() {
        let m = Arc::new(Metrics::new());
        m.outcome(Outcome::Replayed);
        m.outcome(Outcome::Replayed);
        m.store_call("reserve", Duration::from_micros(300), true);
        m.store_call("reserve", Duration::from_millis(30), true);
        for _ in 0..2 {
            m.store_error("complete", &idem_core::StoreError::Fenced);
        }
        m.store_error("reserve", &idem_core::StoreError::unavailable("refused"));
        let g = m.in_flight_guard();
        let t = m.tunnel_guard();
        let text = m.render();
        assert!(text.contains(
            "# TYPE idem_store_errors_total counter\n\
             idem_store_errors_total{op=\"complete\",kind=\"fenced\"} 2\n\
             idem_store_errors_total{op=\"reserve\",kind=\"unavailable\"} 1\n"
        ));
        assert!(text.contains("idem_requests_total{outcome=\"replayed\"} 2\n"));
        assert!(text.contains("idem_requests_total{outcome=\"mismatch\"} 0\n"));
        assert!(text.contains("idem_in_flight_requests 1\n"));
        assert!(
            text.contains("# TYPE idem_upgraded_connections gauge\nidem_upgraded_connections 1\n")
        );
        assert!(text.contains(
            "idem_store_call_duration_seconds_bucket{op=\"reserve\",ok=\"true\",le=\"0.0005\"} 1\n"
        ));
        assert!(text.contains(
            "idem_store_call_duration_seconds_bucket{op=\"reserve\",ok=\"true\",le=\"0.05\"} 2\n"
        ));
        assert!(
            text.contains("idem_store_call_duration_seconds_count{op=\"reserve\",ok=\"true\"} 2\n")
        );
        drop((g, t));
        assert_eq!(m.in_flight(), 0);
        assert_eq!(m.tunnels(), 0);
    }

    #[test]
    fn renders_connections_by_listener() {
        let m = Arc::new(Metrics::new());
        let text = m.render();
        assert!(text.contains(
            "# TYPE idem_connections_open gauge\n\
             idem_connections_open{listener=\"proxy\"} 0\n\
             idem_connections_open{listener=\"admin\"} 0\n"
        ));
        m.set_max_connections(ListenerKind::Proxy, 452);
        m.set_max_connections(ListenerKind::Admin, 32);
        let open = [
            m.connection_guard(ListenerKind::Proxy),
            m.connection_guard(ListenerKind::Proxy),
            m.connection_guard(ListenerKind::Admin),
        ];
        m.count_connection_wait(ListenerKind::Proxy);
        m.count_accept_error(ListenerKind::Admin);
        let text = m.render();
        for line in [
            "idem_connections_open{listener=\"proxy\"} 2",
            "idem_connections_open{listener=\"admin\"} 1",
            "idem_connections_max{listener=\"proxy\"} 452",
            "idem_connections_max{listener=\"admin\"} 32",
            "idem_connection_waits_total{listener=\"proxy\"} 1",
            "idem_connection_waits_total{listener=\"admin\"} 0",
            "idem_accept_errors_total{listener=\"proxy\"} 0",
            "idem_accept_errors_total{listener=\"admin\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(text.contains("# TYPE idem_connection_waits_total counter\n"));
        drop(open);
        assert_eq!(m.connections_open(ListenerKind::Proxy), 0);
        assert_eq!(m.connections_open(ListenerKind::Admin), 0);
    }

    #[test]
    fn counts_deferred_key_writes_and_those_given_up() {
        let m = Metrics::new();
        let text = m.render();
        assert!(text.contains("idem_deferred_key_writes{op=\"complete\"} 0\n"));
        assert!(text.contains("idem_abandoned_key_writes_total{op=\"release\"} 0\n"));
        for _ in 0..3 {
            m.write_deferred("complete");
        }
        m.write_deferred("release");
        m.deferred_write_ended("complete", true);
        m.deferred_write_ended("complete", false);
        let text = m.render();
        assert!(text.contains(
            "# TYPE idem_deferred_key_writes gauge\n\
             idem_deferred_key_writes{op=\"complete\"} 1\n\
             idem_deferred_key_writes{op=\"release\"} 1\n"
        ));
        assert!(text.contains(
            "# TYPE idem_abandoned_key_writes_total counter\n\
             idem_abandoned_key_writes_total{op=\"complete\"} 1\n\
             idem_abandoned_key_writes_total{op=\"release\"} 0\n"
        ));
    }

    /// Every metric the exposition carries: `name type label,label` per line, sorted,
    /// with a histogram's `le` left out. A dashboard or alert is written against these,
    /// so a change to one shows up here as a diff of `metrics.txt`.
    fn inventory(text: &str) -> String {
        let mut kinds = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                kinds.insert(
                    name.to_owned(),
                    (kind.to_owned(), std::collections::BTreeSet::new()),
                );
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let series = line.split(' ').next().unwrap_or_default();
            let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|s| name.strip_suffix(s))
                .find(|f| kinds.get(*f).is_some_and(|(k, _)| k == "histogram"))
                .unwrap_or(name);
            let (_, keys) = kinds
                .get_mut(family)
                .unwrap_or_else(|| panic!("{name} has no TYPE line"));
            for pair in labels
                .trim_end_matches('}')
                .split(',')
                .filter(|p| !p.is_empty())
            {
                let key = pair.split_once('=').expect("label=value").0;
                if key != "le" {
                    keys.insert(key.to_owned());
                }
            }
        }
        kinds
            .into_iter()
            .map(|(name, (kind, keys))| {
                let keys: Vec<_> = keys.into_iter().collect();
                format!("{name} {kind} {}\n", keys.join(",")).replace(" \n", "\n")
            })
            .collect()
    }

    #[test]
    fn exposes_the_metrics_in_metrics_txt() {
        let m = Arc::new(Metrics::new());
        m.outcome(Outcome::Executed);
        m.store_call("reserve", Duration::from_millis(1), true);
        m.store_error("reserve", &idem_core::StoreError::Fenced);
        m.count_upstream_error("timeout");
        m.write_deferred("complete");
        let text = m.render();
        assert_eq!(inventory(&text), include_str!("metrics.txt"), "{text}");
    }

    #[tokio::test]
    async fn renders_the_stores_own_figures() {
        use idem_core::testing::{test_fingerprint, test_scope};
        use idem_core::{ReserveRequest, StoredResponse};

        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("m.db").display());
        let store: Arc<dyn Store> =
            Arc::new(idem_sqlite::SqliteStore::connect(&url).await.unwrap());
        let m = Metrics::new().with_store(store.clone());
        let request = ReserveRequest::new(test_scope("/v1/charges", "k1"), test_fingerprint("{}"));
        let lease = store
            .reserve(&request)
            .await
            .unwrap()
            .lease()
            .cloned()
            .unwrap();
        store
            .complete(&lease, &StoredResponse::new(201, "{}"))
            .await
            .unwrap();

        let text = m.render();
        assert!(
            text.contains(
                "# HELP idem_sqlite_writes_total Writes committed by the SQLite writer.\n\
                 # TYPE idem_sqlite_writes_total counter\n\
                 idem_sqlite_writes_total 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "# TYPE idem_sqlite_pending_writes gauge\nidem_sqlite_pending_writes 0\n"
            )
        );
        assert!(text.contains("\nidem_sqlite_failed_write_transactions_total 0\n"));

        // The memory store adds its own figures after the gateway's, and nothing else.
        let with_memory = Metrics::new()
            .with_store(Arc::new(idem_core::MemoryStore::new().max_entries(500)))
            .render();
        let bare = Metrics::new().render();
        assert_eq!(
            with_memory.strip_prefix(&bare),
            Some(
                "# HELP idem_memory_records Records the in-memory store holds, expired ones not \
                 yet purged included.\n\
                 # TYPE idem_memory_records gauge\n\
                 idem_memory_records 0\n\
                 # HELP idem_memory_max_records The most records the in-memory store holds.\n\
                 # TYPE idem_memory_max_records gauge\n\
                 idem_memory_max_records 500\n\
                 # HELP idem_memory_evictions_total Completed records the in-memory store \
                 dropped before they expired, to make room; a retry of one executes again.\n\
                 # TYPE idem_memory_evictions_total counter\n\
                 idem_memory_evictions_total 0\n"
            ),
            "{with_memory}"
        );
        store.close().await;
    }
}
