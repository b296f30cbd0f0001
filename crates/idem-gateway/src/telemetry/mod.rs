//! OpenTelemetry traces, exported over OTLP/HTTP (protobuf) when `--otlp-endpoint` (or
//! the standard `OTEL_EXPORTER_OTLP_ENDPOINT`) names a collector; off otherwise.
//!
//! Each request the proxy listener serves is one server span, named after its method
//! and, where a `[[route]]` rule matches, the rule's template (`POST /v1/orders/{id}`).
//! Its attributes:
//!
//! - `http.request.method`, `http.route` (the template, when a rule matches),
//!   `http.response.status_code`;
//! - `idem.outcome`: what the idempotency layer did (`executed`, `replayed`,
//!   `conflict`, `mismatch`, `released`, `rejected`, `passed_through`, …), as the
//!   layer reports it to its [`Observer`], the same report the metrics count;
//! - `idem.tenant`: the tenant's HMAC digest (`hmac-sha256:…` or `anonymous`), and for
//!   an execution `idem.attempt` (1, or n+1 after a takeover).
//!
//! Its children: one span per store call the layer makes (`store reserve`, `store
//! renew`, `store complete`, `store release`) and one for the upstream call (`upstream
//! POST`, from sending the request until its answer is read, or its head when it
//! streams). Nothing of a request's key, credentials, query or body is recorded.
//!
//! A client's W3C `traceparent` (and `tracestate`) continues its trace: the server span
//! is its child, and the upstream receives a `traceparent` naming the upstream span as
//! its parent (the client's is replaced; with tracing off it passes through untouched).
//!
//! A recorded answer keeps the trace context of the server span that produced it (among
//! the stored headers, so every store keeps it as it is:
//! [`StoredResponse::with_trace_parent`](idem_core::StoredResponse::with_trace_parent));
//! a replay's server span links to it. Records written without it (before tracing was
//! on) replay without a link.
//!
//! Spans are batched and sent by the SDK's own thread (`OTEL_BSP_SCHEDULE_DELAY` and
//! the other `OTEL_BSP_*` variables tune it; 5 s by default) through the gateway's
//! hyper client on its runtime, and flushed when the gateway stops (for at most 5 s).
//! The collector is reached over plain HTTP (a local agent or sidecar);
//! `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_TIMEOUT` are honoured, and
//! `OTEL_SERVICE_NAME` names the service (`idem` by default).
//!
//! With no endpoint nothing here runs: no span is made, no context is attached, and
//! the layer keeps its store and observer as they are.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::Either;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::Store;
use idem_tower::{Observer, Outcome};
use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracer, SdkTracerProvider};

use crate::route::{self, Route};

mod store;

use self::store::{SpanObserver, TracedStore, store_system};

/// The standard variable naming the collector's base URL, honoured when the gateway's
/// own `otlp_endpoint` setting is not given.
pub(crate) const OTEL_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Where, under the collector's base URL, traces are posted (the OTLP/HTTP default).
pub(crate) const TRACES_PATH: &str = "/v1/traces";

/// The largest answer read from the collector (it answers with a small status body).
const COLLECTOR_ANSWER_LIMIT: usize = 64 * 1024;

/// How long one export may take when `OTEL_EXPORTER_OTLP_TIMEOUT` does not say.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest the gateway's stop waits for the last spans to be sent: a collector
/// that is down must not hold up a shutdown that has already waited for requests.
const FLUSH_AT_SHUTDOWN: Duration = Duration::from_secs(5);

/// The URL traces are posted to, from the gateway's `otlp_endpoint` setting (`setting`)
/// or else the standard [`OTEL_ENDPOINT_ENV`] (`standard`): either is the collector's
/// base URL, `http://host:4318`, under whose path `/v1/traces` is appended, as the
/// OpenTelemetry specification has it for that variable. Empty values count as unset;
/// `None` means tracing is off. Only `http://` is spoken: a setting that is not such a
/// URL is an error, while a standard variable that is not (an `https://` one that a
/// platform sets for every process, say) is logged and leaves tracing off, so that it
/// cannot stop a gateway from starting.
pub(crate) fn traces_url(
    setting: Option<&str>,
    standard: Option<&str>,
) -> Result<Option<String>, String> {
    if let Some(base) = setting.filter(|s| !s.is_empty()) {
        return base_to_traces_url(base).map(Some);
    }
    let Some(base) = standard.filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    match base_to_traces_url(base) {
        Ok(url) => Ok(Some(url)),
        Err(e) => {
            tracing::warn!(
                variable = OTEL_ENDPOINT_ENV,
                error = %e,
                "traces are off: the variable names no endpoint the gateway can send to; \
                 give --otlp-endpoint to send them"
            );
            Ok(None)
        }
    }
}

