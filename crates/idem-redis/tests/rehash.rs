//! The listing while Redis resizes its keyspace (issue 35): another application pours
//! keys into the same database between pages, so the server's table grows (and, in the
//! second case, shrinks) while a listing pages through it. Each case runs on a server
//! of its own that starts empty, one node and a cluster, so that the growth from empty
//! to 40 000 keys and more happens for certain.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{test_fingerprint, test_scope, unique_namespace};
use idem_core::{
    ListQuery, ManualClock, Reservation, ReserveRequest, StateFilter, Store, StoredResponse,
};
use idem_redis::RedisStore;
use idem_test_support::{RedisCluster, service_unavailable};

/// Records the listing must find, half of them completed.
const RECORDS: usize = 40;

/// The keys of another application, written straight to the server: `SET`s in
/// pipelines of 200 keys that share a hash tag (one slot each on a cluster; the tags
/// spread the pipelines over the masters).
struct Pourer {
    conn: PourConn,
    poured: usize,
    ns: String,
}

enum PourConn {
    Server(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

const CHUNK: usize = 200;

impl Pourer {
    async fn open(url: &str, ns: &str) -> Pourer {
        let conn = if url.starts_with("redis+cluster") {
            let nodes: Vec<String> = url
                .split(['/', '?', '=', ','])
                .filter(|part| part.starts_with("127.0.0.1:"))
                .map(|addr| format!("redis://{addr}"))
                .collect();
            let client = redis::cluster::ClusterClient::new(nodes).expect("cluster client");
            PourConn::Cluster(client.get_async_connection().await.expect("cluster"))
        } else {
            let client = redis::Client::open(url).expect("client");
            PourConn::Server(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("server"),
            )
        };
        Pourer {
            conn,
            poured: 0,
            ns: ns.to_owned(),
        }
    }

    fn key(&self, i: usize) -> String {
        format!("other-app:{{{}-{}}}:{i}", self.ns, i / CHUNK)
    }

    /// Runs `command` on each key numbered in `range`, a pipeline per hash tag.
    async fn each(&mut self, range: std::ops::Range<usize>, command: &str) {
        let mut i = range.start;
        while i < range.end {
            let end = ((i / CHUNK + 1) * CHUNK).min(range.end);
            let mut pipe = redis::pipe();
            for j in i..end {
                pipe.cmd(command).arg(self.key(j));
                if command == "SET" {
                    pipe.arg(j);
                }
                pipe.ignore();
            }
            let reply: redis::RedisResult<()> = match &mut self.conn {
                PourConn::Server(c) => pipe.query_async(c).await,
                PourConn::Cluster(c) => pipe.query_async(c).await,
            };
            reply.unwrap_or_else(|e| panic!("{command} keys {i}..{end}: {e}"));
            i = end;
        }
    }

    /// Writes `count` more keys of the other application.
    async fn pour(&mut self, count: usize) {
        self.each(self.poured..self.poured + count, "SET").await;
        self.poured += count;
    }

    /// Deletes the other application's newest keys until `keep` are left: the table
    /// shrinks once under a tenth of it is used.
    async fn drain(&mut self, keep: usize) {
        self.each(keep..self.poured, "DEL").await;
        self.poured = keep;
    }
}

async fn connect(url: &str, ns: &str) -> RedisStore {
    RedisStore::builder()
        .clock(Arc::new(ManualClock::starting_now()))
        .key_prefix(format!("idem-test:{ns}:"))
        .timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("the server at {url}: {e}"))
}

/// [`RECORDS`] records, every other one completed; their keys.
async fn fill(store: &RedisStore) -> (Vec<String>, Vec<String>) {
    let (mut all, mut completed) = (Vec::new(), Vec::new());
    for i in 0..RECORDS {
        let key = format!("rehash-{i:02}");
        let req = ReserveRequest::new(test_scope("/v1/rehash", &key), test_fingerprint("{}"));
        let Reservation::Acquired(lease) = store.reserve(&req).await.expect("reserve") else {
            panic!("{key} was fresh");
        };
        if i % 2 == 0 {
            store
                .complete(&lease, &StoredResponse::new(201, "done"))
                .await
                .expect("complete");
            completed.push(key.clone());
        }
        all.push(key);
    }
    (all, completed)
}

/// What the other application does between two pages.
#[derive(Clone, Copy)]
enum Between {
    /// Doubles its keys from 64 until 40 000 are there, then adds 1 000 a page, so the
    /// table grows between most pages.
    Grow,
    /// Deletes nine tenths of its keys every fourth page and doubles them on the
    /// others: the table shrinks, and grows back.
    Shrink,
}

impl Pourer {
    async fn between(&mut self, what: Between, page: usize) {
        match what {
            Between::Grow if self.poured < 40_000 => self.pour(self.poured.max(64)).await,
            Between::Grow => self.pour(1_000).await,
            Between::Shrink if page.is_multiple_of(4) => self.drain(self.poured / 10).await,
            Between::Shrink => self.pour(self.poured.max(64)).await,
        }
    }
}

/// How often each key was listed, following every page of `query` while `pourer` does
/// `what` before each page after the first.
async fn listed(
    store: &RedisStore,
    mut query: ListQuery,
    pourer: &mut Pourer,
    what: Between,
) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for page_no in 0..100_000 {
        if page_no > 0 {
            pourer.between(what, page_no).await;
        }
        let page = store.list(&query).await.expect("list");
        assert!(page.records.len() <= query.limit(), "over the limit");
        for record in page.records {
            *seen
                .entry(record.scope.key().as_str().to_owned())
                .or_insert(0) += 1;
        }
        match page.next {
            Some(next) => query.after = Some(next),
            None => return seen,
        }
    }
    panic!("the listing did not end");
}

