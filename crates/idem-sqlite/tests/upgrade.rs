//! A file of schema version 2, holding records as builds before typed record metadata
//! wrote them (the reference, trace context, trailers, ambiguity reason and sealing key
//! id among the headers, under names starting with a colon), is migrated to version 3:
//! it keeps every record, replays each byte for byte, and lists the ambiguous ones from
//! the new `ambiguity` column.

use idem_core::codec::encode_headers;
use idem_core::testing::legacy::{LEGACY_TOKEN as TOKEN, legacy_records, legacy_scope as scope};
use idem_core::testing::test_fingerprint;
use idem_core::{
    Ambiguity, Clock, ListQuery, RecordKeys, Reservation, ReserveRequest, Sealed, Store,
    SystemClock,
};
use idem_sqlite::SqliteStore;

/// Version 2's table, as that build made it.
const V2: [&str; 4] = [
    "DROP TABLE idem_records",
    "CREATE TABLE idem_records (
        tenant TEXT NOT NULL, endpoint TEXT NOT NULL, idem_key TEXT NOT NULL,
        fingerprint BLOB NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
        attempt INTEGER NOT NULL, token INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed', 'tombstone')),
        lease_until INTEGER, status INTEGER, headers BLOB, body BLOB, completed_at INTEGER,
        tombstone_until INTEGER, PRIMARY KEY (tenant, endpoint, idem_key))",
    "CREATE INDEX idem_records_expires_at ON idem_records (expires_at)",
    "UPDATE idem_schema_versions SET version = 2",
];

#[tokio::test]
async fn a_version_2_file_keeps_replays_and_lists_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("v2.db").display());
    let keys = RecordKeys::new([("k1", [9; 32])]).unwrap();
    let old = legacy_records(&keys);
    let now = SystemClock.now().as_millis();
    let fingerprint = test_fingerprint("{}");
    {
        let store = SqliteStore::connect(&url).await.unwrap();
        let pool = store.pool();
        for sql in V2 {
            sqlx::query(sql).execute(pool).await.unwrap();
        }
        let insert = "INSERT INTO idem_records VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?8, ?9,
             ?10, ?11, ?12, ?13, NULL)";
        for record in &old {
            let s = scope(record.key);
            sqlx::query(insert)
                .bind(s.tenant().as_str())
                .bind(s.endpoint_str())
                .bind(s.key().as_str())
                .bind(&fingerprint.as_bytes()[..])
                .bind(now - 1000)
                .bind(now + 3_600_000)
                .bind(TOKEN as i64)
                .bind("completed")
                .bind(None::<i64>)
                .bind(i64::from(record.status))
                .bind(encode_headers(&record.headers))
                .bind(&record.body[..])
                .bind(now - 500)
                .execute(pool)
                .await
                .unwrap();
        }
        // Two attempts in progress: one whose lease lapsed, one alive.
        for (key, lease_until) in [("orphan", now - 1), ("live", now + 60_000)] {
            let s = scope(key);
            sqlx::query(insert)
                .bind(s.tenant().as_str())
                .bind(s.endpoint_str())
                .bind(s.key().as_str())
                .bind(&fingerprint.as_bytes()[..])
                .bind(now - 1000)
                .bind(now + 3_600_000)
                .bind(TOKEN as i64)
                .bind("in_progress")
                .bind(lease_until)
                .bind(None::<i64>)
                .bind(None::<Vec<u8>>)
                .bind(None::<Vec<u8>>)
                .bind(None::<i64>)
                .execute(pool)
                .await
                .unwrap();
        }
        store.close().await;
    }

    let store = std::sync::Arc::new(SqliteStore::connect(&url).await.unwrap());
    let version: i64 = sqlx::query_scalar("SELECT version FROM idem_schema_versions")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(version, 3);
    let column: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT idem_key, ambiguity FROM idem_records ORDER BY idem_key")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let reason = |key: &str| {
        column
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, a)| a.clone())
    };
    assert_eq!(column.len(), 6, "every record kept");
    assert_eq!(reason("too-large").as_deref(), Some("answer_too_large"));
    assert_eq!(reason("grpc").as_deref(), Some("handler_failed"));
    assert_eq!(
        reason("sealed").as_deref(),
        Some("upstream_connection_lost")
    );
    assert_eq!(reason("plain"), None);
    assert_eq!(reason("orphan"), None);

    let sealed = Sealed::new(store.clone(), keys);
    for record in &old {
        let request = ReserveRequest::new(scope(record.key), fingerprint);
        let replay = if record.key == "sealed" {
            sealed.reserve(&request).await.unwrap()
        } else {
            store.reserve(&request).await.unwrap()
        };
        assert_eq!(
            replay,
            Reservation::Replay(record.replays.clone()),
            "{}",
            record.key
        );
    }

    let page = store.list(&ListQuery::new().ambiguous()).await.unwrap();
    let mut listed: Vec<(String, Option<Ambiguity>)> = page
        .records
        .iter()
        .map(|r| {
            let reason = r.ambiguity(SystemClock.now());
            (r.scope.key().as_str().to_owned(), reason)
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("grpc".to_owned(), Some(Ambiguity::HandlerFailed)),
            ("orphan".to_owned(), Some(Ambiguity::Orphaned)),
            ("sealed".to_owned(), Some(Ambiguity::UpstreamConnectionLost)),
            ("too-large".to_owned(), Some(Ambiguity::AnswerTooLarge)),
        ]
    );
}
