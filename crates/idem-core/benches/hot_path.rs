//! The protocol's hot path: key parse, fingerprint, decide, and a MemoryStore round.
//!
//! `cargo bench -p idem-core --bench hot_path`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use idem_core::{
    Endpoint, FencingToken, Fingerprint, FingerprintOptions, Key, MemoryStore, Record, RecordState,
    Reservation, ReserveRequest, Scope, ScopeMode, Store, StoredResponse, Tenant, Timestamp,
    decide,
};

/// A JSON order body of about `size` bytes, with nested objects and arrays.
fn json_body(size: usize) -> Vec<u8> {
    let mut items = Vec::new();
    let mut i = 0;
    loop {
        items.push(serde_json::json!({
            "sku": format!("SKU-{i:06}"),
            "quantity": i % 7 + 1,
            "unit_amount": 1999 + i,
            "metadata": {"gift": i % 2 == 0, "note": "leave at the door"}
        }));
        let body = serde_json::to_vec(&serde_json::json!({
            "customer": "cus_8e03978e40d5",
            "currency": "eur",
            "items": items,
        }))
        .expect("serialises");
        if body.len() >= size {
            return body;
        }
        i += 1;
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("core");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    g.bench_function("key_parse_sf_string", |b| {
        b.iter(|| Key::parse(black_box(br#""8e03978e-40d5-43e8-bc93-6894a57f9324""#)))
    });
    g.bench_function("key_parse_bare", |b| {
        b.iter(|| Key::parse(black_box(b"8e03978e-40d5-43e8-bc93-6894a57f9324")))
    });

    let opts = FingerprintOptions::default();
    let json = "application/json";
    // A 1 MiB upload, and a body built to make a naive boundary search quadratic: a
    // long run of the boundary's own first bytes.
    let boundary = format!("{}x", "-".repeat(69));
    let multipart = format!("multipart/form-data; boundary={boundary}");
    let upload = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n{}\r\n--{boundary}--\r\n",
        "a".repeat(1024 * 1024)
    );
    let adversarial = format!("--{boundary}\r\n\r\n{}", "-".repeat(1024 * 1024));
    let cases: [(&str, &str, Vec<u8>); 5] = [
        (
            "fingerprint_json_charge",
            json,
            br#"{"amount":100,"currency":"eur","customer":"cus_123"}"#.to_vec(),
        ),
        ("fingerprint_json_1KiB", json, json_body(1024)),
        ("fingerprint_json_64KiB", json, json_body(64 * 1024)),
        (
            "fingerprint_multipart_1MiB",
            &multipart,
            upload.into_bytes(),
        ),
        (
            "fingerprint_multipart_adversarial_1MiB",
            &multipart,
            adversarial.into_bytes(),
        ),
    ];
    for (name, content_type, body) in cases {
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                Fingerprint::compute(
                    "POST",
                    "POST /v1/orders",
                    Some(content_type),
                    black_box(&body),
                    &opts,
                )
            })
        });
    }
    g.throughput(Throughput::Elements(1));

    let scope = Scope::new(
        ScopeMode::Public,
        Tenant::new("hmac-sha256:0000000000000000000000000000000000000000000000000000000000000000"),
        Endpoint::new("POST", "/v1/orders"),
        Key::new("8e03978e-40d5-43e8-bc93-6894a57f9324").expect("key"),
    );
    let fp = Fingerprint::compute("POST", "POST /v1/orders", None, b"{}", &opts);
    let completed = Record {
        scope: scope.clone(),
        fingerprint: fp,
        created_at: Timestamp::from_millis(0),
        expires_at: Timestamp::from_millis(i64::MAX),
        attempt: 1,
        token: FencingToken::from_u64(1),
        state: RecordState::Completed {
            response: StoredResponse::new(201, vec![b'x'; 256])
                .with_header("content-type", "application/json"),
            completed_at: Timestamp::from_millis(1),
        },
        tombstone_until: None,
        in_progress_ambiguity: None,
    };
    let now = Timestamp::from_millis(1_000);
    g.bench_function("decide_replay", |b| {
        b.iter(|| decide(Some(black_box(completed.clone())), black_box(&fp), now))
    });
    g.bench_function("decide_absent", |b| {
        b.iter(|| decide(None, black_box(&fp), now))
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let store = MemoryStore::new().max_entries(10_000_000);
    let mut n = 0u64;
    g.bench_function("memory_reserve_complete", |b| {
        b.iter(|| {
            n += 1;
            let scope = Scope::new(
                ScopeMode::Public,
                Tenant::anonymous(),
                Endpoint::new("POST", "/v1/orders"),
                Key::new(format!("k{n}")).expect("key"),
            );
            rt.block_on(async {
                let Reservation::Acquired(lease) = store
                    .reserve(&ReserveRequest::new(scope, fp))
                    .await
                    .expect("reserve")
                else {
                    unreachable!("fresh keys always acquire")
                };
                store
                    .complete(&lease, &StoredResponse::new(201, "ok"))
                    .await
                    .expect("complete");
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