async fn every_record_exactly_once_while_the_keyspace_grows(url: &str) {
    let ns = unique_namespace("rehash-grow");
    let store = connect(url, &ns).await;
    let (all, completed) = fill(&store).await;
    for (limit, state, expected) in [
        (1, None, &all),
        (3, None, &all),
        (7, Some(StateFilter::Completed), &completed),
    ] {
        let mut pourer = Pourer::open(url, &format!("{ns}-{limit}")).await;
        let mut query = ListQuery::new().with_limit(limit);
        query.state = state;
        let seen = listed(&store, query, &mut pourer, Between::Grow).await;
        let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            repeated.is_empty(),
            "limit {limit}: listed more than once while {} keys were poured: {repeated:?}",
            pourer.poured
        );
        let keys: Vec<&String> = seen.keys().collect();
        let mut expected: Vec<&String> = expected.iter().collect();
        expected.sort();
        assert_eq!(keys, expected, "limit {limit}: every record, once");
        if limit == 1 {
            assert!(
                pourer.poured >= 40_000,
                "only {} keys poured",
                pourer.poured
            );
        }
    }
}

async fn no_record_skipped_while_the_keyspace_shrinks(url: &str) {
    let ns = unique_namespace("rehash-shrink");
    let store = connect(url, &ns).await;
    let (all, _) = fill(&store).await;
    let mut pourer = Pourer::open(url, &ns).await;
    pourer.pour(40_000).await;
    let seen = listed(
        &store,
        ListQuery::new().with_limit(2),
        &mut pourer,
        Between::Shrink,
    )
    .await;
    let repeated = seen.values().filter(|n| **n > 1).count();
    eprintln!("shrinking: {repeated} of {RECORDS} records listed more than once");
    let keys: Vec<&String> = seen.keys().collect();
    let expected: Vec<&String> = all.iter().collect();
    assert_eq!(keys, expected, "a shrinking keyspace hides no record");
}

fn own_server() -> Option<RedisCluster> {
    match RedisCluster::start_replicated(0) {
        Ok(server) => Some(server),
        Err(e) => service_unavailable("a Redis server of the test's own", "127.0.0.1", &e),
    }
}

fn own_cluster() -> Option<RedisCluster> {
    match RedisCluster::start(3, 0, Duration::from_secs(5)) {
        Ok(cluster) => Some(cluster),
        Err(e) => service_unavailable("a Redis Cluster of the test's own", "127.0.0.1", &e),
    }
}

/// One server, growing from empty to 40 000 keys and more while pages of 1, 3 and 7
/// records are listed: each record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_returns_each_record_exactly_once_while_one_server_grows() {
    let Some(server) = own_server() else { return };
    every_record_exactly_once_while_the_keyspace_grows(&server.url()).await;
}

/// The same on a cluster of three masters, each growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_returns_each_record_exactly_once_while_a_cluster_grows() {
    let Some(cluster) = own_cluster() else { return };
    every_record_exactly_once_while_the_keyspace_grows(&cluster.url()).await;
}

/// One server whose keyspace shrinks by nine tenths and grows back between pages: no
/// record is skipped (a shrink may repeat one, as Redis's `SCAN` does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_skips_no_record_while_one_server_shrinks() {
    let Some(server) = own_server() else { return };
    no_record_skipped_while_the_keyspace_shrinks(&server.url()).await;
}

/// The same on a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_skips_no_record_while_a_cluster_shrinks() {
    let Some(cluster) = own_cluster() else { return };
    no_record_skipped_while_the_keyspace_shrinks(&cluster.url()).await;
}
