//! What an operation costs on top of a plain reqwest POST, against an axum server on
//! 127.0.0.1: the key and retry machinery, the idempotency layer's record and replay
//! on the server, and the journal's durable write (SQLite file, synchronous = FULL,
//! so one fsync per persist and one per result) before and after the send.
//!
//! Run: `cargo bench -p idem-client --bench send`

use std::time::Duration;

use axum::routing::post;
use criterion::{Criterion, criterion_group, criterion_main};
use idem_client::{Client, Journal};
use idem_core::MemoryStore;
use idem_tower::IdempotencyLayer;
use tokio::net::TcpListener;

const BODY: &str = r#"{"amount":1000,"currency":"eur"}"#;

async fn serve(app: axum::Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    format!("http://{addr}/v1/charges")
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let handler = post(|| async { (axum::http::StatusCode::CREATED, "{\"id\":\"ch_1\"}") });
    let plain_url = rt.block_on(serve(
        axum::Router::new().route("/v1/charges", handler.clone()),
    ));
    let keyed_url = rt.block_on(serve(
        axum::Router::new()
            .route("/v1/charges", handler)
            .layer(IdempotencyLayer::new(MemoryStore::new())),
    ));
    let client = Client::new();
    let dir = tempfile::tempdir().expect("temporary directory");
    let journal = rt
        .block_on(Journal::open(dir.path().join("bench.db")))
        .expect("journal");

    let mut g = c.benchmark_group("send");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);

    let http = client.http().clone();
    g.bench_function("plain_reqwest_post", |b| {
        b.iter(|| {
            rt.block_on(async {
                let r = http
                    .post(&plain_url)
                    .header("content-type", "application/json")
                    .body(BODY)
                    .send()
                    .await
                    .expect("send");
                r.bytes().await.expect("body")
            })
        })
    });
    g.bench_function("operation_plain_server", |b| {
        b.iter(|| {
            rt.block_on(async {
                let op = client
                    .post(&plain_url)
                    .header("content-type", "application/json")
                    .body(BODY);
                op.send().await.expect("send")
            })
        })
    });
    g.bench_function("operation_idempotency_layer_execute", |b| {
        b.iter(|| {
            rt.block_on(async {
                let op = client
                    .post(&keyed_url)
                    .header("content-type", "application/json")
                    .body(BODY);
                op.send().await.expect("send")
            })
        })
    });
    let same = client
        .post(&keyed_url)
        .header("content-type", "application/json")
        .body(BODY);
    rt.block_on(same.send()).expect("first send");
    g.bench_function("operation_idempotency_layer_replay", |b| {
        b.iter(|| {
            rt.block_on(async {
                let o = same.send().await.expect("send");
                assert!(o.replayed());
                o
            })
        })
    });
    g.bench_function("journaled_operation_file_fsync", |b| {
        b.iter(|| {
            rt.block_on(async {
                let op = client
                    .post(&keyed_url)
                    .header("content-type", "application/json")
                    .body(BODY);
                let op = journal.persist(op).await.expect("persist");
                op.send().await.expect("send")
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
