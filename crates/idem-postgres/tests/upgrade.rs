//! A table of schema version 5, holding records as builds before typed record metadata
//! wrote them (the reference, trace context, trailers, ambiguity reason and sealing key
//! id among the headers), is migrated to version 6: it keeps every record, replays each
//! byte for byte, and lists the ambiguous ones from the new `ambiguity` column.

mod common;

use std::sync::Arc;

use idem_core::codec::encode_headers;
use idem_core::testing::legacy::{LEGACY_TOKEN, legacy_records, legacy_scope};
use idem_core::testing::{test_fingerprint, unique_namespace};
use idem_core::{
    Ambiguity, Clock, ListQuery, ManualClock, RecordKeys, Reservation, ReserveRequest, Sealed,
    Store,
};
use sqlx::AssertSqlSafe;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_5_table_keeps_replays_and_lists_its_records() {
    let clock = ManualClock::starting_now();
    let Some(store) = common::store_with_clock(&clock, &unique_namespace("upgrade_v5")).await
    else {
        return;
    };
    let t = store.table().to_owned();
    let pool = store.pool().clone();
    // Back to version 5, as the build before typed metadata left the table.
    for sql in [
        format!("ALTER TABLE {t} DROP COLUMN ambiguity"),
        format!("DELETE FROM idem_schema_migrations WHERE table_name = '{t}' AND version >= 6"),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .expect("undo migration 6");
    }
    let keys = RecordKeys::new([("k1", [9; 32])]).unwrap();
    let old = legacy_records(&keys);
    let now = clock.now().as_millis();
    let fingerprint = test_fingerprint("{}");
    let insert = format!(
        "INSERT INTO {t} (tenant, endpoint, idem_key, fingerprint, created_at, expires_at,
             attempt, token, state, lease_until, status, headers, body, completed_at)
         VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8, $9, $10, $11, $12, $13)"
    );
    for record in &old {
        let s = legacy_scope(record.key);
        sqlx::query(AssertSqlSafe(insert.clone()))
            .bind(s.tenant().as_str())
            .bind(s.endpoint_str())
            .bind(s.key().as_str())
            .bind(&fingerprint.as_bytes()[..])
            .bind(now - 1000)
            .bind(now + 3_600_000)
            .bind(LEGACY_TOKEN as i64)
            .bind("completed")
            .bind(None::<i64>)
            .bind(i32::from(record.status))
            .bind(encode_headers(&record.headers))
            .bind(&record.body[..])
            .bind(now - 500)
            .execute(&pool)
            .await
            .expect("an old completed row");
    }
    for (key, lease_until) in [("orphan", now - 1), ("live", now + 60_000)] {
        let s = legacy_scope(key);
        sqlx::query(AssertSqlSafe(insert.clone()))
            .bind(s.tenant().as_str())
            .bind(s.endpoint_str())
            .bind(s.key().as_str())
            .bind(&fingerprint.as_bytes()[..])
            .bind(now - 1000)
            .bind(now + 3_600_000)
            .bind(LEGACY_TOKEN as i64)
            .bind("in_progress")
            .bind(Some(lease_until))
            .bind(None::<i32>)
            .bind(None::<Vec<u8>>)
            .bind(None::<Vec<u8>>)
            .bind(None::<i64>)
            .execute(&pool)
            .await
            .expect("an old in-progress row");
    }

    store
        .migrate()
        .await
        .expect("migration 6 on a table with rows");
    let version: i32 =
        sqlx::query_scalar("SELECT max(version) FROM idem_schema_migrations WHERE table_name = $1")
            .bind(&t)
            .fetch_one(&pool)
            .await
            .expect("version");
    assert_eq!(version, 6);
    let column: Vec<(String, Option<String>)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT idem_key, ambiguity FROM {t} ORDER BY idem_key"
    )))
    .fetch_all(&pool)
    .await
    .expect("the column");
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

    let inner = Arc::new(store);
    let sealed = Sealed::new(inner.clone(), keys);
    for record in &old {
        let request = ReserveRequest::new(legacy_scope(record.key), fingerprint);
        let replay = if record.key == "sealed" {
            sealed.reserve(&request).await.expect("reserve")
        } else {
            inner.reserve(&request).await.expect("reserve")
        };
        assert_eq!(
            replay,
            Reservation::Replay(record.replays.clone()),
            "{}",
            record.key
        );
    }

    let page = inner
        .list(&ListQuery::new().ambiguous())
        .await
        .expect("list");
    let mut listed: Vec<(String, Option<Ambiguity>)> = page
        .records
        .iter()
        .map(|r| (r.scope.key().as_str().to_owned(), r.ambiguity(clock.now())))
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
