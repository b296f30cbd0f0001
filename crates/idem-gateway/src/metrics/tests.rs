//! Tests of the exposition: values, order, and the inventory in `metrics.txt`.

use std::collections::BTreeMap;

use super::*;

#[test]
fn renders_outcomes_histogram_and_gauge() {
    let m = Arc::new(Metrics::new());
    m.outcome(Outcome::Replayed);
    m.outcome(Outcome::Replayed);
    m.store_call("reserve", Duration::from_micros(300), true);
    m.store_call("reserve", Duration::from_millis(30), true);
    for _ in 0..2 {
        m.store_error("complete", &idem_core::StoreError::Fenced);
    }
    m.store_error("reserve", &idem_core::StoreError::unavailable("refused"));
    let g = m.in_flight_guard();
    let t = m.tunnel_guard();
    let text = m.render();
    assert!(text.contains(
        "# TYPE idem_store_errors_total counter\n\
         idem_store_errors_total{op=\"complete\",kind=\"fenced\"} 2\n\
         idem_store_errors_total{op=\"reserve\",kind=\"unavailable\"} 1\n"
    ));
    assert!(text.contains("idem_requests_total{outcome=\"replayed\"} 2\n"));
    assert!(text.contains("idem_requests_total{outcome=\"mismatch\"} 0\n"));
    assert!(text.contains("idem_in_flight_requests 1\n"));
    assert!(text.contains("# TYPE idem_upgraded_connections gauge\nidem_upgraded_connections 1\n"));
    assert!(text.contains(
        "idem_store_call_duration_seconds_bucket{op=\"reserve\",ok=\"true\",le=\"0.0005\"} 1\n"
    ));
    assert!(text.contains(
        "idem_store_call_duration_seconds_bucket{op=\"reserve\",ok=\"true\",le=\"0.05\"} 2\n"
    ));
    assert!(
        text.contains("idem_store_call_duration_seconds_count{op=\"reserve\",ok=\"true\"} 2\n")
    );
    drop((g, t));
    let text = m.render();
    assert!(text.contains("idem_in_flight_requests 0\n"), "{text}");
    assert!(text.contains("idem_upgraded_connections 0\n"), "{text}");
}

