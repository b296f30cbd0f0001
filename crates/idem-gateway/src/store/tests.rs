use super::*;
use idem_core::testing::{test_fingerprint, test_scope};
use idem_core::{Reservation, ReserveRequest, Scope};
use idem_test_support::figure;

#[tokio::test]
async fn store_urls_select_their_store() {
    let store = open("memory://").await.unwrap();
    assert_eq!(
        figure(&*store, "idem_memory_max_records"),
        idem_core::DEFAULT_MAX_ENTRIES as u64
    );
    let store = open("memory://?max_entries=5000000").await.unwrap();
    assert_eq!(figure(&*store, "idem_memory_max_records"), 5_000_000);
    assert_eq!(kind("memory://"), Some("memory"));
    assert_eq!(kind("MEM://"), Some("memory"));
    assert_eq!(kind("sqlite://idem.db"), Some("sqlite"));
    assert_eq!(kind("sqlite:///var/lib/idem/idem.db"), Some("sqlite"));
    assert_eq!(kind("postgres://u:p@127.0.0.1/test"), Some("postgres"));
    assert_eq!(kind("postgresql://127.0.0.1/test"), Some("postgres"));
    assert_eq!(kind("redis://127.0.0.1:6379"), Some("redis"));
    assert_eq!(kind("mariadb://127.0.0.1/test"), Some("mysql"));
    for url in ["mongodb://x", "idem.db"] {
        let e = open(url).await.err().expect(url);
        assert!(matches!(e, OpenError::Unsupported { .. }), "{url}: {e}");
        assert!(
            e.to_string().contains("use memory://, sqlite://FILE"),
            "{url}: {e}"
        );
        assert_eq!(kind(url), None);
    }
    assert!(open("sqlite://").await.is_err());
}

/// A misspelt scheme gets the one it most likely meant, as flags and TOML keys
/// do, besides the list; one that is near none gets the list alone.
#[tokio::test]
async fn a_misspelt_scheme_gets_the_nearest_one() {
    for (url, near) in [
        ("postgress://u:secret@127.0.0.1/test", Some("postgres")),
        ("Postgress://127.0.0.1/test", Some("postgres")),
        ("sqlite3://idem.db", Some("sqlite")),
        ("redis-cluster://127.0.0.1:7000", Some("redis+cluster")),
        ("reddis://127.0.0.1", Some("redis")),
        ("sqlite:idem.db", Some("sqlite")),
        ("mongodb://x", None),
        ("idem.db", None),
    ] {
        let e = open(url).await.err().expect(url).to_string();
        match near {
            Some(near) => assert!(e.contains(&format!("did you mean {near}://?")), "{e}"),
            None => assert!(!e.contains("did you mean"), "{e}"),
        }
        assert!(e.contains("use memory://, sqlite://FILE"), "{e}");
        assert!(!e.contains("secret"), "{e}");
    }
}

#[tokio::test]
async fn unknown_url_parameters_are_refused() {
    for (url, kind, name) in [
        (
            "postgres://u@127.0.0.1/test?ssl_mode=require",
            "postgres",
            "ssl_mode",
        ),
        (
            "postgres://127.0.0.1/test?sslmode=require&prefix=x",
            "postgres",
            "prefix",
        ),
        (
            "redis://127.0.0.1:6379/?prefix=idem_prof",
            "redis",
            "prefix",
        ),
        ("redis://127.0.0.1:6379/?timeout=5", "redis", "timeout"),
    ] {
        let e = open(url).await.err().expect(url);
        let message = e.to_string();
        assert!(
            matches!(e, OpenError::InvalidUrl { kind: k, .. } if k == kind),
            "{url}: {message}"
        );
        assert!(
            message.contains(&format!("unknown parameter {name:?}")),
            "{message}"
        );
    }
}

#[tokio::test]
async fn passwords_never_reach_logs() {
    assert_eq!(
        redact("postgres://app:s3cret@db:5432/idem?sslmode=disable"),
        "postgres://app:***@db:5432/idem?sslmode=disable"
    );
    assert_eq!(redact("redis://:pw@127.0.0.1"), "redis://:***@127.0.0.1");
    assert_eq!(redact("redis://127.0.0.1"), "redis://127.0.0.1");
    let e = open("postgres://a:b@h/d?prefix=x").await.err().unwrap();
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(":b@"), "{shown}");
}

#[tokio::test]
async fn network_store_urls_that_cannot_work_are_refused_before_connecting() {
    for url in [
        "redis://127.0.0.1:notaport",
        "rediss://127.0.0.1:6379/#insecure",
        "rediss://127.0.0.1:6379/?cacert=/nonexistent/ca.pem",
        "postgres://127.0.0.1/test?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ] {
        let e = open(url).await.err().expect(url);
        assert!(matches!(e, OpenError::InvalidUrl { .. }), "{url}: {e}");
        assert!(e.is_configuration(), "{url}");
    }
}

#[test]
fn descriptors_are_the_store_crates_count() {
    let pool = |n| StoreOptions {
        pool: Some(n),
        ..StoreOptions::default()
    };
    assert_eq!(descriptors("memory://", &pool(4)), 0);
    assert_eq!(descriptors("sqlite://idem.db", &pool(4)), 12);
    assert_eq!(
        descriptors("sqlite://idem.db", &StoreOptions::default()),
        3 * u64::from(idem_sqlite::DEFAULT_MAX_CONNECTIONS)
    );
    assert_eq!(descriptors("postgres://h/d", &pool(4)), 4);
    assert_eq!(
        descriptors("postgres://h/d", &StoreOptions::default()),
        u64::from(idem_postgres::DEFAULT_MAX_CONNECTIONS)
    );
    assert_eq!(descriptors("redis://h", &pool(4)), 2);
    assert_eq!(descriptors("mongodb://h", &pool(4)), 0);
}

