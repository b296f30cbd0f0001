//! Limits per tenant: at most so many keyed requests in progress at once (per layer,
//! so per gateway instance), and a rate of new keys (a token bucket, kept by the store
//! for every instance where it can); each settable per tenant by an override (see
//! [`IdempotencyLayer::tenant_max_in_flight`], [`IdempotencyLayer::tenant_key_rate`]
//! and [`IdempotencyLayer::tenant_override`]).
//!
//! A request counts in flight from the moment its tenant is named, before its body is
//! read, until its answer is recorded, replayed or refused (a detached execution whose
//! client went away still counts until it records). The counts live in one map of the
//! tenants that have a request in progress, so its size is bounded by the requests in
//! progress; the process's own rate buckets are kept in bounded room (see
//! [`crate::buckets`]).
//!
//! A tenant is only as real as what names it: tenant headers are whatever a client
//! sends, so a client can make up a tenant per request and be under every limit per
//! tenant. The rate of new keys of tenants no verified source named, all together
//! ([`IdempotencyLayer::unverified_key_rate`]), bounds that.
//!
//! What is counted (the [`LimitState`]) is apart from the limits, so that a layer
//! rebuilt from a reloaded configuration takes the counts of the one before it over
//! ([`IdempotencyLayer::take_over_from`]).
//!
//! [`IdempotencyLayer::tenant_max_in_flight`]: crate::IdempotencyLayer::tenant_max_in_flight
//! [`IdempotencyLayer::tenant_key_rate`]: crate::IdempotencyLayer::tenant_key_rate
//! [`IdempotencyLayer::tenant_override`]: crate::IdempotencyLayer::tenant_override
//! [`IdempotencyLayer::take_over_from`]: crate::IdempotencyLayer::take_over_from
//! [`IdempotencyLayer::unverified_key_rate`]: crate::IdempotencyLayer::unverified_key_rate

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_core::{KeyRate, LocalBucket, Tenant, Timestamp};

use crate::buckets::BucketTable;

/// The shortest tenant-name prefix an override may name a tenant by, after
/// `hmac-sha256:`: 16 hex digits (64 bits), the form the per-tenant metrics label
/// tenants with.
pub const MIN_TENANT_PREFIX: usize = 16;

/// What one tenant's limits are instead of the layer's: each `None` keeps the
/// layer's.
///
/// ```
/// use idem_core::KeyRate;
/// use idem_tower::TenantOverride;
///
/// // A large merchant: more in flight, and a faster rate than everyone else.
/// let big = TenantOverride::new()
///     .max_in_flight(200)
///     .key_rate(Some("100/s,200".parse::<KeyRate>().unwrap()));
/// # let _ = big;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantOverride {
    max_in_flight: Option<usize>,
    key_rate: Option<Option<KeyRate>>,
}

impl TenantOverride {
    /// No overrides.
    pub fn new() -> TenantOverride {
        TenantOverride::default()
    }

    /// At most `max` of this tenant's keyed requests in progress at once; `0` for no cap.
    pub fn max_in_flight(mut self, max: usize) -> TenantOverride {
        self.max_in_flight = Some(max);
        self
    }

    /// This tenant's rate of new keys; `None` for no limit.
    pub fn key_rate(mut self, rate: Option<KeyRate>) -> TenantOverride {
        self.key_rate = Some(rate);
        self
    }
}

/// Why a tenant cannot be named in an override.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} names no tenant: write a tenant as stored (`hmac-sha256:` and 64 hex digits, \
     as `idem keys list` shows it), or its first {MIN_TENANT_PREFIX} or more hex digits \
     (`hmac-sha256:0123456789abcdef`, as the per-tenant metrics label it), or `anonymous`"
)]
pub struct TenantNameError(pub String);

/// Checks a tenant's name (or name prefix) as an override may give it.
pub fn check_tenant_name(name: &str) -> Result<(), TenantNameError> {
    if name == Tenant::anonymous().as_str() {
        return Ok(());
    }
    match name.strip_prefix("hmac-sha256:") {
        Some(hex)
            if (MIN_TENANT_PREFIX..=64).contains(&hex.len())
                && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
        {
            Ok(())
        }
        _ => Err(TenantNameError(name.to_owned())),
    }
}

/// The layer's limits per tenant, and the state they are counted in.
#[derive(Clone, Debug, Default)]
pub(crate) struct TenantLimits {
    max_in_flight: usize,
    key_rate: Option<KeyRate>,
    unverified_key_rate: Option<KeyRate>,
    /// Whether the tenant headers name verified tenants (an ingress in front asserts
    /// them).
    headers_verified: bool,
    overrides: Arc<Vec<(String, TenantOverride)>>,
    pub(crate) state: Arc<LimitState>,
}

