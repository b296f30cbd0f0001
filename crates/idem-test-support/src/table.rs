//! What a SQL store's tests share: a table of their own ([`TempTable`]), dropped when
//! the test ends, pass or panic; [`on_temp_table`], which opens a store on one or skips
//! loudly; and the checks of a pool's figures ([`assert_pool_figures`]) and of a
//! tenant secret two instances agree on ([`agreed_secret`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::{MetricKind, SetupError, Store, TENANT_SECRET_NAME};

use crate::{HookedStore, StoreHooks, service_unavailable};

/// How a store crate drops a table of its own, with everything that goes with it (its
/// migration rows): given the server's URL and the table's name, a future that connects
/// and drops, or says why it could not.
pub type DropTable = fn(url: String, table: String) -> DropFuture;

/// What a [`DropTable`] returns.
pub type DropFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The table a test's store works in, dropped when this is (the store with it), even
/// when the test panics: so that no test assumes an empty database, and none leaves
/// tables behind.
#[derive(Debug)]
pub struct TempTable {
    /// The server's URL.
    pub url: String,
    /// The table's name.
    pub table: String,
    drop_table: DropTable,
}

impl TempTable {
    /// The table `table` on the server at `url`, which `drop_table` drops.
    pub fn new(url: String, table: String, drop_table: DropTable) -> TempTable {
        TempTable {
            url,
            table,
            drop_table,
        }
    }
}

impl Drop for TempTable {
    fn drop(&mut self) {
        let drop_table = self.drop_table;
        let (url, table) = (self.url.clone(), self.table.clone());
        // Drop may run inside the test's runtime, which must not be blocked on; a
        // thread with its own small runtime does the work and is waited for.
        let done = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(drop_table(url, table))
        })
        .join();
        if let Ok(Err(e)) = done {
            eprintln!("could not drop test table {}: {e}", self.table);
        }
    }
}

/// Every call passes on to the store: the table only has to outlive it.
impl<S: Store> StoreHooks<S> for TempTable {}

/// A store on a table of its own, dropped with it.
pub type TempStore<S> = HookedStore<S, TempTable>;

/// The store `opened` on `table` (named after the test), which `drop_table` drops when
/// the store is dropped; or, when `service` at `url` could not be reached, `None`, said
/// loudly (a failure under `IDEM_REQUIRE_SERVICES=1`). Any other setup error fails the
/// test.
pub fn on_temp_table<S: Store>(
    service: &str,
    url: String,
    table: String,
    drop_table: DropTable,
    opened: Result<S, SetupError>,
) -> Option<TempStore<S>> {
    match opened {
        Ok(store) => Some(HookedStore::new(
            store,
            TempTable::new(url, table, drop_table),
        )),
        Err(e @ SetupError::Unreachable { .. }) => service_unavailable(service, &url, &e),
        Err(e) => panic!("connecting to {service} at {url}: {e}"),
    }
}

/// How long a [`DropTable`] may wait for a connection: a test's end is no place to hang.
pub const DROP_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks the figures of `store`'s connection pool after it has run a statement:
/// `{prefix}_pool_max_connections` is `max`, `{prefix}_pool_connections` (those open) is
/// between 1 and `max`, `{prefix}_pool_idle_connections` at most those open; all gauges.
pub fn assert_pool_figures(store: &dyn Store, prefix: &str, max: u64) {
    let figures = store.metrics();
    let value = |name: String| {
        let m = figures
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} missing from {figures:?}"));
        assert_eq!(m.kind, MetricKind::Gauge, "{name}");
        m.value
    };
    assert_eq!(value(format!("{prefix}_pool_max_connections")), max);
    let open = value(format!("{prefix}_pool_connections"));
    assert!((1..=max).contains(&open), "{open} connections open");
    assert!(value(format!("{prefix}_pool_idle_connections")) <= open);
}

/// Two stores on one table (two gateways) each offer a tenant secret of their own at
/// once: both get the same one back, one of the two offered. Returns it, for the caller
/// to check that a store connected later reads it again.
pub async fn agreed_secret(a: &dyn Store, b: &dyn Store) -> Vec<u8> {
    let name = TENANT_SECRET_NAME;
    let (from_a, from_b) =
        tokio::join!(a.init_secret(name, &[1; 32]), b.init_secret(name, &[2; 32]));
    let (from_a, from_b) = (from_a.expect("a's secret"), from_b.expect("b's secret"));
    assert_eq!(from_a, from_b, "two instances on one table got two secrets");
    assert!(from_a == [1; 32] || from_a == [2; 32], "{from_a:?}");
    from_a
}
