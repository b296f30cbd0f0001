//! OpenTelemetry: the real binary exports its traces to an OTLP/HTTP receiver in this
//! process, which decodes the protobuf requests (the encoding the gateway sends: the
//! exporter's protobuf needs prost alone, where JSON needs serde on top of it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

use crate::common::{Gateway, Http, Upstream, new_key};
use crate::shared::{on_shared, postgres, redis};

/// What the receiver got: every request body as sent, and the spans decoded from them.
#[derive(Default)]
struct Received {
    bodies: Vec<Bytes>,
    content_types: Vec<String>,
    spans: Vec<Span>,
    services: Vec<String>,
}

/// An OTLP/HTTP trace receiver on 127.0.0.1, stopped on drop.
struct Receiver {
    addr: std::net::SocketAddr,
    got: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

async fn receive(
    State(got): State<Arc<Mutex<Received>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1], Vec<u8>) {
    let request = ExportTraceServiceRequest::decode(body.clone()).expect("an OTLP request");
    let mut got = got.lock().unwrap();
    got.bodies.push(body);
    got.content_types.push(
        headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
    );
    for resource_spans in request.resource_spans {
        if let Some(resource) = &resource_spans.resource {
            for kv in &resource.attributes {
                if kv.key == "service.name" {
                    got.services
                        .push(string(kv.value.as_ref().and_then(|v| v.value.as_ref())));
                }
            }
        }
        for scope_spans in resource_spans.scope_spans {
            got.spans.extend(scope_spans.spans);
        }
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    (
        StatusCode::OK,
        [("content-type", "application/x-protobuf")],
        Vec::new(),
    )
}

fn string(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

impl Receiver {
    async fn start() -> Receiver {
        let got = Arc::new(Mutex::new(Received::default()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(got.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver { addr, got, task }
    }

    /// The collector's base URL, as `--otlp-endpoint` takes it.
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.got.lock().unwrap().spans.clone()
    }

    /// Waits (bounded: 15 s) until the spans received satisfy `done`, and returns them.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the receiver never got {what}; it got: {}",
                render(&spans)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| string(kv.value.as_ref().and_then(|v| v.value.as_ref())))
}

fn is_server(span: &Span) -> bool {
    span.kind == SpanKind::Server as i32
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id)
        .collect()
}

/// Spans as the receiver saw them, one a line: name, kind, ids, parent, attributes,
/// links.
fn render(spans: &[Span]) -> String {
    let mut out = String::new();
    for s in spans {
        let kind = SpanKind::try_from(s.kind).map_or("?", |k| k.as_str_name());
        let attributes: Vec<String> = s
            .attributes
            .iter()
            .map(|kv| {
                format!(
                    "{}={}",
                    kv.key,
                    string(kv.value.as_ref().and_then(|v| v.value.as_ref()))
                )
            })
            .collect();
        let links: Vec<String> = s
            .links
            .iter()
            .map(|l| format!("{}/{}", hex(&l.trace_id), hex(&l.span_id)))
            .collect();
        out.push_str(&format!(
            "\n  {:<24} {:<17} trace={} span={} parent={} tracestate={:?} [{}] links=[{}]",
            s.name,
            kind,
            hex(&s.trace_id),
            hex(&s.span_id),
            hex(&s.parent_span_id),
            s.trace_state,
            attributes.join(", "),
            links.join(", ")
        ));
    }
    out
}

const ROUTE: &str = r#"
    [[route]]
    method = "POST"
    path = "/v1/orders/{id}"
"#;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// One keyed request's trace continues the client's: its server span is the child of
/// the client's `traceparent`, with the outcome, attempt, route and tenant digest, and
/// has the store calls and the upstream call as children; the upstream gets the
/// upstream span as its parent. The replay's own trace links to that execution. No
/// key, credential or body reaches the collector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_requests_trace_continues_the_clients_and_reaches_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("idem.toml"), ROUTE).unwrap();
    let up = Upstream::start().await;
    let receiver = Receiver::start().await;
    let gw = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &["--config", "idem.toml", "--otlp-endpoint", &receiver.url()],
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
    )
    .await;
    let http = Http::new();
    let url = gw.url("/v1/orders/42");
    let key = new_key();
    let secret = "Bearer tok-SECRET-5b1f";
    let body = r#"{"card":"4242-BODY-MARKER","amount":100}"#;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let first = http
        .post(
            &url,
            &key,
            body,
            &[
                ("authorization", secret),
                ("traceparent", &traceparent),
                ("tracestate", "vendor=opaque"),
            ],
        )
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    let replay = http
        .post(&url, &key, body, &[("authorization", secret)])
        .await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(
        up.finished(&key),
        1,
        "the replay did not run the upstream again"
    );
    let unkeyed = http.send("GET", &url, &[], "").await;
    assert_eq!(unkeyed.status, 201);

    let spans = receiver
        .wait_for("three requests' spans", |spans| {
            let named = |n: &str| spans.iter().filter(|s| s.name == n).count();
            spans.iter().filter(|s| is_server(s)).count() >= 3
                && named("store reserve") >= 2
                && named("store complete") >= 1
                && named("upstream POST") >= 1
                && named("upstream GET") >= 1
        })
        .await;

    // The execution: the client's trace, the client's span as parent.
    let executed: Vec<&Span> = spans
        .iter()
        .filter(|s| is_server(s) && hex(&s.trace_id) == CLIENT_TRACE)
        .collect();
    assert_eq!(executed.len(), 1, "{}", render(&spans));
    let server = executed[0];
    let trace: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id == server.trace_id)
        .cloned()
        .collect();
    eprintln!(
        "one keyed request's trace, as the receiver got it:{}",
        render(&trace)
    );
    assert_eq!(hex(&server.parent_span_id), CLIENT_SPAN);
    assert_eq!(server.trace_state, "vendor=opaque");
    assert_eq!(server.name, "POST /v1/orders/{id}");
    assert_eq!(attr(server, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(
        attr(server, "http.route").as_deref(),
        Some("/v1/orders/{id}")
    );
    assert_eq!(attr(server, "idem.outcome").as_deref(), Some("executed"));
    assert_eq!(attr(server, "idem.attempt").as_deref(), Some("1"));
    assert_eq!(
        attr(server, "http.response.status_code").as_deref(),
        Some("201")
    );
    let tenant = attr(server, "idem.tenant").expect("a tenant digest");
    assert!(tenant.starts_with("hmac-sha256:"), "{tenant}");

    // Its children: reserve, the upstream call, complete.
    let kids = children(&spans, server);
    let mut names: Vec<&str> = kids.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["store complete", "store reserve", "upstream POST"],
        "{}",
        render(&trace)
    );
    for kid in &kids {
        assert_eq!(kid.kind, SpanKind::Client as i32, "{}", kid.name);
        if kid.name.starts_with("store ") {
            assert_eq!(
                attr(kid, "db.system.name").as_deref(),
                Some(crate::common::test_store_system()),
                "the system of the store the gateway runs on"
            );
        }
    }
    let reserve = kids.iter().find(|s| s.name == "store reserve").unwrap();
    assert_eq!(
        attr(reserve, "idem.reservation").as_deref(),
        Some("acquired")
    );
    let upstream_span = kids.iter().find(|s| s.name == "upstream POST").unwrap();
    assert_eq!(
        attr(upstream_span, "http.response.status_code").as_deref(),
        Some("201")
    );

    // The upstream's parent is the upstream span, in the client's trace.
    let seen = up.seen();
    let keyed = seen
        .iter()
        .find(|s| s.method == "POST")
        .expect("the upstream saw the POST");
    assert_eq!(
        keyed.headers["traceparent"],
        format!("00-{CLIENT_TRACE}-{}-01", hex(&upstream_span.span_id)).as_str()
    );
    assert_eq!(keyed.headers["tracestate"], "vendor=opaque");

    // The replay: a trace of its own (the client sent none), linked to the execution,
    // with one store call and no upstream call.
    let replayed: Vec<&Span> = spans
        .iter()
        .filter(|s| is_server(s) && attr(s, "idem.outcome").as_deref() == Some("replayed"))
        .collect();
    assert_eq!(replayed.len(), 1, "{}", render(&spans));
    let replayed = replayed[0];
    let replay_trace: Vec<Span> = spans
        .iter()
        .filter(|s| s.trace_id == replayed.trace_id)
        .cloned()
        .collect();
    eprintln!("and its replay's:{}", render(&replay_trace));
    assert_ne!(replayed.trace_id, server.trace_id);
    assert!(replayed.parent_span_id.is_empty());
    assert_eq!(replayed.links.len(), 1, "{}", render(&spans));
    assert_eq!(replayed.links[0].trace_id, server.trace_id);
    assert_eq!(replayed.links[0].span_id, server.span_id);
    assert_eq!(attr(replayed, "idem.tenant"), Some(tenant));
    let replay_kids = children(&spans, replayed);
    assert_eq!(replay_kids.len(), 1, "{}", render(&spans));
    assert_eq!(replay_kids[0].name, "store reserve");
    assert_eq!(
        attr(replay_kids[0], "idem.reservation").as_deref(),
        Some("replay")
    );

    // The unkeyed GET passed through, its upstream call traced too.
    let get = spans
        .iter()
        .find(|s| is_server(s) && attr(s, "http.request.method").as_deref() == Some("GET"))
        .expect("the GET's server span");
    assert_eq!(attr(get, "idem.outcome").as_deref(), Some("passed_through"));
    assert_eq!(
        children(&spans, get)
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["upstream GET"]
    );

    // Nothing the collector got holds the key, the credential or the body.
    let got = receiver.got.lock().unwrap();
    assert!(
        got.content_types
            .iter()
            .all(|t| t == "application/x-protobuf")
    );
    assert_eq!(got.services.first().map(String::as_str), Some("idem"));
    for sent in &got.bodies {
        for secret in [
            key.as_str(),
            "tok-SECRET-5b1f",
            "4242-BODY-MARKER",
            "amount",
        ] {
            assert!(
                !sent.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "the collector got {secret:?}"
            );
        }
    }
}

