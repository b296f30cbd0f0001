//! What tracing costs a keyed request through the layer (memory store, a trivial inner
//! service standing for the proxy), each request under a fresh key:
//!
//! - `no-hooks`: the layer and the inner service alone, as the gateway is without
//!   the telemetry module;
//! - `off`: the same with the telemetry hooks in place and no endpoint, as `idem serve`
//!   runs by default (the request not instrumented, the inner service starting its
//!   [`UpstreamCall`] as the proxy does);
//! - `on`: an exporter to an OTLP receiver on 127.0.0.1 that accepts everything: the
//!   server span, the store spans, the upstream span and the batch queue.
//!
//! ```text
//! cargo bench -p idem-gateway --bench telemetry
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use idem_core::{MemoryStore, Store, TenantKey};
use idem_gateway::config::{GatewayConfig, ServeArgs};
use idem_gateway::metrics::Metrics;
use idem_gateway::serve::idempotency_layer;
use idem_gateway::telemetry::{self, Telemetry, UpstreamCall};
use idem_tower::IdempotencyBody;
use tower::{Layer, ServiceExt};

type Body = IdempotencyBody<Full<Bytes>>;

fn config() -> GatewayConfig {
    let args = ServeArgs {
        upstream: Some("http://127.0.0.1:9".to_owned()),
        store: Some("memory://".to_owned()),
        ..ServeArgs::default()
    };
    GatewayConfig::from_args(args).expect("config")
}

fn request(n: u64) -> Request<Full<Bytes>> {
    Request::post("/v1/payments")
        .header("idempotency-key", format!("bench-{n}"))
        .header("authorization", "Bearer bench")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"amount":100}"#)))
        .unwrap()
}

async fn answer(hooked: bool) -> Result<Response<Full<Bytes>>, Infallible> {
    if hooked {
        let mut up = Request::post("http://127.0.0.1:9/v1/payments")
            .body(())
            .unwrap();
        let call = UpstreamCall::start(&mut up);
        call.answered(http::StatusCode::CREATED);
    }
    Ok(Response::builder()
        .status(201)
        .body(Full::new(Bytes::from_static(b"{\"id\":1}")))
        .unwrap())
}

/// An OTLP receiver that accepts every export.
async fn sink() -> String {
    let app = axum::Router::new().route("/v1/traces", axum::routing::post(|_: Bytes| async { "" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1/traces")
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = config();
    let key = TenantKey::new(&[7; 32]).unwrap();
    let next = Arc::new(AtomicU64::new(0));
    let telemetry = rt.block_on(async {
        let url = sink().await;
        Telemetry::start(&url, &config.routes, &config.store).expect("exporter")
    });

    let mut group = c.benchmark_group("keyed_request");
    for name in ["no-hooks", "off", "on"] {
        let metrics = Arc::new(Metrics::new());
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let traced = (name == "on").then(|| telemetry.clone());
        let hooked = name != "no-hooks";
        let layer_store = match &traced {
            Some(t) => t.store(store.clone()),
            None => store.clone(),
        };
        let mut layer = idempotency_layer(layer_store, &config, Some(key.clone()), metrics.clone());
        if let Some(t) = &traced {
            layer = layer.observer(t.observer(metrics.clone()));
        }
        let inner = tower::service_fn(move |_: Request<Body>| answer(hooked));
        let svc = layer.layer(inner);
        let next = next.clone();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let req = request(next.fetch_add(1, Ordering::Relaxed));
                        let res = if hooked {
                            let cx = traced.as_ref().map(|t| {
                                t.server_context(
                                    &req,
                                    false,
                                    &http::HeaderValue::from_static("bench-request"),
                                )
                            });
                            telemetry::instrument(cx, svc.clone().oneshot(req)).await
                        } else {
                            svc.clone().oneshot(req).await
                        };
                        assert_eq!(res.unwrap().status(), 201);
                    }
                    started.elapsed()
                })
            })
        });
    }
    group.finish();
    rt.block_on(telemetry.shutdown());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = bench
}
criterion_main!(benches);
