//! A record reserved under a layer's earlier fingerprint rules (before a reloaded
//! configuration took over, see [`IdempotencyLayer::take_over_from`]): on a mismatch,
//! the retry is fingerprinted again by the rules in force when the record was created,
//! so that a reload never turns a replay into a 422.
//!
//! [`IdempotencyLayer::take_over_from`]: crate::IdempotencyLayer::take_over_from

use http::Method;
use http::request::Parts;
use idem_core::{Reservation, ReserveRequest, Store};

use crate::config::Config;
use crate::observer::timed;

/// What to answer a request whose reserve found a record with another fingerprint:
/// `None` when no earlier rules apply (the mismatch stands), else the reservation made
/// again with the fingerprint the record's own rules give this request, which then
/// stands for it in `request`. Only a record created before those rules were replaced
/// is compared by them, and only when they give this request the record's fingerprint.
pub(crate) async fn reserve_again<St: Store + ?Sized>(
    store: &St,
    config: &Config,
    method: &Method,
    parts: &Parts,
    body: &[u8],
    request: &mut ReserveRequest,
) -> Option<idem_core::Result<Reservation>> {
    let record = match store.get(&request.scope).await {
        Ok(Some(record)) => record,
        Ok(None) | Err(_) => return None,
    };
    // Newest first: the rules replaced last that the record predates.
    let rules = config
        .earlier
        .iter()
        .filter(|e| record.created_at < e.until)
        .find_map(|e| {
            let route = e.route_config.as_ref().and_then(|f| f(method, parts));
            let options = route
                .as_ref()
                .and_then(|r| r.fingerprint.as_ref())
                .unwrap_or(&e.fingerprint);
            let path = route.as_ref().and_then(|r| r.fingerprint_path.as_deref());
            // A body refused for a repeated member, or unreadable, never gets this far;
            // under earlier rules that read its fields, it matches nothing.
            let fingerprint = crate::fingerprint::fingerprint(
                parts,
                method.as_str(),
                path,
                body,
                config.body_limit,
                options,
            )
            .ok()?;
            (fingerprint == record.fingerprint).then_some(fingerprint)
        })?;
    request.fingerprint = rules;
    Some(timed(&*config.observer, "reserve", store.reserve(request)).await)
}
