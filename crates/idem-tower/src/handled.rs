//! [`Handled`]: what the layer did with a request, on the extensions of the response it
//! answers with, for an access log outside the layer.

use http::Response;
use idem_core::{Lease, Scope};

use crate::observer::Outcome;

/// What the layer did with one request, found in the extensions of every response the
/// layer answers with: the [`Outcome`] it also reported to its [`Observer`](crate::Observer),
/// and for a keyed request the record's scope and, where an attempt ran, its number.
///
/// A service outside the layer (an access log, say) reads it; log the scope's
/// [`digest`](Scope::digest), never the key or the tenant.
///
/// ```
/// # use idem_tower::{Handled, Outcome};
/// # fn log(response: &http::Response<()>) {
/// if let Some(handled) = response.extensions().get::<Handled>() {
///     let digest = handled.scope.as_ref().map(|s| s.digest());
///     println!("{} attempt={:?} scope={:?}", handled.outcome, handled.attempt, digest);
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Handled {
    /// What the layer did.
    pub outcome: Outcome,
    /// The attempt that ran (1, or n + 1 after a takeover, SPEC S7) when the request
    /// executed; `None` when no attempt ran (a replay, a refusal, a pass-through).
    pub attempt: Option<u32>,
    /// The record's scope, for a keyed request that was scoped; `None` otherwise.
    pub scope: Option<Scope>,
}

impl Handled {
    /// Marks `response` with `outcome`, nothing else known yet.
    pub(crate) fn mark<B>(response: &mut Response<B>, outcome: Outcome) {
        response.extensions_mut().insert(Handled {
            outcome,
            attempt: None,
            scope: None,
        });
    }

    /// Marks `response` with `outcome` for the attempt `attempt` of `scope`'s record.
    pub(crate) fn keyed<B>(
        response: &mut Response<B>,
        outcome: Outcome,
        scope: &Scope,
        attempt: Option<u32>,
    ) {
        response.extensions_mut().insert(Handled {
            outcome,
            attempt,
            scope: Some(scope.clone()),
        });
    }

    /// The mark of an answer of the attempt `lease` holds.
    pub(crate) fn ran(outcome: Outcome, lease: &Lease) -> Handled {
        Handled {
            outcome,
            attempt: Some(lease.attempt),
            scope: Some(lease.scope.clone()),
        }
    }

    /// Adds `scope` to the mark on `response`, if it has one.
    pub(crate) fn scoped<B>(response: &mut Response<B>, scope: &Scope) {
        if let Some(handled) = response.extensions_mut().get_mut::<Handled>() {
            handled.scope = Some(scope.clone());
        }
    }
}
