//! The layer's store calls and outcomes, traced: each store call a traced request makes
//! is a child span of its server span, and each outcome an attribute of it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Lease, Record, Reservation, ReserveRequest, Scope, Store, StoreError, StoreMetric,
    StoredResponse,
};
use idem_tower::{Observer, Outcome};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use super::{Telemetry, annotate_current, format_traceparent, parse_traceparent};

/// The metrics observer, noting outcomes on the server span as well.
pub(super) struct SpanObserver {
    pub(super) inner: Arc<dyn Observer>,
}

impl Observer for SpanObserver {
    fn outcome(&self, outcome: Outcome) {
        self.inner.outcome(outcome);
        annotate_current(|| vec![KeyValue::new("idem.outcome", outcome.as_str())]);
    }

    fn store_call(&self, op: &'static str, elapsed: Duration, ok: bool) {
        self.inner.store_call(op, elapsed, ok);
    }

    fn store_error(&self, op: &'static str, error: &StoreError) {
        self.inner.store_error(op, error);
    }

    fn write_deferred(&self, op: &'static str) {
        self.inner.write_deferred(op);
        Context::map_current(|cx| {
            cx.span().add_event(
                "idem.write_deferred",
                vec![KeyValue::new("db.operation.name", op)],
            )
        });
    }

    fn deferred_write_ended(&self, op: &'static str, settled: bool) {
        self.inner.deferred_write_ended(op, settled);
    }

    fn upstream_failed(&self, failure: idem_tower::UpstreamFailure) {
        self.inner.upstream_failed(failure);
    }

    fn ambiguous_outcome(&self, reason: idem_core::Ambiguity, scope_digest: &str) {
        self.inner.ambiguous_outcome(reason, scope_digest);
        annotate_current(|| vec![KeyValue::new("idem.ambiguous", reason.as_str())]);
    }

    fn tenant_keyed(&self, tenant: &idem_core::Tenant) {
        self.inner.tenant_keyed(tenant);
    }

    fn tenant_limited(&self, tenant: &idem_core::Tenant, limit: &'static str) {
        self.inner.tenant_limited(tenant, limit);
    }

    fn wait_started(&self) {
        self.inner.wait_started();
    }

    fn wait_ended(&self, ended: &'static str) {
        self.inner.wait_ended(ended);
    }
}

/// The layer's store, traced: see [`Telemetry::store`].
pub(super) struct TracedStore {
    pub(super) inner: Arc<dyn Store>,
    pub(super) telemetry: Telemetry,
}

impl TracedStore {
    /// The span of one store call, when made while serving a traced request.
    fn span(&self, op: &'static str) -> Option<Context> {
        let parent = Context::current();
        if !parent.has_active_span() {
            return None;
        }
        let mut attributes = vec![KeyValue::new("db.operation.name", op)];
        if let Some(system) = self.telemetry.inner.store_system {
            attributes.push(KeyValue::new("db.system.name", system));
        }
        Some(
            self.telemetry
                .child(&parent, format!("store {op}"), SpanKind::Client, attributes),
        )
    }
}

/// Ends a store call's span with how it went.
fn finish<T>(span: Option<Context>, result: &idem_core::Result<T>) {
    let Some(cx) = span else { return };
    let span = cx.span();
    if let Err(e) = result {
        // The label, not the message: a driver's message may name the server's URL.
        span.set_attribute(KeyValue::new("error.type", e.label()));
        span.set_status(Status::error(e.label()));
    }
    span.end();
}

