//! The retry hints some SDKs obey instead of the status (Stripe's and Stainless's):
//! whether a retry of the same request can get another answer.

use http::{HeaderName, HeaderValue, Response};

/// The retry hint the Stripe SDKs obey, on routes with retry hints.
pub const STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");

/// The retry hint the SDKs Stainless generates obey, on routes with retry hints.
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// Says in both retry-hint headers whether a retry can get another answer.
pub(crate) fn hint<B>(response: &mut Response<B>, retry: bool) {
    let value = HeaderValue::from_static(if retry { "true" } else { "false" });
    let headers = response.headers_mut();
    headers.insert(STRIPE_SHOULD_RETRY, value.clone());
    headers.insert(X_SHOULD_RETRY, value);
}
