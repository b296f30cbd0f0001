//! Prometheus metrics for the admin listener's `/metrics`: requests by idempotency
//! outcome, a store latency histogram per operation, the in-flight gauge, the JWKS's
//! loads, and the store's own figures.
//!
//! The metric types and the text exposition (format 0.0.4, which every Prometheus
//! scrapes) are prometheus-client's; `series` keeps each metric's series in label
//! order, `figures` reads the store's own at each scrape. The names, types and labels
//! are checked against `metrics.txt` beside this file.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use idem_core::Store;
use idem_tower::{Observer, Outcome, UpstreamFailure};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub(crate) use self::listener_kind::ListenerKind;
use figures::StoreFigures;
use series::{
    ByKind, ByListener, ByOp, ByOutcome, ByReason, ByWaitEnd, Series, StoreCall, StoreFailure,
    by_listener,
};

mod figures;
mod jwks;
mod listener_kind;
mod series;
mod tenants;

pub(crate) use tenants::DEFAULT_TENANT_METRICS;
#[cfg(test)]
mod tests;

/// Histogram bucket upper bounds, in seconds: from a fast in-process store to a slow
/// network round trip.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The key writes that may go on in the background (see [`Observer::write_deferred`]).
const KEY_WRITES: [&str; 2] = ["complete", "release"];

/// How a duplicate's wait can end ([`Observer::wait_ended`]).
const WAIT_ENDS: [&str; 5] = ["replay", "retry", "timeout", "abandoned", "other"];

/// A gauge of whole numbers that are never negative (a connection cap).
type Level = Gauge<u64, AtomicU64>;

