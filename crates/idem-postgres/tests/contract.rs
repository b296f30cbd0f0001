//! The idem-core store contract suite against a live PostgreSQL, one table per case.

mod common;

use idem_core::ManualClock;

idem_core::store_contract_tests!(|clock: ManualClock, ns: String| async move {
    common::store_with_clock(&clock, &ns).await
});