/// What is counted under the limits, shared by every clone of a layer and handed on
/// to the layer that takes over from it.
#[derive(Debug, Default)]
pub(crate) struct LimitState {
    counts: Mutex<HashMap<Tenant, usize>>,
    buckets: Mutex<BucketTable>,
    /// The one bucket of every unverified tenant's new keys.
    unverified: Mutex<Option<LocalBucket>>,
}

impl TenantLimits {
    pub(crate) fn set_max_in_flight(&mut self, max: usize) {
        self.max_in_flight = max;
    }

    pub(crate) fn set_key_rate(&mut self, rate: Option<KeyRate>) {
        self.key_rate = rate;
    }

    pub(crate) fn set_unverified_key_rate(&mut self, rate: Option<KeyRate>) {
        self.unverified_key_rate = rate;
    }

    pub(crate) fn set_headers_verified(&mut self, verified: bool) {
        self.headers_verified = verified;
    }

    /// Whether the tenant headers name verified tenants.
    pub(crate) fn headers_verified(&self) -> bool {
        self.headers_verified
    }

    /// The rate of new keys of every unverified tenant together, if limited.
    pub(crate) fn unverified_key_rate(&self) -> Option<KeyRate> {
        self.unverified_key_rate
    }

    /// Takes a token from the bucket every unverified tenant's new keys share, at `now`.
    pub(crate) fn take_unverified(&self, rate: &KeyRate, now: Timestamp) -> bool {
        let mut bucket = self
            .state
            .unverified
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        bucket
            .get_or_insert_with(|| LocalBucket::full(rate, now))
            .take(rate, now)
    }

    pub(crate) fn set_override(&mut self, tenant: String, limits: TenantOverride) {
        let overrides = Arc::make_mut(&mut self.overrides);
        overrides.retain(|(t, _)| *t != tenant);
        overrides.push((tenant, limits));
        // The longest (most precise) name first: it wins over a prefix of it.
        overrides.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    }

    /// The override that names `tenant`, if any.
    fn override_for(&self, tenant: &Tenant) -> Option<&TenantOverride> {
        let name = tenant.as_str();
        self.overrides
            .iter()
            .find(|(t, _)| name == t || (t.len() < name.len() && name.starts_with(t.as_str())))
            .map(|(_, o)| o)
    }

    /// `tenant`'s cap on requests in flight; `0` for none.
    pub(crate) fn max_in_flight(&self, tenant: &Tenant) -> usize {
        self.override_for(tenant)
            .and_then(|o| o.max_in_flight)
            .unwrap_or(self.max_in_flight)
    }

    /// `tenant`'s rate of new keys, if limited.
    pub(crate) fn key_rate(&self, tenant: &Tenant) -> Option<KeyRate> {
        self.override_for(tenant)
            .and_then(|o| o.key_rate)
            .unwrap_or(self.key_rate)
    }

    /// A place for one more request of `tenant` under its cap (`Ok(None)` when it has
    /// none), or `Err(max)` when it has `max` already.
    pub(crate) fn try_enter(&self, tenant: &Tenant) -> Result<Option<TenantSlot>, usize> {
        let max = self.max_in_flight(tenant);
        if max == 0 {
            return Ok(None);
        }
        let mut counts = self.state.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(tenant.clone()).or_insert(0);
        if *count >= max {
            return Err(max);
        }
        *count += 1;
        Ok(Some(TenantSlot {
            state: self.state.clone(),
            tenant: tenant.clone(),
        }))
    }

    /// Takes a token from this process's own bucket of `tenant` at `now`.
    pub(crate) fn take_local(&self, tenant: &Tenant, rate: &KeyRate, now: Timestamp) -> bool {
        let mut buckets = self.state.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.take(tenant, rate, now)
    }

    /// These limits, counted in `earlier`'s state.
    pub(crate) fn counted_with(mut self, earlier: &TenantLimits) -> TenantLimits {
        self.state = earlier.state.clone();
        self
    }

    #[cfg(test)]
    fn tenants(&self) -> usize {
        self.state.counts.lock().unwrap().len()
    }
}

/// One request's place under its tenant's cap, given back when dropped.
#[derive(Debug)]
pub(crate) struct TenantSlot {
    state: Arc<LimitState>,
    tenant: Tenant,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut counts = self.state.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

/// Whether `tenant` may execute one more new key at `rate`: a token from the store's
/// bucket, shared by every instance, or from this layer's own where the store keeps
/// none. A store that fails the call lets the key through, and says so in the log.
pub(crate) async fn take_token<St: idem_core::Store + ?Sized>(
    store: &St,
    limits: &TenantLimits,
    tenant: &Tenant,
    rate: &KeyRate,
) -> bool {
    match store.take_rate_token(tenant.as_str(), rate).await {
        Ok(Some(taken)) => taken,
        Ok(None) => limits.take_local(tenant, rate, idem_core::Clock::now(&idem_core::SystemClock)),
        Err(e) => {
            tracing::warn!(error = %e, "the store could not count a new key against its tenant's rate; letting it through");
            true
        }
    }
}

/// Which rate a new key is over.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// Its tenant's own.
    Tenant(KeyRate),
    /// That of every unverified tenant's new keys together.
    Unverified(KeyRate),
}

