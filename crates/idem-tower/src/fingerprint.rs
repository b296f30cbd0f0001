//! A keyed request's fingerprint (SPEC S4), as the layer computes it: when it reads
//! the body, and again by earlier rules on a mismatch (see `earlier.rs`).

use http::header;
use http::request::Parts;
use idem_core::{Fingerprint, FingerprintOptions, RefusedJson};

/// The request's fingerprint (SPEC S4) over `METHOD request-target`, `method` being
/// the one the request is decided on (a method-override header's, where it must be;
/// see [`Endpoint::method`](idem_core::Endpoint::method)): the concrete path
/// and query, so that a key reused on `/orders/2/capture` is a mismatch, never order 1's
/// replay. The method is upper-cased, as in the endpoint, so that `post` after `POST`
/// replays rather than being a 422 (SPEC S14); `path`, when a route gives one
/// ([`RouteConfig::fingerprint_path`](crate::RouteConfig::fingerprint_path)), stands
/// for the request's path. A compressed body is fingerprinted by its content, up to
/// `limit` bytes of it (see [`coding`](crate::coding)).
///
/// A JSON body that names a member twice in one object is `Err`: the layer refuses
/// it, since the upstream's parser may read another member than the fingerprint did;
/// so is one the layer cannot read where `options` read its fields (see
/// [`Fingerprint::compute_checked`], which finds both in the same parse).
pub(crate) fn fingerprint(
    parts: &Parts,
    method: &str,
    path: Option<&str>,
    body: &[u8],
    limit: usize,
    options: &FingerprintOptions,
) -> Result<Fingerprint, RefusedJson> {
    let request_target = request_target(parts, method, path);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let content = crate::coding::decoded(&parts.headers, body, limit);
    let body = content.as_deref().unwrap_or(body);
    let method = &request_target[..method.len()];
    Fingerprint::compute_checked(method, &request_target, content_type, body, options)
}

/// A JSON-RPC call's fingerprint (SPEC S24): over `METHOD request-target` as
/// [`fingerprint`] has it, and the call's `document` (its method, tool name and
/// arguments, JSON normalised) in place of the body.
pub(crate) fn call_fingerprint(
    parts: &Parts,
    method: &str,
    path: Option<&str>,
    document: &[u8],
    options: &FingerprintOptions,
) -> Result<Fingerprint, RefusedJson> {
    let request_target = request_target(parts, method, path);
    let method = &request_target[..method.len()];
    let json = Some("application/json");
    Fingerprint::compute_checked(method, &request_target, json, document, options)
}

/// `METHOD path?query`, the method upper-cased, `path` standing for the request's.
fn request_target(parts: &Parts, method: &str, path: Option<&str>) -> String {
    let path = path.unwrap_or_else(|| parts.uri.path());
    let query = parts.uri.query();
    let mut request_target =
        String::with_capacity(method.len() + 2 + path.len() + query.map_or(0, str::len));
    request_target.push_str(method);
    request_target.make_ascii_uppercase();
    request_target.push(' ');
    request_target.push_str(path);
    if let Some(query) = query {
        request_target.push('?');
        request_target.push_str(query);
    }
    request_target
}