/// `base/v1/traces`, for an `http://` base URL without a query.
fn base_to_traces_url(base: &str) -> Result<String, String> {
    let uri: Uri = base
        .parse()
        .map_err(|e| format!("{base:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{base:?}: the exporter speaks plain HTTP; send traces to a collector \
                 on the same host or network (http://host:4318) and let it forward them"
            ));
        }
        _ => return Err(format!("{base:?} is not an http:// URL")),
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("{base:?} names no host"));
    };
    if uri.query().is_some() {
        return Err(format!("{base:?}: the collector's base URL takes no query"));
    }
    let path = uri.path().trim_end_matches('/');
    Ok(format!("http://{authority}{path}{TRACES_PATH}"))
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {url}: {source}")]
pub struct TelemetryError {
    url: String,
    #[source]
    source: opentelemetry_otlp::ExporterBuildError,
}

/// The gateway's tracer: cheap to clone. See the [module docs](self).
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    routes: Arc<[Route]>,
    /// The store's `db.system.name` (`sqlite`, `postgresql`, `redis`); `None` for the
    /// memory store, which has none.
    store_system: Option<&'static str>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Starts exporting to `url`, the full OTLP/HTTP traces URL (`…/v1/traces`, as
    /// `--otlp-endpoint` resolves to). `routes` name the server spans;
    /// `store_url` says which store the store spans are calls to. Call from inside the
    /// tokio runtime that is to send the exports.
    pub fn start(
        url: &str,
        routes: &[Route],
        store_url: &str,
    ) -> Result<Telemetry, TelemetryError> {
        let timeout = std::env::var("OTEL_EXPORTER_OTLP_TIMEOUT")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map_or(EXPORT_TIMEOUT, Duration::from_millis);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(ExportClient::new(timeout))
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(timeout)
            .build()
            .map_err(|source| TelemetryError {
                url: url.to_owned(),
                source,
            })?;
        let mut resource = Resource::builder()
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("idem");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("idem-gateway");
        Ok(Telemetry {
            inner: Arc::new(Inner {
                provider,
                tracer,
                propagator: TraceContextPropagator::new(),
                routes: routes.into(),
                store_system: store_system(store_url),
            }),
        })
    }

    /// The context a request is served in: its server span, the child of the client's
    /// `traceparent` if it sent one. `rejected`: the gateway answered it before the
    /// layer saw it (a bad `Host`, a path that cannot be normalised). The span carries
    /// the request's id as `idem.request_id`.
    pub fn server_context<B>(
        &self,
        req: &Request<B>,
        rejected: bool,
        request_id: &http::HeaderValue,
    ) -> Context {
        let this = &*self.inner;
        let parent = this.propagator.extract(&HeaderExtractor(req.headers()));
        let method = req.method().as_str();
        let route =
            route::find(&this.routes, req.method(), req.uri().path()).map(|r| r.template.as_str());
        let name = match route {
            Some(template) => format!("{method} {template}"),
            None => method.to_owned(),
        };
        let mut attributes = Vec::with_capacity(4);
        attributes.push(KeyValue::new("http.request.method", method.to_owned()));
        if let Some(template) = route {
            attributes.push(KeyValue::new("http.route", template.to_owned()));
        }
        if rejected {
            attributes.push(KeyValue::new("idem.outcome", Outcome::Rejected.as_str()));
        }
        if let Ok(id) = request_id.to_str() {
            attributes.push(KeyValue::new("idem.request_id", id.to_owned()));
        }
        let span = this
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&this.tracer, &parent);
        parent.with_span(span).with_value(self.clone())
    }

    /// `observer` (the metrics), also noting each outcome on the current server span.
    pub fn observer(&self, observer: Arc<dyn Observer>) -> Arc<dyn Observer> {
        Arc::new(SpanObserver { inner: observer })
    }

    /// `store`, with a child span for each call made while serving a request, and the
    /// trace context recorded with each answer it completes.
    pub fn store(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(TracedStore {
            inner: store,
            telemetry: self.clone(),
        })
    }

    /// Sends what is still batched and stops the exporter, within 5 s.
    pub async fn shutdown(self) {
        let provider = self.inner.provider.clone();
        let stopped =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_AT_SHUTDOWN))
                .await;
        if let Ok(Err(e)) = stopped {
            tracing::warn!(error = %e, "the trace exporter did not stop cleanly");
        }
    }

    /// A child span of `parent` (the request's context).
    fn child(
        &self,
        parent: &Context,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Context {
        let tracer = &self.inner.tracer;
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(tracer, parent);
        parent.with_span(span)
    }
}

