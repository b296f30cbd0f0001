//! The store contract kit against `ToyStore`: one test per case, each with a store of
//! its own reading the case's clock.

use std::sync::Arc;

use idem_core::ManualClock;
use toy_store::ToyStore;

idem_core::store_contract_tests!(|clock: ManualClock, _namespace: String| async move {
    // A store in memory is fresh for every case; a networked one would put its tables
    // or keys under `_namespace`, and return `None` when its server cannot be reached.
    Some(ToyStore::new(Arc::new(clock)))
});