/// The execution's trace context is kept with its record in every store, so a replay
/// links to it wherever the record lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_links_its_original_execution_on_every_store() {
    let mut stores = vec![
        // The memory store itself, on every run (no db.system.name there).
        ("memory", crate::common::MEMORY_KEPT.to_owned(), false),
        ("sqlite", "sqlite://idem.db".to_owned(), false),
    ];
    if let Some(url) = postgres().await {
        stores.push(("postgresql", url, true));
    }
    if let Some(url) = redis().await {
        stores.push(("redis", url, true));
    }
    let names: Vec<&str> = stores.iter().map(|(name, ..)| *name).collect();
    eprintln!("replay links checked on: {names:?}");
    let up = Upstream::start().await;
    for (name, store, shared) in &stores {
        let dir = tempfile::tempdir().unwrap();
        let receiver = Receiver::start().await;
        let endpoint = receiver.url();
        let traced = ["--otlp-endpoint", endpoint.as_str()];
        let args = match shared {
            true => on_shared(store, &traced),
            false => [["--store", store.as_str()].as_slice(), &traced].concat(),
        };
        let gw = Gateway::start_with_env(
            &up.url(),
            dir.path(),
            &args,
            &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
        )
        .await;
        let http = Http::new();
        let key = new_key();
        let url = gw.url("/v1/payments");
        assert_eq!(http.post(&url, &key, "{}", &[]).await.status, 201);
        let replay = http.post(&url, &key, "{}", &[]).await;
        assert!(replay.replayed(), "{name}: {replay:?}");
        let spans = receiver
            .wait_for("two server spans", |spans| {
                spans.iter().filter(|s| is_server(s)).count() >= 2
            })
            .await;
        let outcome = |o: &str| {
            spans
                .iter()
                .find(|s| is_server(s) && attr(s, "idem.outcome").as_deref() == Some(o))
                .unwrap_or_else(|| panic!("{name}: no {o} span in {}", render(&spans)))
        };
        let (executed, replayed) = (outcome("executed"), outcome("replayed"));
        assert_eq!(replayed.links.len(), 1, "{name}: {}", render(&spans));
        assert_eq!(replayed.links[0].trace_id, executed.trace_id, "{name}");
        assert_eq!(replayed.links[0].span_id, executed.span_id, "{name}");
        let expected_system = (*name != "memory").then_some(*name);
        for store_span in spans.iter().filter(|s| s.name.starts_with("store ")) {
            assert_eq!(
                attr(store_span, "db.system.name").as_deref(),
                expected_system,
                "{name}"
            );
        }
        // What the upstream answered is replayed as it was: the trace context is no
        // header of it.
        assert!(!replay.headers.contains_key("traceparent"), "{name}");
        assert!(!replay.headers.contains_key(":traceparent"), "{name}");
        gw.terminate().await;
    }
}