/// The gateway's counters; shared by the proxy, the idempotency layer (as its
/// [`Observer`]) and the admin listener.
pub struct Metrics {
    registry: Registry,
    outcomes: Series<ByOutcome, Counter>,
    store_calls: Series<StoreCall, Histogram>,
    in_flight: Gauge,
    /// Upgraded connections (WebSocket and the like) tunnelled to the upstream now.
    tunnels: Gauge,
    /// Upstream failures by kind ([`upstream_error_label`]), counted as the layer (or,
    /// without one, the front) answers each: by [`Observer::upstream_failed`] alone.
    upstream_errors: Series<ByKind, Counter>,
    /// Failed store calls by operation and [`idem_core::StoreError::label`].
    store_errors: Series<StoreFailure, Counter>,
    /// Key writes going on in the background, and those given up, by op
    /// ([`KEY_WRITES`]).
    deferred_writes: Series<ByOp, Gauge>,
    abandoned_writes: Series<ByOp, Counter>,
    /// Connections open now, their caps, the times a listener waited at its cap, and
    /// failed accepts, by listener.
    connections_open: Series<ByListener, Gauge>,
    connections_max: Series<ByListener, Level>,
    connection_waits: Series<ByListener, Counter>,
    accept_errors: Series<ByListener, Counter>,
    /// Duplicates waiting for an in-progress attempt now, and the waits that ended, by
    /// how (SPEC S15).
    waiting: Gauge,
    waits: Series<ByWaitEnd, Counter>,
    /// Executions whose outcome the gateway could not know, by reason.
    ambiguous: Series<ByReason, Counter>,
    /// Keyed requests of the busiest tenants.
    tenants: Arc<tenants::TopTenants>,
    /// The JWKS's loads and the waits for them.
    jwks: jwks::JwksCounters,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("in_flight", &self.in_flight.get())
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Empty metrics with every known outcome at zero.
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::default(),
            outcomes: Series::new(),
            store_calls: Series::with(|| Histogram::new(BUCKETS)),
            in_flight: Gauge::default(),
            tunnels: Gauge::default(),
            upstream_errors: Series::new(),
            store_errors: Series::new(),
            deferred_writes: Series::new(),
            abandoned_writes: Series::new(),
            connections_open: Series::new(),
            connections_max: Series::new(),
            connection_waits: Series::new(),
            accept_errors: Series::new(),
            waiting: Gauge::default(),
            waits: Series::new(),
            ambiguous: Series::new(),
            tenants: Arc::new(tenants::TopTenants::new(DEFAULT_TENANT_METRICS)),
            jwks: jwks::JwksCounters::new(),
        };
        for reason in idem_core::Ambiguity::ALL {
            m.ambiguous.touch(ByReason {
                reason: reason.as_str(),
            });
        }
        for ended in WAIT_ENDS {
            m.waits.touch(ByWaitEnd { ended });
        }
        for outcome in Outcome::ALL {
            m.outcomes.touch(ByOutcome {
                outcome: outcome.as_str(),
            });
        }
        for listener in ListenerKind::ALL {
            m.connections_open.touch(by_listener(listener));
            m.connections_max.touch(by_listener(listener));
            m.connection_waits.touch(by_listener(listener));
            m.accept_errors.touch(by_listener(listener));
        }
        for op in KEY_WRITES {
            m.deferred_writes.touch(ByOp { op });
            m.abandoned_writes.touch(ByOp { op });
        }
        m.registered()
    }

    /// `self` with every metric in its registry, in the order `/metrics` lists them.
    /// Counters are named without `_total`, which the encoding adds; help texts
    /// without their final period, likewise.
    fn registered(mut self) -> Metrics {
        let r = &mut self.registry;
        r.register(
            "idem_requests",
            "Requests by idempotency outcome",
            self.outcomes.clone(),
        );
        r.register(
            "idem_in_flight_requests",
            "Requests the gateway is handling now",
            self.in_flight.clone(),
        );
        r.register(
            "idem_waiting_requests",
            "Duplicates of in-progress requests waiting for their answer now",
            self.waiting.clone(),
        );
        r.register(
            "idem_waits",
            "Waits of duplicates for an in-progress request that ended, by how",
            self.waits.clone(),
        );
        r.register(
            "idem_ambiguous_outcomes",
            "Executions whose outcome the gateway could not know, by reason (takeover, \
             upstream_timeout, upstream_connection_lost, answer_too_large, handler_failed; \
             orphaned records are found by listing GET /keys?ambiguous=true)",
            self.ambiguous.clone(),
        );
        r.register(
            "idem_upgraded_connections",
            "Upgraded connections (WebSocket and the like) tunnelled to the upstream now",
            self.tunnels.clone(),
        );
        r.register(
            "idem_connections_open",
            "Client connections open now, by listener; WebSocket tunnels included",
            self.connections_open.clone(),
        );
        r.register(
            "idem_connections_max",
            "The most connections each listener holds open (the proxy's is \
             --max-connections); at it, the listener accepts no more until one closes",
            self.connections_max.clone(),
        );
        r.register(
            "idem_connection_waits",
            "Times a listener reached its connection cap and stopped accepting until a \
             connection closed; connections arriving meanwhile wait in the kernel's backlog",
            self.connection_waits.clone(),
        );
        r.register(
            "idem_accept_errors",
            "Accepts that failed (out of file descriptors and the like), by listener; \
             after each the listener pauses, from 50 ms doubling to 1 s",
            self.accept_errors.clone(),
        );
        r.register_collector(Box::new(tenants::TenantFigures(self.tenants.clone())));
        r.register(
            "idem_upstream_errors",
            "Upstream calls that failed, by kind",
            self.upstream_errors.clone(),
        );
        r.register(
            "idem_store_errors",
            "Store calls that failed, by operation and kind (fenced: another attempt had \
             taken the record over, as the lease lapsed; unavailable; full; corrupt)",
            self.store_errors.clone(),
        );
        r.register(
            "idem_store_call_duration_seconds",
            "Latency of idempotency store calls",
            self.store_calls.clone(),
        );
        r.register(
            "idem_deferred_key_writes",
            "Answers being recorded (op complete) or keys being released (op release) in \
             the background, because the store failed every try before the client got its \
             answer; retries of those keys get 409 meanwhile",
            self.deferred_writes.clone(),
        );
        r.register(
            "idem_abandoned_key_writes",
            "Background key writes given up after a lease's length: each key stays in \
             progress until its lease lapses, and after an unrecorded answer (op complete) \
             the next retry runs the upstream again",
            self.abandoned_writes.clone(),
        );
        self.jwks.register(r);
        r.register_collector(Box::new(figures::LogFigures));
        self
    }

    /// Keeps the keyed requests of the `n` busiest tenants (by default
    /// [`DEFAULT_TENANT_METRICS`]); `0` keeps none.
    pub(crate) fn with_tenant_metrics(self, n: usize) -> Metrics {
        self.set_tenant_metrics(n);
        self
    }

    /// Keeps the keyed requests of the `n` busiest tenants from now on (a reload).
    pub(crate) fn set_tenant_metrics(&self, n: usize) {
        self.tenants.set_capacity(n);
    }

    /// Renders `store`'s own figures ([`Store::metrics`]: a SQLite writer's queue and
    /// transactions, a pool's connections) with the rest.
    pub(crate) fn with_store(mut self, store: Arc<dyn Store>) -> Metrics {
        self.registry
            .register_collector(Box::new(StoreFigures(store)));
        self
    }

    /// Counts one request's outcome by its label.
    pub(crate) fn count_outcome(&self, label: &'static str) {
        self.outcomes.at(ByOutcome { outcome: label }, |c| {
            c.inc();
        });
    }

    /// Records one store call's latency.
    pub(crate) fn observe_store(&self, op: &'static str, elapsed: Duration, ok: bool) {
        self.store_calls
            .at(StoreCall { op, ok }, |h| h.observe(elapsed.as_secs_f64()));
    }

    /// Marks a request in flight until the guard drops.
    pub(crate) fn in_flight_guard(self: &Arc<Self>) -> GaugeGuard {
        GaugeGuard::raise(self.in_flight.clone())
    }

    /// Counts an upgraded connection as open until the guard drops.
    pub(crate) fn tunnel_guard(self: &Arc<Self>) -> GaugeGuard {
        GaugeGuard::raise(self.tunnels.clone())
    }

    /// Counts a connection of `listener` as open until the guard drops.
    pub(crate) fn connection_guard(self: &Arc<Self>, listener: ListenerKind) -> GaugeGuard {
        let mut open = None;
        self.connections_open
            .at(by_listener(listener), |g| open = Some(g.clone()));
        GaugeGuard::raise(open.expect("every listener's series is made in new"))
    }

    /// Sets the most connections `listener` holds open.
    pub(crate) fn set_max_connections(&self, listener: ListenerKind, max: usize) {
        let max = u64::try_from(max).unwrap_or(u64::MAX);
        self.connections_max.at(by_listener(listener), |g| {
            g.set(max);
        });
    }

    /// Counts one time `listener` reached its cap and waited for a connection to close.
    pub(crate) fn count_connection_wait(&self, listener: ListenerKind) {
        self.connection_waits.at(by_listener(listener), |c| {
            c.inc();
        });
    }

    /// Counts one failed accept on `listener`.
    pub(crate) fn count_accept_error(&self, listener: ListenerKind) {
        self.accept_errors.at(by_listener(listener), |c| {
            c.inc();
        });
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        prometheus_text::encode(&mut out, &self.registry).expect("writing to a String");
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
        let kind = error.label();
        self.store_errors.at(StoreFailure { op, kind }, |c| {
            c.inc();
        });
    }

    fn write_deferred(&self, op: &'static str) {
        if KEY_WRITES.contains(&op) {
            self.deferred_writes.at(ByOp { op }, |g| {
                g.inc();
            });
        }
    }

    fn deferred_write_ended(&self, op: &'static str, settled: bool) {
        if KEY_WRITES.contains(&op) {
            self.deferred_writes.at(ByOp { op }, |g| {
                g.dec();
            });
            if !settled {
                self.abandoned_writes.at(ByOp { op }, |c| {
                    c.inc();
                });
            }
        }
    }

    fn upstream_failed(&self, failure: UpstreamFailure) {
        let kind = upstream_error_label(failure);
        self.upstream_errors.at(ByKind { kind }, |c| {
            c.inc();
        });
    }

    fn tenant_keyed(&self, tenant: &idem_core::Tenant) {
        self.tenants.keyed(tenant);
    }

    fn tenant_limited(&self, tenant: &idem_core::Tenant, limit: &'static str) {
        self.tenants.limited(tenant, limit);
    }

    fn wait_started(&self) {
        self.waiting.inc();
    }

    fn wait_ended(&self, ended: &'static str) {
        self.waiting.dec();
        self.waits.at(ByWaitEnd { ended }, |c| {
            c.inc();
        });
    }

    /// Counted, and logged by the scope's digest (never the key or the tenant), so an
    /// operator can find the record (`GET /keys?ambiguous=true`) and reconcile it.
    fn ambiguous_outcome(&self, reason: idem_core::Ambiguity, scope_digest: &str) {
        self.ambiguous.at(
            ByReason {
                reason: reason.as_str(),
            },
            |c| {
                c.inc();
            },
        );
        tracing::warn!(
            reason = reason.as_str(),
            scope = scope_digest,
            "ambiguous outcome: the request may have had effects the gateway cannot know; \
             reconcile it with the business records"
        );
    }
}

/// The `kind` label of `idem_upstream_errors_total` for an upstream failure.
fn upstream_error_label(failure: UpstreamFailure) -> &'static str {
    match failure {
        UpstreamFailure::Unreachable => "unreachable",
        UpstreamFailure::Tls => "tls",
        UpstreamFailure::Timeout => "timeout",
        UpstreamFailure::ConnectionLost => "broken",
        UpstreamFailure::AnswerTooLarge => "too_large",
        // `UpstreamFailure` is non-exhaustive; a failure added there is counted apart.
        _ => "other",
    }
}

/// Lowers a gauge (requests in flight, connections, upgraded connections) again when
/// dropped.
#[derive(Debug)]
pub(crate) struct GaugeGuard {
    gauge: Gauge,
}

impl GaugeGuard {
    fn raise(gauge: Gauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard { gauge }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