#[test]
fn renders_connections_by_listener() {
    let m = Arc::new(Metrics::new());
    let text = m.render();
    assert!(text.contains(
        "# TYPE idem_connections_open gauge\n\
         idem_connections_open{listener=\"proxy\"} 0\n\
         idem_connections_open{listener=\"admin\"} 0\n"
    ));
    m.set_max_connections(ListenerKind::Proxy, 452);
    m.set_max_connections(ListenerKind::Admin, 32);
    let open = [
        m.connection_guard(ListenerKind::Proxy),
        m.connection_guard(ListenerKind::Proxy),
        m.connection_guard(ListenerKind::Admin),
    ];
    m.count_connection_wait(ListenerKind::Proxy);
    m.count_accept_error(ListenerKind::Admin);
    let text = m.render();
    for line in [
        "idem_connections_open{listener=\"proxy\"} 2",
        "idem_connections_open{listener=\"admin\"} 1",
        "idem_connections_max{listener=\"proxy\"} 452",
        "idem_connections_max{listener=\"admin\"} 32",
        "idem_connection_waits_total{listener=\"proxy\"} 1",
        "idem_connection_waits_total{listener=\"admin\"} 0",
        "idem_accept_errors_total{listener=\"proxy\"} 0",
        "idem_accept_errors_total{listener=\"admin\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(text.contains("# TYPE idem_connection_waits_total counter\n"));
    drop(open);
    let text = m.render();
    for line in [
        "idem_connections_open{listener=\"proxy\"} 0",
        "idem_connections_open{listener=\"admin\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

#[test]
fn counts_deferred_key_writes_and_those_given_up() {
    let m = Metrics::new();
    let text = m.render();
    assert!(text.contains("idem_deferred_key_writes{op=\"complete\"} 0\n"));
    assert!(text.contains("idem_abandoned_key_writes_total{op=\"release\"} 0\n"));
    for _ in 0..3 {
        m.write_deferred("complete");
    }
    m.write_deferred("release");
    m.deferred_write_ended("complete", true);
    m.deferred_write_ended("complete", false);
    let text = m.render();
    assert!(text.contains(
        "# TYPE idem_deferred_key_writes gauge\n\
         idem_deferred_key_writes{op=\"complete\"} 1\n\
         idem_deferred_key_writes{op=\"release\"} 1\n"
    ));
    assert!(text.contains(
        "# TYPE idem_abandoned_key_writes_total counter\n\
         idem_abandoned_key_writes_total{op=\"complete\"} 1\n\
         idem_abandoned_key_writes_total{op=\"release\"} 0\n"
    ));
}

#[test]
fn upstream_failures_keep_their_metric_labels() {
    let labels = [
        UpstreamFailure::Unreachable,
        UpstreamFailure::Tls,
        UpstreamFailure::Timeout,
        UpstreamFailure::ConnectionLost,
        UpstreamFailure::AnswerTooLarge,
    ]
    .map(upstream_error_label);
    assert_eq!(
        labels,
        ["unreachable", "tls", "timeout", "broken", "too_large"]
    );
}

/// Every metric the exposition carries: `name type label,label` per line, sorted,
/// with a histogram's `le` left out. A dashboard or alert is written against these,
/// so a change to one shows up here as a diff of `metrics.txt`.
fn inventory(text: &str) -> String {
    let mut kinds = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            kinds.insert(
                name.to_owned(),
                (kind.to_owned(), std::collections::BTreeSet::new()),
            );
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let series = line.split(' ').next().unwrap_or_default();
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|f| kinds.get(*f).is_some_and(|(k, _)| k == "histogram"))
            .unwrap_or(name);
        let (_, keys) = kinds
            .get_mut(family)
            .unwrap_or_else(|| panic!("{name} has no TYPE line"));
        for pair in labels
            .trim_end_matches('}')
            .split(',')
            .filter(|p| !p.is_empty())
        {
            let key = pair.split_once('=').expect("label=value").0;
            if key != "le" {
                keys.insert(key.to_owned());
            }
        }
    }
    kinds
        .into_iter()
        .map(|(name, (kind, keys))| {
            let keys: Vec<_> = keys.into_iter().collect();
            format!("{name} {kind} {}\n", keys.join(",")).replace(" \n", "\n")
        })
        .collect()
}

#[test]
fn exposes_the_metrics_in_metrics_txt() {
    let m = Arc::new(Metrics::new());
    m.outcome(Outcome::Executed);
    m.store_call("reserve", Duration::from_millis(1), true);
    m.store_error("reserve", &idem_core::StoreError::Fenced);
    m.upstream_failed(UpstreamFailure::Timeout);
    m.write_deferred("complete");
    m.tenant_keyed(&idem_core::Tenant::anonymous());
    m.tenant_limited(&idem_core::Tenant::anonymous(), "key_rate");
    let text = m.render();
    assert_eq!(inventory(&text), include_str!("metrics.txt"), "{text}");
}

#[tokio::test]
async fn renders_the_stores_own_figures() {
    use idem_core::testing::{test_fingerprint, test_scope};
    use idem_core::{ReserveRequest, StoredResponse};

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store: Arc<dyn Store> = Arc::new(idem_sqlite::SqliteStore::connect(&url).await.unwrap());
    let m = Metrics::new().with_store(store.clone());
    let request = ReserveRequest::new(test_scope("/v1/charges", "k1"), test_fingerprint("{}"));
    let lease = store
        .reserve(&request)
        .await
        .unwrap()
        .lease()
        .cloned()
        .unwrap();
    store
        .complete(&lease, &StoredResponse::new(201, "{}"))
        .await
        .unwrap();

    let text = m.render();
    assert!(
        text.contains(
            "# HELP idem_sqlite_writes_total Writes committed by the SQLite writer.\n\
             # TYPE idem_sqlite_writes_total counter\n\
             idem_sqlite_writes_total 2\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("# TYPE idem_sqlite_pending_writes gauge\nidem_sqlite_pending_writes 0\n")
    );
    assert!(text.contains("\nidem_sqlite_failed_write_transactions_total 0\n"));

    // The memory store adds its own figures after the gateway's, and nothing else.
    let with_memory = Metrics::new()
        .with_store(Arc::new(idem_core::MemoryStore::new().max_entries(500)))
        .render();
    let bare = Metrics::new().render();
    assert_eq!(
        with_memory.strip_prefix(&bare),
        Some(
            "# HELP idem_memory_records Records the in-memory store holds, expired ones not \
             yet purged included.\n\
             # TYPE idem_memory_records gauge\n\
             idem_memory_records 0\n\
             # HELP idem_memory_max_records The most records the in-memory store holds.\n\
             # TYPE idem_memory_max_records gauge\n\
             idem_memory_max_records 500\n\
             # HELP idem_memory_evictions_total Completed records the in-memory store \
             dropped before they expired, to make room; a retry of one executes again.\n\
             # TYPE idem_memory_evictions_total counter\n\
             idem_memory_evictions_total 0\n"
        ),
        "{with_memory}"
    );
    store.close().await;
}
