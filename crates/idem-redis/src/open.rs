//! `redis://…` and `redis+cluster://…`: the store opens itself from its URL
//! ([`OpenStore`]).

use idem_core::{OpenError, OpenStore, StoreOptions};

use crate::RedisStore;

/// `redis://[user:password@]host:port[/db]` for one server, or
/// `redis+cluster://[user:password@]host:port[?seeds=host:port,…]` for a Redis Cluster;
/// `rediss://…` and `rediss+cluster://…` for either over TLS, with `cacert`, `cert`,
/// `key` and `insecure=true`; each with `protocol` (which the driver reads), `wait`
/// and `wait_timeout` (see [`Replication`](crate::Replication)), and nothing else: the
/// driver would silently skip an unknown parameter. TLS files that cannot be read or
/// are not what their parameter says are an invalid URL; a TLS handshake that fails
/// (a certificate that does not verify, a server that speaks no TLS) is a refusal. A
/// namespace `NAME` puts every key under `NAME:`.
impl OpenStore for RedisStore {
    const KIND: &'static str = crate::error::KIND;
    const SCHEMES: &'static [&'static str] =
        &["redis", "rediss", "redis+cluster", "rediss+cluster"];
    const EXPIRES_NATIVELY: bool = true;
    /// One reply's bound; a URL with `wait` adds its `wait_timeout`.
    const OPERATION_TIMEOUT: Option<std::time::Duration> = Some(crate::DEFAULT_TIMEOUT);

    /// The multiplexed connection, and a new one while it reconnects (on a cluster,
    /// that many per node).
    fn descriptors(_: &StoreOptions) -> u64 {
        2
    }

    async fn open(url: &str, options: &StoreOptions) -> Result<RedisStore, OpenError> {
        let namespace = options
            .namespace
            .as_ref()
            .map_or(idem_core::DEFAULT_NAMESPACE, |n| n.as_str());
        let builder = RedisStore::builder().key_prefix(format!("{namespace}:"));
        let opened = match options.schema {
            idem_core::Schema::Migrate => builder.connect(url).await,
            // Inspection writes nothing, the marker included: it reads it.
            idem_core::Schema::Existing => match builder.mark(false).connect(url).await {
                Ok(store) => store.check_marker().await.map(|()| store),
                Err(e) => Err(e),
            },
        };
        opened.map_err(|e| OpenError::setup(url, options, e))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::Store;
    use idem_core::open::checks;
    use idem_core::testing::unique_namespace;
    use idem_test_support::{service_unavailable, service_url};

    use super::*;
    use crate::target::Target;

    async fn open(url: String) -> Result<RedisStore, OpenError> {
        RedisStore::open(&url, &StoreOptions::default()).await
    }

    #[tokio::test]
    async fn urls_that_cannot_work_are_invalid_before_connecting() {
        let cases = [
            (
                "redis://127.0.0.1:6379/?prefix=idem_prof",
                "unknown parameter \"prefix\"",
            ),
            (
                "redis://127.0.0.1:6379/?timeout=5",
                "unknown parameter \"timeout\"",
            ),
            ("redis://127.0.0.1:notaport", "invalid redis store URL"),
            ("rediss://127.0.0.1:6379/#insecure", "write insecure=true"),
            (
                "rediss://127.0.0.1:6379/?cacert=/nonexistent/ca.pem",
                "cacert=/nonexistent/ca.pem: cannot read the file",
            ),
            (
                "redis://127.0.0.1:6379/?cacert=/nonexistent/ca.pem",
                "redis:// is plaintext: write rediss://",
            ),
            (
                "redis+cluster://127.0.0.1:6379/?insecure=true",
                "write rediss+cluster://",
            ),
            ("rediss://127.0.0.1:6379/?cert=/c.pem", "cert needs key"),
            (
                "rediss://127.0.0.1:6379/?insecure=yes",
                "expected true or false",
            ),
            (
                "rediss://127.0.0.1:6379/?insecure=true&cacert=/ca.pem",
                "cacert would not be used",
            ),
            (
                "redis+cluster://127.0.0.1:7000/?seeds=127.0.0.1",
                "expected HOST:PORT",
            ),
            ("redis://127.0.0.1:6379/?wait=x", "number of replicas"),
        ];
        checks::invalid_urls("redis", &cases, open).await;
    }

    #[test]
    fn the_parameters_a_redis_url_takes_are_kept() {
        for url in [
            "redis://127.0.0.1:6379/0?protocol=resp3",
            "redis://127.0.0.1:6379/",
            "redis://127.0.0.1:6379/?wait=1&wait_timeout=250ms",
            "redis+cluster://127.0.0.1:7000/?seeds=127.0.0.1:7001&wait=1",
        ] {
            assert!(Target::parse(url).is_ok(), "{url}");
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_and_may_pass() {
        let url = |port| format!("redis://:secret@127.0.0.1:{port}");
        checks::unreachable_at_a_closed_port("redis", url, open).await;
    }

    /// A raw connection to the server at `url`, for looking at what the store wrote.
    async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The keys under `prefix` on the server.
    async fn keys_under(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(conn)
            .await
            .unwrap()
    }

    fn inspecting(name: &str) -> StoreOptions {
        StoreOptions {
            schema: idem_core::Schema::Existing,
            ..checks::namespaced(name)
        }
    }

    /// Inspecting a namespace no gateway opened fails as "never opened", in the shape
    /// the SQL stores give, and writes nothing; once a store has connected for serving,
    /// its marker (the schema version, no TTL) makes the same namespace, still without
    /// a record, open and list nothing.
    #[tokio::test]
    async fn a_namespace_never_opened_is_told_from_an_empty_one() {
        let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let name = unique_namespace("never_opened");
        let e = match RedisStore::open(&url, &inspecting(&name)).await {
            Err(e @ OpenError::Unreachable { .. }) => {
                return service_unavailable("Redis", &url, &e).unwrap_or(());
            }
            Err(e) => e,
            Ok(_) => panic!("a namespace never opened was opened"),
        };
        assert!(matches!(e, OpenError::NoSchema { .. }), "{e:?}");
        assert!(!e.may_pass() && !e.is_configuration(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&format!(
                "namespace {name} was never opened by idem (no key {name}:meta:schema"
            )),
            "{text}"
        );
        let mut conn = raw(&url).await;
        assert_eq!(
            keys_under(&mut conn, &format!("{name}:")).await,
            Vec::<String>::new()
        );

        let serving = RedisStore::open(&url, &checks::namespaced(&name))
            .await
            .unwrap();
        let marker = serving.marker_key();
        assert_eq!(marker, format!("{name}:meta:schema"));
        let version: String = redis::cmd("GET")
            .arg(&marker)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(version, crate::SCHEMA_VERSION.to_string());
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&marker)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(ttl, -1, "the marker has no TTL");
        serving.close().await;

        let inspected = RedisStore::open(&url, &inspecting(&name)).await.unwrap();
        let page = inspected.list(&idem_core::ListQuery::new()).await.unwrap();
        assert!(page.records.is_empty(), "{page:?}");
        inspected.close().await;
        let _: i64 = redis::cmd("DEL")
            .arg(&marker)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// A namespace a later build marked is refused, for serving and inspecting alike,
    /// and left as it is; a tenant secret an older gateway left counts as its marker.
    #[tokio::test]
    async fn a_later_marker_is_refused_and_an_older_gateways_secret_counts() {
        let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let name = unique_namespace("later_marker");
        let marker = format!("{name}:meta:schema");
        let mut conn = match redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
        {
            Ok(conn) => conn,
            Err(e) => return service_unavailable("Redis", &url, &e).unwrap_or(()),
        };
        let later = (crate::SCHEMA_VERSION + 1).to_string();
        let _: () = redis::cmd("SET")
            .arg(&marker)
            .arg(&later)
            .query_async(&mut conn)
            .await
            .unwrap();
        for options in [checks::namespaced(&name), inspecting(&name)] {
            let e = RedisStore::open(&url, &options).await.expect_err("refused");
            assert!(matches!(e, OpenError::Failed { .. }), "{e:?}");
            assert!(
                e.to_string().contains(&format!("schema version {later}")),
                "{e}"
            );
        }
        let kept: String = redis::cmd("GET")
            .arg(&marker)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kept, later);
        let _: i64 = redis::cmd("DEL")
            .arg(&marker)
            .query_async(&mut conn)
            .await
            .unwrap();

        let secret = format!("{name}:meta:{}", idem_core::TENANT_SECRET_NAME);
        let _: () = redis::cmd("SET")
            .arg(&secret)
            .arg("s")
            .query_async(&mut conn)
            .await
            .unwrap();
        let inspected = RedisStore::open(&url, &inspecting(&name)).await.unwrap();
        inspected.close().await;
        assert_eq!(
            keys_under(&mut conn, &format!("{name}:")).await,
            vec![secret.clone()]
        );
        let _: i64 = redis::cmd("DEL")
            .arg(&secret)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_namespace_is_a_key_prefix_and_records_expire_natively() {
        let url = service_url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379");
        let name = unique_namespace("open");
        let options = checks::namespaced(&name);
        let store = match RedisStore::open(&url, &options).await {
            Ok(store) => store,
            Err(e @ OpenError::Unreachable { .. }) => {
                return service_unavailable("Redis", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(store.key_prefix(), format!("{name}:"));
        assert!(store.expires_natively());
        // The kind says so before any store is open, and the store agrees.
        assert_eq!(store.expires_natively(), RedisStore::EXPIRES_NATIVELY);
        let default = open(url.clone()).await.unwrap();
        assert_eq!(default.key_prefix(), crate::DEFAULT_KEY_PREFIX);
        assert_eq!(RedisStore::descriptors(&options), 2);
        // The marker opening wrote, on a server that may hold other data.
        let mut conn = raw(&url).await;
        let _: i64 = redis::cmd("DEL")
            .arg(store.marker_key())
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}
