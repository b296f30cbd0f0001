//! What sealing costs per recorded answer (SPEC S17): one seal on `complete`, one open
//! per replay, for answers of 1 KiB, 16 KiB and 256 KiB, and a sealed MemoryStore round
//! (reserve, complete, replay) next to a plain one.
//!
//! `cargo bench -p idem-core --bench seal`

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idem_core::seal::SealBinding;
use idem_core::testing::scope_of;
use idem_core::{
    FencingToken, Fingerprint, FingerprintOptions, MemoryStore, RecordKeys, Reservation,
    ReserveRequest, Sealed, Store, StoredResponse, Tenant,
};

/// A tenant as long as the HMAC the layer writes, so the sealed scope is its real size.
const TENANT: &str = "hmac-sha256:0123456789abcdef";

fn answer(size: usize) -> StoredResponse {
    StoredResponse::new(201, Bytes::from(vec![b'x'; size]))
        .with_header("content-type", "application/json")
        .with_header("location", "/v1/charges/ch_1")
}

async fn round<S: Store>(store: &S, n: u64, response: &StoredResponse) {
    let fp = Fingerprint::compute(
        "POST",
        "/v1/charges",
        None,
        b"{}",
        &FingerprintOptions::default(),
    );
    let request = ReserveRequest::new(
        scope_of(Tenant::new(TENANT), "/v1/charges", &format!("k{n}")),
        fp,
    );
    let Reservation::Acquired(lease) = store.reserve(&request).await.unwrap() else {
        panic!("acquire")
    };
    store.complete(&lease, response).await.unwrap();
    let Reservation::Replay(r) = store.reserve(&request).await.unwrap() else {
        panic!("replay")
    };
    black_box(r);
}

fn bench(c: &mut Criterion) {
    let keys = RecordKeys::new([("k1", [7u8; 32])]).unwrap();
    let mut g = c.benchmark_group("seal");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let fp = Fingerprint::compute(
        "POST",
        "/v1/charges",
        None,
        b"{}",
        &FingerprintOptions::default(),
    );
    let lease = ReserveRequest::new(scope_of(Tenant::new(TENANT), "/v1/charges", "k"), fp)
        .lease_for(FencingToken::generate(), 1);
    let binding = SealBinding::of_lease(&lease);
    for size in [1024usize, 16 * 1024, 256 * 1024] {
        let plain = answer(size);
        let sealed = keys.seal(binding, &plain);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(format!("seal_{}KiB", size / 1024), |b| {
            b.iter(|| keys.seal(black_box(binding), black_box(&plain)))
        });
        g.bench_function(format!("open_{}KiB", size / 1024), |b| {
            b.iter(|| {
                keys.open(black_box(binding), black_box(sealed.clone()))
                    .unwrap()
            })
        });
    }
    g.throughput(Throughput::Elements(1));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let response = answer(1024);
    let memory = MemoryStore::new().max_entries(10_000_000);
    let mut n = 0u64;
    g.bench_function("memory_round_plain_1KiB", |b| {
        b.iter(|| {
            n += 1;
            rt.block_on(round(&memory, n, &response))
        })
    });
    let sealed = Sealed::new(MemoryStore::new().max_entries(10_000_000), keys.clone());
    g.bench_function("memory_round_sealed_1KiB", |b| {
        b.iter(|| {
            n += 1;
            rt.block_on(round(&sealed, n, &response))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