#[tokio::test]
async fn an_unreachable_network_store_is_deferred_and_fails_closed() {
    // Port 1 on loopback: refused at once, no traffic leaves the machine.
    let store = open_or_defer("redis://127.0.0.1:1", StoreOptions::default())
        .await
        .unwrap();
    assert!(matches!(
        store.ping().await,
        Err(StoreError::Unavailable(_))
    ));
    let scope = Scope::new(
        idem_core::ScopeMode::Public,
        idem_core::Tenant::anonymous(),
        idem_core::Endpoint::new("POST", "/v1/charges"),
        idem_core::Key::new("k-1").unwrap(),
    );
    let request = ReserveRequest::new(scope, idem_core::Fingerprint::from_bytes([0; 32]));
    assert!(matches!(
        store.reserve(&request).await,
        Err(StoreError::Unavailable(_))
    ));
    // Known from the start, so that no sweeper is started for it.
    assert!(store.expires_natively());
    store.close().await;
}

#[tokio::test]
async fn a_store_that_cannot_be_opened_for_other_reasons_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/missing/dir/idem.db", dir.path().display());
    assert!(open_or_defer(&url, StoreOptions::default()).await.is_err());
    assert!(
        open_or_defer("mongodb://x", StoreOptions::default())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn namespaces_are_plain_identifiers_that_fit_a_table_name() {
    for ok in [
        "idem",
        "payments_v2",
        "_staging",
        "a",
        "Payments",
        &"n".repeat(55),
    ] {
        let ns = Namespace::new(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        assert_eq!(
            ns.suffixed("_records").unwrap().as_str(),
            format!("{ok}_records")
        );
    }
    for bad in [
        "",
        "9lives",
        "pay-ments",
        "a b",
        "a:b",
        "idem;drop",
        "tablé",
    ] {
        let e = Namespace::new(bad).unwrap_err();
        assert!(e.to_string().contains("is not a namespace"), "{bad:?}: {e}");
    }
    // One byte more and `NAME_records` no longer fits a table name.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/idem.db", dir.path().display());
    let long = StoreOptions {
        namespace: Some(Namespace::new(&"n".repeat(56)).unwrap()),
        ..StoreOptions::default()
    };
    let e = open_with(&url, long).await.err().unwrap();
    assert!(
        matches!(e, OpenError::Namespace { kind: "sqlite", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("at most 63 fit"), "{e}");
    let default = Namespace::default();
    let table = default.suffixed("_records").unwrap();
    assert_eq!(table.as_str(), idem_sqlite::DEFAULT_TABLE);
    assert_eq!(table.as_str(), idem_postgres::DEFAULT_TABLE);
    assert_eq!(format!("{default}:"), idem_redis::DEFAULT_KEY_PREFIX);
}

/// Two namespaces in one SQLite file are two tables: a key recorded in one is
/// free in the other, and the default namespace is the store's default table.
#[tokio::test]
async fn a_namespace_is_a_table_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/idem.db", dir.path().display());
    let with = |name: &str| StoreOptions {
        namespace: Some(Namespace::new(name).unwrap()),
        ..StoreOptions::default()
    };
    let a = open_with(&url, with("payments")).await.unwrap();
    let b = open_with(&url, with("orders")).await.unwrap();
    let default = open_with(&url, StoreOptions::default()).await.unwrap();
    let scope = Scope::from_parts(
        idem_core::Tenant::anonymous(),
        None,
        idem_core::Key::new("k").unwrap(),
    );
    let request =
        || ReserveRequest::new(scope.clone(), idem_core::Fingerprint::from_bytes([7; 32]));
    for store in [&a, &b, &default] {
        let reserved = store.reserve(&request()).await.unwrap();
        assert!(matches!(reserved, Reservation::Acquired(_)), "{reserved:?}");
    }
    assert!(matches!(
        a.reserve(&request()).await.unwrap(),
        Reservation::InProgress { .. }
    ));
    for store in [a, b, default] {
        store.close().await;
    }
    // Each namespace's table, opened by name, holds the record.
    for table in ["payments_records", "orders_records", "idem_records"] {
        let store = idem_sqlite::SqliteStore::builder()
            .table(table)
            .connect(&url)
            .await
            .unwrap();
        assert!(store.get(&scope).await.unwrap().is_some(), "{table}");
        store.close().await;
    }
}

#[tokio::test]
async fn memory_store_opens_and_answers() {
    let store = open("memory://").await.unwrap();
    store.ping().await.unwrap();
}

#[tokio::test]
async fn a_memory_url_sets_the_bound_and_the_store_keeps_it() {
    let store = open("memory://?max_entries=2").await.unwrap();
    assert_eq!(figure(&*store, "idem_memory_max_records"), 2);
    for key in ["a", "b"] {
        let request = ReserveRequest::new(test_scope("/x", key), test_fingerprint("{}"));
        assert!(store.reserve(&request).await.unwrap().lease().is_some());
    }
    // Both in progress: nothing may be dropped to make room.
    let third = ReserveRequest::new(test_scope("/x", "c"), test_fingerprint("{}"));
    assert!(matches!(store.reserve(&third).await, Err(StoreError::Full)));
}
