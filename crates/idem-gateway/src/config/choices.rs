//! The settings that name one of a few choices, as the command line and the file spell
//! them.

use clap::ValueEnum;
use serde::Deserialize;

/// Whose key is it: the scope mode (SPEC S3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScopeArg {
    /// `(tenant, endpoint, key)`.
    Public,
    /// `(tenant, key)`.
    Internal,
}

/// The dialect of the gateway's own answers ([`idem_tower::Profile`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileArg {
    /// The IETF draft, with RFC 9457 problem details.
    Ietf,
    /// Stripe's error envelope (a reused key is a 400 `idempotency_error`).
    Stripe,
    /// The Agentic Commerce Protocol's flat errors.
    Acp,
    /// The Universal Commerce Protocol's errors (a reused key is a 409).
    Ucp,
}

impl ProfileArg {
    /// The layer's profile.
    pub fn profile(self) -> idem_tower::Profile {
        match self {
            ProfileArg::Ietf => idem_tower::Profile::Ietf,
            ProfileArg::Stripe => idem_tower::Profile::Stripe,
            ProfileArg::Acp => idem_tower::Profile::Acp,
            ProfileArg::Ucp => idem_tower::Profile::Ucp,
        }
    }
}