/// The answer to a new key over its tenant's rate, or over the rate of unverified
/// tenants: its reservation released (so that its retry may run), and 429
/// `key-rate-exceeded` with `Retry-After`.
pub(crate) async fn refuse_new_key<St: idem_core::Store + ?Sized, B>(
    store: &St,
    observer: &dyn crate::Observer,
    lease: idem_core::Lease,
    refusal: Refusal,
    dialect: crate::profile::Dialect,
) -> http::Response<crate::IdempotencyBody<B>> {
    let (limit, rate, detail) = match refusal {
        Refusal::Tenant(rate) => (
            "key_rate",
            rate,
            format!(
                "this tenant has started new keys faster than its rate of {rate} allows; \
                 the key was released and nothing was forwarded: retry with the same key \
                 after the Retry-After delay"
            ),
        ),
        Refusal::Unverified(rate) => (
            "unverified_key_rate",
            rate,
            format!(
                "tenants named by no verified source have together started new keys \
                 faster than their shared rate of {rate} allows; the key was released and \
                 nothing was forwarded: retry with the same key after the Retry-After delay"
            ),
        ),
    };
    observer.tenant_limited(lease.scope.tenant(), limit);
    if let Err(e) = crate::observer::timed(observer, "release", store.release(&lease)).await {
        // The key stays in progress until its lease lapses; its retry then takes over.
        tracing::warn!(error = %e, scope = %lease.scope.digest(), "could not release a key refused for its tenant's rate");
    }
    observer.outcome(crate::Outcome::Rejected);
    let problem = crate::problem::Problem::new(crate::ProblemKind::KeyRateExceeded, detail)
        .retry_after(rate.retry_after());
    let mut response = problem
        .answer(dialect)
        .map(crate::IdempotencyBody::buffered);
    crate::Handled::scoped(&mut response, &lease.scope);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> TenantLimits {
        let mut l = TenantLimits::default();
        l.set_max_in_flight(max);
        l
    }

    #[test]
    fn a_tenant_gets_its_cap_others_theirs_and_the_map_empties() {
        let limit = limits(2);
        let (a, b) = (Tenant::new("a"), Tenant::new("b"));
        let a1 = limit.try_enter(&a).unwrap();
        let a2 = limit.try_enter(&a).unwrap();
        assert_eq!(limit.try_enter(&a).unwrap_err(), 2, "a is at its cap");
        let b1 = limit.try_enter(&b).expect("b is not held up by a");
        drop(a1);
        let a3 = limit.try_enter(&a).expect("a's place came back");
        drop((a2, a3, b1));
        assert_eq!(limit.tenants(), 0, "no tenant is kept once idle");
    }

    #[test]
    fn an_override_by_name_or_prefix_wins_and_the_longest_first() {
        let full = format!("hmac-sha256:{}", "ab".repeat(32));
        let other = format!("hmac-sha256:{}", "cd".repeat(32));
        let mut l = limits(1);
        l.set_key_rate(Some(KeyRate::new(1.0, 1).unwrap()));
        l.set_override(
            "hmac-sha256:abababababababab".into(),
            TenantOverride::new().max_in_flight(5).key_rate(None),
        );
        l.set_override(full.clone(), TenantOverride::new().max_in_flight(7));
        let (t, o) = (Tenant::new(full), Tenant::new(other));
        assert_eq!(
            l.max_in_flight(&t),
            7,
            "the whole name wins over its prefix"
        );
        assert_eq!(l.key_rate(&t), Some(KeyRate::new(1.0, 1).unwrap()));
        assert_eq!(l.max_in_flight(&o), 1);
        let mut p = limits(1);
        p.set_override(
            "hmac-sha256:abababababababab".into(),
            TenantOverride::new().key_rate(None),
        );
        p.set_key_rate(Some(KeyRate::new(1.0, 1).unwrap()));
        assert_eq!(p.key_rate(&t), None, "the prefix's override: no rate");
        assert!(check_tenant_name("hmac-sha256:abababababababab").is_ok());
        assert!(check_tenant_name("anonymous").is_ok());
        for bad in [
            "hmac-sha256:abab",
            "abababababababababab",
            "hmac-sha256:ABABABABABABABAB",
        ] {
            assert!(check_tenant_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_layer_taking_over_counts_in_the_same_state() {
        let before = limits(1);
        let t = Tenant::new("a");
        let held = before.try_enter(&t).unwrap();
        let after = limits(1).counted_with(&before);
        assert!(
            after.try_enter(&t).is_err(),
            "the earlier layer's request counts"
        );
        drop(held);
        assert!(after.try_enter(&t).unwrap().is_some());
    }
}
