//! At most so many keyed requests of one tenant at once, per layer (per gateway
//! instance): one tenant cannot fill the store's leases or the handler's capacity for
//! everyone (see [`IdempotencyLayer::tenant_max_in_flight`]).
//!
//! A request counts from the moment its tenant is named, before its body is read, until
//! its answer is recorded, replayed or refused (a detached execution whose client went
//! away still counts until it records). The counts live in one map of the tenants that
//! have a request in progress, so its size is bounded by the requests in progress.
//!
//! [`IdempotencyLayer::tenant_max_in_flight`]: crate::IdempotencyLayer::tenant_max_in_flight

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_core::Tenant;

/// The per-tenant cap and the counts under it, shared by every clone of a layer.
#[derive(Debug)]
pub(crate) struct TenantLimit {
    max: usize,
    counts: Mutex<HashMap<Tenant, usize>>,
}

impl TenantLimit {
    pub(crate) fn new(max: usize) -> Arc<TenantLimit> {
        Arc::new(TenantLimit {
            max,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// The cap.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A place for one more request of `tenant`, or `None` when it has `max` already.
    pub(crate) fn try_enter(self: &Arc<Self>, tenant: &Tenant) -> Option<TenantSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(tenant.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(TenantSlot {
            limit: self.clone(),
            tenant: tenant.clone(),
        })
    }

    #[cfg(test)]
    fn tenants(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
}

/// One request's place under its tenant's cap, given back when dropped.
#[derive(Debug)]
pub(crate) struct TenantSlot {
    limit: Arc<TenantLimit>,
    tenant: Tenant,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut counts = self.limit.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_its_cap_others_theirs_and_the_map_empties() {
        let limit = TenantLimit::new(2);
        let (a, b) = (Tenant::new("a"), Tenant::new("b"));
        let a1 = limit.try_enter(&a).unwrap();
        let a2 = limit.try_enter(&a).unwrap();
        assert!(limit.try_enter(&a).is_none(), "a is at its cap");
        let b1 = limit.try_enter(&b).expect("b is not held up by a");
        drop(a1);
        let a3 = limit.try_enter(&a).expect("a's place came back");
        drop((a2, a3, b1));
        assert_eq!(limit.tenants(), 0, "no tenant is kept once idle");
    }
}
