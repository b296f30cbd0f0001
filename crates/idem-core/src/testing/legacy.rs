//! Records as builds before typed record metadata wrote them, for each store's test of
//! its upgrade: the reference, trace context, trailers, ambiguity reason and sealing
//! key id among the headers, under names starting with a colon.

use bytes::Bytes;

use crate::seal::SealBinding;
use crate::{
    Ambiguity, Endpoint, FencingToken, Key, RecordKeys, Scope, ScopeMode, StoredResponse, Tenant,
};

/// The scope of the legacy record `key`.
pub fn legacy_scope(key: &str) -> Scope {
    Scope::new(
        ScopeMode::Public,
        Tenant::new("t-upgrade"),
        Endpoint::new("POST", "/v1/exports"),
        Key::new(key).unwrap(),
    )
}

fn h(name: &str, value: &'static [u8]) -> (String, Bytes) {
    (name.to_owned(), Bytes::from_static(value))
}

/// The trace context the legacy records carry.
const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// The fencing token of every legacy record.
pub const LEGACY_TOKEN: u64 = 7;

/// One completed record as builds before [`ResponseMeta`](crate::ResponseMeta) wrote
/// it, and the answer this build must replay for it.
pub struct LegacyRecord {
    /// Its key ([`legacy_scope`]).
    pub key: &'static str,
    /// Its status.
    pub status: u16,
    /// Its header list, metadata among the headers under names starting with a colon,
    /// as a store's header block held it ([`encode_headers`](crate::codec::encode_headers)).
    pub headers: Vec<(String, Bytes)>,
    /// Its body (ciphertext, for the sealed one).
    pub body: Bytes,
    /// The answer this build replays for it (through [`Sealed`](crate::Sealed) with the
    /// ring given to [`legacy_records`], for the sealed one, key `sealed`).
    pub replays: StoredResponse,
}

/// Completed records of every shape the builds before typed metadata wrote, each for
/// the fingerprint of `{}` under token [`LEGACY_TOKEN`]: one with a reference and a
/// trace context, one ambiguous, one with trailers and ambiguous, and one sealed with
/// `keys` (key id `k1`) and ambiguous. A store's upgrade test writes them with the
/// schema of that time, migrates, and checks they replay and list.
pub fn legacy_records(keys: &RecordKeys) -> Vec<LegacyRecord> {
    let grpc_body = Bytes::from_static(b"\x00\x00\x00\x00\x02\x08\x01");
    let mut records = vec![
        LegacyRecord {
            key: "plain",
            status: 201,
            headers: vec![
                h("content-type", b"text/csv"),
                h(":reference", b"/v1/reports/7?format=csv"),
                (
                    ":traceparent".to_owned(),
                    Bytes::from_static(TRACE.as_bytes()),
                ),
            ],
            body: Bytes::new(),
            replays: StoredResponse::new(201, Bytes::new())
                .with_header("content-type", "text/csv")
                .with_reference("/v1/reports/7?format=csv")
                .with_trace_parent(TRACE),
        },
        LegacyRecord {
            key: "too-large",
            status: 502,
            headers: vec![
                h("content-type", b"application/problem+json"),
                h(":ambiguous", b"answer_too_large"),
            ],
            body: Bytes::from_static(b"{\"type\":\"too-large\"}"),
            replays: StoredResponse::new(502, "{\"type\":\"too-large\"}")
                .with_header("content-type", "application/problem+json")
                .with_ambiguity(Ambiguity::AnswerTooLarge),
        },
        LegacyRecord {
            key: "grpc",
            status: 200,
            headers: vec![
                h("content-type", b"application/grpc"),
                h(":trailer:grpc-status", b"13"),
                h(":trailer:grpc-message", b"as%20told"),
                h(":ambiguous", b"handler_failed"),
            ],
            body: grpc_body.clone(),
            replays: StoredResponse::new(200, grpc_body)
                .with_header("content-type", "application/grpc")
                .with_trailer("grpc-status", "13")
                .with_trailer("grpc-message", "as%20told")
                .with_ambiguity(Ambiguity::HandlerFailed),
        },
    ];
    // A sealed answer as the sealing wrapper wrote it: the key id first, the ambiguity
    // reason in plain text beside it, everything else in the ciphertext.
    let answer = StoredResponse::new(504, "lost")
        .with_header("content-type", "text/plain")
        .with_reference("/v1/secret/9")
        .with_ambiguity(Ambiguity::UpstreamConnectionLost);
    let s = legacy_scope("sealed");
    let fingerprint = super::test_fingerprint("{}");
    let binding = SealBinding {
        scope: &s,
        fingerprint: &fingerprint,
        token: FencingToken::from_u64(LEGACY_TOKEN),
    };
    let sealed = keys.seal(binding, &answer);
    records.push(LegacyRecord {
        key: "sealed",
        status: 504,
        headers: vec![
            h(":sealed", b"k1"),
            h(":ambiguous", b"upstream_connection_lost"),
        ],
        body: sealed.body,
        replays: answer,
    });
    records
}