/// Serves `future` in `cx`, the context [`Telemetry::server_context`] made for its
/// request, and ends its server span with the answer's status; without one, `future`
/// as it is.
pub fn instrument<F, B, E>(
    cx: Option<Context>,
    future: F,
) -> Either<F, impl Future<Output = Result<Response<B>, E>>>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    let Some(cx) = cx else {
        return Either::Left(future);
    };
    Either::Right(async move {
        let result = future.with_context(cx.clone()).await;
        let span = cx.span();
        match &result {
            Ok(res) => {
                let status = res.status();
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status.as_u16()),
                ));
                if status.is_server_error() {
                    span.set_status(Status::error(""));
                }
            }
            Err(_) => span.set_status(Status::error("no answer")),
        }
        span.end();
        result
    })
}

/// The span of one upstream call, made by the proxy (see [`UpstreamCall::start`]);
/// ends when dropped.
#[must_use = "the span ends when this is dropped"]
pub struct UpstreamCall(Option<Context>);

impl UpstreamCall {
    /// Starts the upstream call's span, when the request is traced, and puts its
    /// `traceparent` (and the client's `tracestate`) on `up`, the request about to be
    /// sent. Untraced requests go as they are, whatever trace headers they carry.
    pub fn start<B>(up: &mut Request<B>) -> UpstreamCall {
        let traced = Context::map_current(|cx| {
            cx.get::<Telemetry>()
                .map(|telemetry| (telemetry.clone(), cx.clone()))
        });
        let Some((telemetry, parent)) = traced else {
            return UpstreamCall(None);
        };
        let method = up.method().as_str().to_owned();
        let mut attributes = vec![KeyValue::new("http.request.method", method.clone())];
        if let Some(host) = up.uri().host() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = up.uri().port_u16() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        let cx = telemetry.child(
            &parent,
            format!("upstream {method}"),
            SpanKind::Client,
            attributes,
        );
        telemetry
            .inner
            .propagator
            .inject_context(&cx, &mut HeaderInjector(up.headers_mut()));
        UpstreamCall(Some(cx))
    }

    /// The upstream answered with `status`.
    pub fn answered(&self, status: http::StatusCode) {
        if let Some(cx) = &self.0 {
            let span = cx.span();
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status.as_u16()),
            ));
            span.set_status(if status.is_server_error() {
                Status::error("")
            } else {
                Status::Ok
            });
        }
    }
}

impl Drop for UpstreamCall {
    fn drop(&mut self) {
        if let Some(cx) = self.0.take() {
            let span = cx.span();
            // Not answered: it failed (unreachable, timed out, broken) or was dropped.
            span.set_status(Status::error("no answer from the upstream"));
            span.end();
        }
    }
}

/// Sets `attributes` on the current server span, if the caller runs in one.
fn annotate_current(attributes: impl FnOnce() -> Vec<KeyValue>) {
    Context::map_current(|cx| {
        if cx.has_active_span() {
            cx.span().set_attributes(attributes());
        }
    });
}

/// `sc` as a W3C `traceparent` value.
pub(super) fn format_traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// A `traceparent` value (version 00) as the remote span context it names.
pub(super) fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.split('-');
    let (Some("00"), Some(trace), Some(span), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let sc = SpanContext::new(
        trace,
        span,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    sc.is_valid().then_some(sc)
}

/// The exporter's HTTP client: the gateway's hyper client (HTTP/1.1, plain), run on the
/// gateway's runtime. The SDK exports from a thread of its own, outside any runtime.
#[derive(Debug, Clone)]
struct ExportClient {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl ExportClient {
    /// Panics outside a tokio runtime.
    fn new(timeout: Duration) -> ExportClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        ExportClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
            runtime: tokio::runtime::Handle::current(),
            timeout,
        }
    }
}

#[async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let timeout = self.timeout;
        let exchange = async move {
            let res = client.request(request.map(Full::new)).await?;
            let (parts, body) = res.into_parts();
            let body = Limited::new(body, COLLECTOR_ANSWER_LIMIT)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let sent = self
            .runtime
            .spawn(async move { tokio::time::timeout(timeout, exchange).await });
        match sent.await? {
            Ok(answer) => answer,
            Err(_) => Err(format!("the collector did not answer within {timeout:?}").into()),
        }
    }
}

#[cfg(test)]
mod tests;
