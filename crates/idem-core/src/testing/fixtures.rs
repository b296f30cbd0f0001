//! The namespaces, scopes and fingerprints the contract cases (and the stores' own
//! tests) use.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Endpoint, Fingerprint, FingerprintOptions, Key, Scope, ScopeMode, Tenant};

/// A namespace unique to this process and case: lower-case ASCII letters, digits and
/// `_`, at most 40 characters, safe as a SQL identifier suffix or a key prefix.
pub fn unique_namespace(case: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let rand = getrandom::u32().unwrap_or(0);
    let short: String = case
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(20)
        .collect::<String>()
        .to_ascii_lowercase();
    format!("{short}_{rand:08x}{n}")
}

/// A scope for tests: a fresh random tenant, so cases never collide even in one
/// namespace.
pub fn test_scope(endpoint: &str, key: &str) -> Scope {
    let tenant = Tenant::new(format!("tenant-{:016x}", getrandom::u64().unwrap_or(0)));
    scope_of(tenant, endpoint, key)
}

/// The public scope of `key` on `POST endpoint` for `tenant`: for tests that name the
/// tenant a layer or a store will scope by (see [`test_scope`] for one that never
/// collides).
pub fn scope_of(tenant: Tenant, endpoint: &str, key: &str) -> Scope {
    Scope::new(
        ScopeMode::Public,
        tenant,
        Endpoint::new("POST", endpoint),
        Key::new(key).expect("test keys are valid"),
    )
}

/// A fingerprint of `body` for tests.
pub fn test_fingerprint(body: &str) -> Fingerprint {
    Fingerprint::compute(
        "POST",
        "POST /test",
        Some("application/json"),
        body.as_bytes(),
        &FingerprintOptions::default(),
    )
}
