//! The store contract suite against `MemoryStore`.

use std::sync::Arc;

use idem_core::{ManualClock, MemoryStore};

idem_core::store_contract_tests!(|clock: ManualClock, _ns: String| async move {
    Some(MemoryStore::with_clock(Arc::new(clock)))
});