/// `OTEL_EXPORTER_OTLP_ENDPOINT` turns tracing on when the gateway's own setting is not
/// given; given, the setting wins. A gateway that stops sends what it still holds,
/// whatever the batch delay (5 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_variable_is_honoured_and_the_gateways_setting_wins() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let (standard, own) = (Receiver::start().await, Receiver::start().await);
    let http = Http::new();
    let standard_env = [("OTEL_EXPORTER_OTLP_ENDPOINT", standard.url())];
    let env: Vec<(&str, &str)> = standard_env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let gw = Gateway::start_with_env(&up.url(), dir.path(), &["--store", "memory://"], &env).await;
    assert_eq!(
        http.post(&gw.url("/a"), &new_key(), "{}", &[]).await.status,
        201
    );
    assert!(gw.terminate().await.success());
    let from_standard = standard
        .wait_for("the span flushed at shutdown", |spans| {
            spans.iter().any(is_server)
        })
        .await
        .len();

    let endpoint = own.url();
    let gw = Gateway::start_with_env(
        &up.url(),
        dir.path(),
        &["--store", "memory://", "--otlp-endpoint", &endpoint],
        &env,
    )
    .await;
    assert_eq!(
        http.post(&gw.url("/b"), &new_key(), "{}", &[]).await.status,
        201
    );
    assert!(gw.terminate().await.success());
    own.wait_for("the span flushed at shutdown", |spans| {
        spans.iter().any(is_server)
    })
    .await;
    // Both gateways have stopped, and stopping flushes: nothing more is on its way.
    assert_eq!(standard.spans().len(), from_standard, "the setting won");
}

/// With tracing off, the upstream gets the client's trace headers as they were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_off_trace_headers_pass_through_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gw = Gateway::start(&up.url(), dir.path(), &["--store", "memory://"]).await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let answer = Http::new()
        .post(
            &gw.url("/v1/payments"),
            &new_key(),
            "{}",
            &[
                ("traceparent", &traceparent),
                ("tracestate", "vendor=opaque"),
            ],
        )
        .await;
    assert_eq!(answer.status, 201);
    let seen = up.seen();
    assert_eq!(seen[0].headers["traceparent"], traceparent.as_str());
    assert_eq!(seen[0].headers["tracestate"], "vendor=opaque");
}
