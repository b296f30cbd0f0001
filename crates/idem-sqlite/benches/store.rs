//! SqliteStore throughput: one reserve + complete per operation, on a file-backed
//! database (WAL, synchronous = NORMAL) in a temporary directory, with 1 task and with
//! 64 concurrent tasks. Criterion prints the throughput as elements (operations) per
//! second; the end line shows how the writer batched them.
//!
//! Run: `cargo bench -p idem-sqlite --bench store`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idem_core::{
    Endpoint, Fingerprint, FingerprintOptions, Key, Reservation, ReserveRequest, Scope, ScopeMode,
    Store, StoredResponse, Tenant,
};
use idem_sqlite::SqliteStore;

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// One request's worth of store work: reserve a fresh key, complete it.
async fn reserve_and_complete(store: &SqliteStore, response: &StoredResponse) {
    let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    let endpoint = Endpoint::new("POST", "/v1/charges");
    let body = format!(r#"{{"amount":{n}}}"#);
    let fp = Fingerprint::compute(
        "POST",
        endpoint.as_str(),
        Some("application/json"),
        body.as_bytes(),
        &FingerprintOptions::default(),
    );
    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::new("bench"),
        endpoint,
        Key::new(format!("bench-{n:016x}")).expect("key"),
    );
    let Reservation::Acquired(lease) = store
        .reserve(&ReserveRequest::new(scope, fp))
        .await
        .expect("reserve")
    else {
        panic!("a fresh key is acquired")
    };
    store.complete(&lease, response).await.expect("complete");
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = rt
        .block_on(SqliteStore::connect(&url))
        .expect("open the store");
    let response = Arc::new(
        StoredResponse::new(201, r#"{"id":"ch_1","object":"charge","amount":100}"#)
            .with_header("content-type", "application/json")
            .with_header("location", "/v1/charges/ch_1"),
    );

    let mut group = c.benchmark_group("sqlite_reserve_complete");
    group.throughput(Throughput::Elements(1));
    for tasks in [1u64, 64] {
        group.bench_function(format!("{tasks}_tasks"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    let workers: Vec<_> = (0..tasks)
                        .map(|t| {
                            let (store, response) = (store.clone(), response.clone());
                            let share = iters / tasks + u64::from(t < iters % tasks);
                            tokio::spawn(async move {
                                for _ in 0..share {
                                    reserve_and_complete(&store, &response).await;
                                }
                            })
                        })
                        .collect();
                    for w in workers {
                        w.await.expect("worker");
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
    let rows: i64 = rt
        .block_on(sqlx::query_scalar("SELECT count(*) FROM idem_records").fetch_one(store.pool()))
        .expect("count");
    println!("{rows} records written; writer: {:?}", store.writer_stats());
    rt.block_on(store.pool().close());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