#[async_trait]
impl Store for TracedStore {
    async fn reserve(&self, request: &ReserveRequest) -> idem_core::Result<Reservation> {
        let span = self.span("reserve");
        let reserved = self.inner.reserve(request).await;
        if let (Some(cx), Ok(reservation)) = (&span, &reserved) {
            let answer = match reservation {
                Reservation::Acquired(_) => "acquired",
                Reservation::Replay(_) => "replay",
                Reservation::InProgress { .. } => "in_progress",
                Reservation::Mismatch => "mismatch",
                Reservation::Gone { .. } => "gone",
            };
            cx.span()
                .set_attribute(KeyValue::new("idem.reservation", answer));
        }
        if span.is_some() {
            // On the server span, the request's: whose key, which attempt, and which
            // execution a replay stands for.
            Context::map_current(|cx| {
                let server = cx.span();
                server.set_attribute(KeyValue::new(
                    "idem.tenant",
                    request.scope.tenant().as_str().to_owned(),
                ));
                match &reserved {
                    Ok(Reservation::Acquired(lease)) => {
                        server
                            .set_attribute(KeyValue::new("idem.attempt", i64::from(lease.attempt)));
                    }
                    Ok(Reservation::Replay(stored)) => {
                        if let Some(original) = stored.trace_parent().and_then(parse_traceparent) {
                            server.add_link(
                                original,
                                vec![KeyValue::new("idem.link", "original_execution")],
                            );
                        }
                    }
                    _ => {}
                }
            });
        }
        finish(span, &reserved);
        reserved
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> idem_core::Result<()> {
        let span = self.span("complete");
        // The execution's server span, for a replay to link to; only a sampled one,
        // since an unsampled span is never exported.
        let traceparent = Context::map_current(|cx| {
            let sc = cx.span().span_context().clone();
            (sc.is_valid() && sc.is_sampled()).then(|| format_traceparent(&sc))
        });
        let completed = match traceparent {
            Some(tp) => {
                let stored = response.clone().with_trace_parent(&tp);
                self.inner.complete(lease, &stored).await
            }
            None => self.inner.complete(lease, response).await,
        };
        finish(span, &completed);
        completed
    }

    async fn renew(&self, lease: &Lease, lease_for: Duration) -> idem_core::Result<()> {
        let span = self.span("renew");
        let renewed = self.inner.renew(lease, lease_for).await;
        finish(span, &renewed);
        renewed
    }

    async fn release(&self, lease: &Lease) -> idem_core::Result<()> {
        let span = self.span("release");
        let released = self.inner.release(lease).await;
        finish(span, &released);
        released
    }

    async fn mark_ambiguous(
        &self,
        lease: &Lease,
        reason: idem_core::Ambiguity,
    ) -> idem_core::Result<()> {
        let span = self.span("mark_ambiguous");
        let marked = self.inner.mark_ambiguous(lease, reason).await;
        finish(span, &marked);
        marked
    }

    async fn get(&self, scope: &Scope) -> idem_core::Result<Option<Record>> {
        self.inner.get(scope).await
    }

    async fn remove(&self, scope: &Scope) -> idem_core::Result<bool> {
        self.inner.remove(scope).await
    }

    async fn list(&self, query: &idem_core::ListQuery) -> idem_core::Result<idem_core::ListPage> {
        self.inner.list(query).await
    }

    async fn take_rate_token(
        &self,
        bucket: &str,
        rate: &idem_core::KeyRate,
    ) -> idem_core::Result<Option<bool>> {
        self.inner.take_rate_token(bucket, rate).await
    }

    async fn purge_expired(&self, limit: usize) -> idem_core::Result<usize> {
        self.inner.purge_expired(limit).await
    }

    async fn ping(&self) -> idem_core::Result<()> {
        self.inner.ping().await
    }

    async fn init_secret(&self, name: &str, candidate: &[u8]) -> idem_core::Result<Vec<u8>> {
        self.inner.init_secret(name, candidate).await
    }

    async fn close(&self) {
        self.inner.close().await
    }

    fn metrics(&self) -> Vec<StoreMetric> {
        self.inner.metrics()
    }

    fn expires_natively(&self) -> bool {
        self.inner.expires_natively()
    }

    fn watch(&self, scope: &Scope) -> idem_core::Watch {
        self.inner.watch(scope)
    }
}

/// The `db.system.name` (OpenTelemetry's name for the database) of the store a URL
/// names, by the kind its store crate gives it; none for the memory store.
pub(super) fn store_system(store_url: &str) -> Option<&'static str> {
    match crate::store::kind(store_url)? {
        "postgres" => Some("postgresql"),
        "memory" => None,
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Notes which hooks it heard.
    #[derive(Default)]
    struct Heard(Mutex<Vec<&'static str>>);

    impl Heard {
        fn note(&self, hook: &'static str) {
            self.0.lock().unwrap().push(hook);
        }
    }

    impl Observer for Heard {
        fn outcome(&self, _: Outcome) {
            self.note("outcome");
        }
        fn store_call(&self, _: &'static str, _: Duration, _: bool) {
            self.note("store_call");
        }
        fn store_error(&self, _: &'static str, _: &StoreError) {
            self.note("store_error");
        }
        fn write_deferred(&self, _: &'static str) {
            self.note("write_deferred");
        }
        fn deferred_write_ended(&self, _: &'static str, _: bool) {
            self.note("deferred_write_ended");
        }
        fn upstream_failed(&self, _: idem_tower::UpstreamFailure) {
            self.note("upstream_failed");
        }
        fn ambiguous_outcome(&self, _: idem_core::Ambiguity, _: &str) {
            self.note("ambiguous_outcome");
        }
        fn tenant_keyed(&self, _: &idem_core::Tenant) {
            self.note("tenant_keyed");
        }
        fn tenant_limited(&self, _: &idem_core::Tenant, _: &'static str) {
            self.note("tenant_limited");
        }
        fn wait_started(&self) {
            self.note("wait_started");
        }
        fn wait_ended(&self, _: &'static str) {
            self.note("wait_ended");
        }
    }

    /// With traces on, the metrics still hear every hook: the waiting gauge too.
    #[test]
    fn every_hook_reaches_the_metrics_observer() {
        let heard = Arc::new(Heard::default());
        let traced = SpanObserver {
            inner: heard.clone(),
        };
        traced.outcome(Outcome::Executed);
        traced.store_call("reserve", Duration::ZERO, true);
        traced.store_error("reserve", &StoreError::Full);
        traced.write_deferred("complete");
        traced.deferred_write_ended("complete", true);
        traced.upstream_failed(idem_tower::UpstreamFailure::Timeout);
        traced.ambiguous_outcome(idem_core::Ambiguity::Takeover, "digest");
        traced.tenant_keyed(&idem_core::Tenant::anonymous());
        traced.tenant_limited(&idem_core::Tenant::anonymous(), "key_rate");
        traced.wait_started();
        traced.wait_ended("replay");
        assert_eq!(
            *heard.0.lock().unwrap(),
            [
                "outcome",
                "store_call",
                "store_error",
                "write_deferred",
                "deferred_write_ended",
                "upstream_failed",
                "ambiguous_outcome",
                "tenant_keyed",
                "tenant_limited",
                "wait_started",
                "wait_ended"
            ]
        );
    }
}
