//! `Sealed` over `MemoryStore`: the store contract holds through the wrapper, and the
//! sealing cases (SPEC S17).

use std::sync::Arc;

use idem_core::testing::sealing;
use idem_core::{ManualClock, MemoryStore, Sealed};

mod contract {
    use super::*;

    idem_core::store_contract_tests!(|clock: ManualClock, _ns: String| async move {
        Some(Sealed::new(
            MemoryStore::with_clock(Arc::new(clock)),
            sealing::ring("contract", 3),
        ))
    });
}

#[tokio::test]
async fn sealing_cases_hold_over_the_memory_store() {
    sealing::all(Arc::new(MemoryStore::new())).await;
}
