//! Keyed requests per tenant, for the busiest tenants only: the label set stays
//! bounded however many tenants there are.
//!
//! The table holds at most `capacity` tenants and is kept by the Space-Saving rule: a
//! tenant not in a full table takes the place of the one with the fewest requests, and
//! starts from that count plus one. Every tenant with more than (keyed requests in
//! all) / `capacity` requests is in the table, and a tenant's count is an upper bound
//! that exceeds its true count by at most the count it started from. A tenant is
//! labelled by the first 16 hex digits of its stored name (`hmac-sha256:…`; 64 bits,
//! enough to tell tenants apart, and the form `[[tenant]]` overrides accept), never by
//! a credential.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::Tenant;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

/// How many tenants the table holds unless configured otherwise.
pub(crate) const DEFAULT_TENANT_METRICS: usize = 10;

/// The per-tenant table.
#[derive(Debug, Default)]
pub(super) struct TopTenants {
    capacity: AtomicUsize,
    rows: Mutex<Vec<Row>>,
}

#[derive(Debug, Clone)]
struct Row {
    label: String,
    keyed: u64,
    in_flight: u64,
    key_rate: u64,
}

/// The label of `tenant`: its name, cut after 16 hex digits of its digest.
pub(crate) fn tenant_label(tenant: &Tenant) -> &str {
    let name = tenant.as_str();
    match name.strip_prefix("hmac-sha256:") {
        Some(hex) if hex.len() > idem_tower::MIN_TENANT_PREFIX => {
            &name[..name.len() - hex.len() + idem_tower::MIN_TENANT_PREFIX]
        }
        _ => name,
    }
}

impl TopTenants {
    pub(super) fn new(capacity: usize) -> TopTenants {
        TopTenants {
            capacity: AtomicUsize::new(capacity),
            rows: Mutex::new(Vec::with_capacity(capacity)),
        }
    }

    /// Holds at most `capacity` tenants from now on (the busiest kept).
    pub(super) fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity, Ordering::Relaxed);
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.sort_by_key(|r| std::cmp::Reverse(r.keyed));
        rows.truncate(capacity);
    }

    /// Counts one keyed request of `tenant`.
    pub(super) fn keyed(&self, tenant: &Tenant) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if capacity == 0 {
            return;
        }
        let label = tenant_label(tenant);
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(row) = rows.iter_mut().find(|r| r.label == label) {
            row.keyed += 1;
            return;
        }
        let row = Row {
            label: label.to_owned(),
            keyed: 1,
            in_flight: 0,
            key_rate: 0,
        };
        if rows.len() < capacity {
            rows.push(row);
        } else if let Some(least) = rows.iter_mut().min_by_key(|r| r.keyed) {
            let floor = least.keyed;
            *least = Row {
                keyed: floor + 1,
                ..row
            };
        }
    }

    /// Counts one refusal of `tenant`'s under `limit` (`in_flight` or `key_rate`), if
    /// the tenant is in the table.
    pub(super) fn limited(&self, tenant: &Tenant, limit: &str) {
        let label = tenant_label(tenant);
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(row) = rows.iter_mut().find(|r| r.label == label) {
            match limit {
                "in_flight" => row.in_flight += 1,
                "key_rate" => row.key_rate += 1,
                _ => {}
            }
        }
    }

    fn snapshot(&self) -> Vec<Row> {
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner()).clone();
        rows.sort_by(|a, b| b.keyed.cmp(&a.keyed).then_with(|| a.label.cmp(&b.label)));
        rows
    }
}

/// The table's collector, read at each scrape.
pub(super) struct TenantFigures(pub(super) std::sync::Arc<TopTenants>);

impl fmt::Debug for TenantFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TenantFigures").finish_non_exhaustive()
    }
}

impl Collector for TenantFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let rows = self.0.snapshot();
        let mut keyed = encoder.encode_descriptor(
            "idem_tenant_keyed_requests",
            "Keyed requests of the busiest tenants (--tenant-metrics of them; an upper \
             bound for each, see the guide), by the first 16 hex digits of the tenant",
            None,
            MetricType::Counter,
        )?;
        for row in &rows {
            ConstCounter::new(row.keyed)
                .encode(keyed.encode_family(&[("tenant", row.label.as_str())])?)?;
        }
        let mut limited = encoder.encode_descriptor(
            "idem_tenant_limited_requests",
            "Keyed requests of the busiest tenants refused by a limit per tenant \
             (in_flight: --tenant-max-in-flight; key_rate: --tenant-key-rate)",
            None,
            MetricType::Counter,
        )?;
        for row in &rows {
            for (limit, count) in [("in_flight", row.in_flight), ("key_rate", row.key_rate)] {
                ConstCounter::new(count).encode(
                    limited.encode_family(&[("tenant", row.label.as_str()), ("limit", limit)])?,
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(i: u32) -> Tenant {
        Tenant::new(format!("hmac-sha256:{i:016x}{}", "0".repeat(48)))
    }

    #[test]
    fn the_busiest_tenants_stay_in_a_table_of_bounded_size() {
        // 400 requests in a table of 5: every tenant with over 80 is kept.
        let top = TopTenants::new(5);
        for round in 0..100 {
            top.keyed(&tenant(1));
            top.keyed(&tenant(1));
            top.keyed(&tenant(2));
            // Many tenants of one request each.
            top.keyed(&tenant(1000 + round));
        }
        let rows = top.snapshot();
        assert_eq!(rows.len(), 5, "bounded");
        assert_eq!(rows[0].label, tenant_label(&tenant(1)));
        assert_eq!(rows[0].keyed, 200, "never evicted, so counted exactly");
        assert_eq!(rows[1].label, tenant_label(&tenant(2)));
        assert_eq!(rows[1].keyed, 100);
        assert!(
            rows[2].keyed < 100,
            "the one-off tenants share what is left"
        );
        top.limited(&tenant(1), "key_rate");
        assert_eq!(top.snapshot()[0].key_rate, 1);
        assert_eq!(tenant_label(&tenant(1)), "hmac-sha256:0000000000000001");
        assert_eq!(tenant_label(&Tenant::anonymous()), "anonymous");
    }
}
