//! `[[tenant]]` tables: one tenant's limits in place of the global ones.

use super::ServeArgs;
use super::error::{ConfigError, invalid};
use super::rules::TenantRule;

/// One `[[tenant]]` table, checked: a tenant's limits in place of the global ones.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantLimits {
    /// The tenant as stored, or a prefix of at least 16 hex digits of it.
    pub(crate) id: String,
    /// Its most keyed requests in progress; `None` keeps the global one.
    pub(crate) max_in_flight: Option<usize>,
    /// Its rate of new keys (`Some(None)`: no limit); `None` keeps the global one.
    pub(crate) key_rate: Option<Option<idem_core::KeyRate>>,
}

/// The `[[tenant]]` tables, checked.
pub(super) fn resolve(a: &ServeArgs) -> Result<Vec<TenantLimits>, ConfigError> {
    a.tenant
        .iter()
        .cloned()
        .map(TenantLimits::from_rule)
        .collect()
}

impl TenantLimits {
    fn from_rule(rule: TenantRule) -> Result<TenantLimits, ConfigError> {
        let TenantRule {
            id,
            max_in_flight,
            key_rate,
        } = rule;
        idem_tower::check_tenant_name(&id).map_err(|e| invalid("[[tenant]] id", e))?;
        let key_rate = match key_rate.as_deref() {
            None => None,
            Some("none") => Some(None),
            Some(rate) => {
                Some(Some(rate.parse().map_err(|e| {
                    invalid(format!("[[tenant]] {id}: key_rate"), e)
                })?))
            }
        };
        Ok(TenantLimits {
            max_in_flight: max_in_flight.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            key_rate,
            id,
        })
    }

    /// The override the layer takes.
    pub(crate) fn to_override(&self) -> idem_tower::TenantOverride {
        let mut o = idem_tower::TenantOverride::new();
        if let Some(max) = self.max_in_flight {
            o = o.max_in_flight(max);
        }
        if let Some(rate) = self.key_rate {
            o = o.key_rate(rate);
        }
        o
    }
}
