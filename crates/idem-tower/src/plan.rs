//! Stage 0 of a request: whether it is keyed, and what a keyed one will be reserved
//! and recorded as (SPEC S2, S3, S5, S14), decided from its head alone.

use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, HeaderValue, Method};
use idem_core::{Endpoint, FingerprintOptions, Key, Tenant};

use crate::Profile;
use crate::config::{Config, ReleaseStatuses, RouteConfig};
use crate::grpc::{GrpcReleaseCodes, is_grpc};
use crate::look_alike::look_alike;
use crate::mcp::{META_KEY_POINTER, PendingCall};
use crate::method_override::{decided_method, same_method};
use crate::problem::{Problem, ProblemKind};
use crate::wait::{Wait, preferred_wait};

/// What becomes of a request, decided from its head.
pub(crate) enum Admission {
    /// Not keyed (method, route, or no key where none is required): to the inner
    /// service untouched.
    PassThrough,
    /// Answered with a problem, in the route's profile, before anything is reserved or
    /// forwarded.
    Reject(Problem, Profile),
    /// Keyed, to be reserved and recorded as the plan says (boxed: a plan is some
    /// hundreds of bytes, a refusal a few dozen).
    Keyed(Box<Plan>),
}

/// Decides what becomes of the request with head `parts`, on the method the upstream
/// will act on (SPEC S14): a method-override header's, where it must be. The request
/// is forwarded as sent; the decided method is what the route hook, the key
/// requirement, the endpoint and the fingerprint see.
pub(crate) fn admit(config: &Config, parts: &Parts) -> Admission {
    let method = match decided_method(
        &config.keyed_methods,
        &config.method_override_headers,
        parts,
    ) {
        Ok(None) => parts.method.clone(),
        Ok(Some(method)) => method,
        Err(detail) => {
            let detail = format!("{detail}; nothing was reserved or forwarded");
            let problem = Problem::new(ProblemKind::InvalidMethodOverride, detail);
            return Admission::Reject(problem, config.profile);
        }
    };

    let route = config
        .route_config
        .as_ref()
        .and_then(|f| f(&method, parts))
        .unwrap_or_default();
    let keyed = route
        .keyed
        .unwrap_or_else(|| config.keyed_methods.iter().any(|m| same_method(m, &method)));
    if !keyed {
        return Admission::PassThrough;
    }
    let profile = route.profile.unwrap_or(config.profile);
    let key_headers = route
        .key_headers
        .as_deref()
        .unwrap_or(std::slice::from_ref(&config.header_name));
    if profile == Profile::Mcp {
        let key_headers = key_headers.to_vec();
        return admit_call(config, route, parts, &method, &key_headers);
    }
    if let Some(refusal) = ambiguous_header(config, parts, key_headers) {
        return Admission::Reject(refusal, profile);
    }

    let pointer = route.key_pointer.as_deref();
    let found = key_from(&parts.headers, key_headers);
    let quoted = match &found {
        Ok(Some((_, field))) => Some(crate::publish::is_quoted(field)),
        _ => None,
    };
    let mut key = match found.map(|found| found.map(|(key, _)| key)) {
        // The body may carry a key too, which must be the same.
        Ok(Some(key)) if let Some(pointer) = &route.key_pointer => {
            PlanKey::Pending(Box::new(PendingKey {
                header_key: Some(key),
                pointer: pointer.clone(),
                missing: None,
                refusal: None,
            }))
        }
        Ok(Some(key)) => PlanKey::Known(key),
        Ok(None) => {
            let required = route
                .require_key
                .unwrap_or_else(|| (config.require_key)(&method, parts));
            let missing = required.then(|| missing_key(&method, parts, key_headers, pointer));
            match (&route.key_pointer, missing) {
                // Decided once the body is read.
                (Some(pointer), missing) => PlanKey::Pending(Box::new(PendingKey {
                    header_key: None,
                    pointer: pointer.clone(),
                    missing,
                    refusal: None,
                })),
                (None, None) => return Admission::PassThrough,
                (None, Some(missing)) => return Admission::Reject(missing, profile),
            }
        }
        Err(detail) => {
            return Admission::Reject(Problem::new(ProblemKind::InvalidKey, detail), profile);
        }
    };

    // A caller's extractor names the tenant now; the headers are hashed once the
    // key they are hashed under is in hand (it may have to come from the store).
    let tenant = config.tenant_from.as_ref().map(|f| f(parts));
    if let Some(refusal) = missing_tenant(config, &route, &method, parts, tenant.as_ref()) {
        match &mut key {
            // Refused only if the body turns out to carry a key.
            PlanKey::Pending(pending) => pending.refusal = Some(refusal),
            PlanKey::Known(_) => return Admission::Reject(refusal, profile),
            PlanKey::Call(call) => call.refusal = Some(refusal),
        }
    }
    let mut plan = Box::new(Plan::new(config, route, parts, &method, key, tenant));
    plan.quoted = quoted;
    Admission::Keyed(plan)
}

/// A request on a route of the `mcp` profile (SPEC S24): whether it is keyed, and by
/// what key, is its body's to say, so every refusal waits for the body too (a call that
/// is not keyed passes, whatever its headers carry).
fn admit_call(
    config: &Config,
    route: RouteConfig,
    parts: &Parts,
    method: &Method,
    key_headers: &[HeaderName],
) -> Admission {
    let tenant = config.tenant_from.as_ref().map(|f| f(parts));
    let refusal = ambiguous_header(config, parts, key_headers)
        .or_else(|| missing_tenant(config, &route, method, parts, tenant.as_ref()));
    let required = route
        .require_key
        .unwrap_or_else(|| (config.require_key)(method, parts));
    let wanted = route.key_pointer.as_deref().unwrap_or(META_KEY_POINTER);
    let call = PendingCall {
        header_key: key_from(&parts.headers, key_headers).map(|found| found.map(|(key, _)| key)),
        pointer: route.key_pointer.clone(),
        methods: route
            .rpc_methods
            .clone()
            .unwrap_or_else(|| DEFAULT_METHODS.clone()),
        missing: required.then(|| missing_key(method, parts, key_headers, Some(wanted))),
        refusal,
    };
    let key = PlanKey::Call(Box::new(call));
    Admission::Keyed(Box::new(Plan::new(
        config, route, parts, method, key, tenant,
    )))
}

/// [`DEFAULT_KEYED_METHODS`](crate::mcp::DEFAULT_KEYED_METHODS), made once.
static DEFAULT_METHODS: std::sync::LazyLock<std::sync::Arc<[Box<str>]>> =
    std::sync::LazyLock::new(|| {
        crate::mcp::DEFAULT_KEYED_METHODS
            .iter()
            .map(|m| Box::from(*m))
            .collect()
    });

/// The 400 `ambiguous-header` for a request that sends one of the headers the key or
/// the tenant is read from spelt with `_` for `-` (SPEC S14).
fn ambiguous_header(config: &Config, parts: &Parts, key_headers: &[HeaderName]) -> Option<Problem> {
    let mut watched: Vec<&HeaderName> = Vec::with_capacity(4);
    watched.extend(key_headers);
    if config.tenant_from.is_none() {
        watched.extend(config.tenant_headers.names());
    }
    let (sent, meant) = look_alike(&parts.headers, &watched)?;
    let detail = format!(
        "the header {sent} is {meant} spelt with '_' for '-', which some upstream \
         servers read as {meant}; send {meant} as it is spelt; nothing was reserved \
         or forwarded"
    );
    Some(Problem::new(ProblemKind::AmbiguousHeader, detail))
}

/// The 401 `missing-tenant` for a keyed request that names no tenant where its route
/// requires one (SPEC S3): neither the caller's extractor (`tenant`), nor the tenant
/// sources, nor the tenant headers name one.
fn missing_tenant(
    config: &Config,
    route: &RouteConfig,
    method: &Method,
    parts: &Parts,
    tenant: Option<&Tenant>,
) -> Option<Problem> {
    if !route.require_tenant.unwrap_or(config.require_tenant) {
        return None;
    }
    let named = match tenant {
        Some(t) => t.as_str() != Tenant::ANONYMOUS,
        None => match route.tenant_sources.as_deref().or(config.sources.as_ref()) {
            Some(sources) => sources.applying(parts, &config.tenant_headers).is_some(),
            None => config.tenant_headers.carried_by(&parts.headers),
        },
    };
    if named {
        return None;
    }
    let wanted = match tenant {
        Some(_) => "an authenticated tenant".to_owned(),
        None => format!("one of the headers {}", config.tenant_headers.listed()),
    };
    let detail = format!(
        "{} {} is keyed, and a keyed request must name its tenant: send {wanted}; \
         nothing was reserved",
        method,
        parts.uri.path()
    );
    Some(Problem::new(ProblemKind::MissingTenant, detail))
}

/// A keyed request's key, or how to find it in its body.
pub(crate) enum PlanKey {
    /// A header carried it.
    Known(Key),
    /// It is to be found in the body, once read.
    Pending(Box<PendingKey>),
    /// A JSON-RPC call's (SPEC S24), whose body says whether it is keyed at all.
    Call(Box<PendingCall>),
}

/// The 400 `missing-key` for a request on a route that requires a key and got none.
fn missing_key(
    method: &Method,
    parts: &Parts,
    key_headers: &[HeaderName],
    pointer: Option<&str>,
) -> Problem {
    let mut wanted = match key_headers {
        [one] => format!("an {one} header"),
        many => format!(
            "one of the headers {}",
            many.iter()
                .map(HeaderName::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if let Some(pointer) = pointer {
        wanted.push_str(&format!(" or a key at {pointer} in its JSON body"));
    }
    let detail = format!(
        "{} {} requires {wanted}; generate one key per operation and send it with every \
         retry",
        method,
        parts.uri.path(),
    );
    Problem::new(ProblemKind::MissingKey, detail)
}

/// A request on a route whose key may be in its body ([`RouteConfig::key_pointer`]):
/// what becomes of it is decided once the body is read.
///
/// [`RouteConfig::key_pointer`]: crate::RouteConfig::key_pointer
pub(crate) struct PendingKey {
    /// The key a header carried, which the body must not contradict.
    pub(crate) header_key: Option<Key>,
    /// Where the key is in the body.
    pub(crate) pointer: std::sync::Arc<str>,
    /// The 400 `missing-key` when the route requires a key; without one, a body that
    /// names none passes through.
    pub(crate) missing: Option<Problem>,
    /// The answer the request gets if its body names a key (a tenant it must name and
    /// does not).
    pub(crate) refusal: Option<Problem>,
}

/// The key `headers` carry in the first of `names` present, and that header's field
/// (the key as sent, which is echoed). Several of them present must carry the same
/// key: the upstream may read any one of them, so two different keys would let the
/// layer and the upstream disagree about the operation.
fn key_from<'h>(
    headers: &'h http::HeaderMap,
    names: &[HeaderName],
) -> Result<Option<(Key, &'h HeaderValue)>, String> {
    let mut found: Option<(&HeaderName, Key, &HeaderValue)> = None;
    for name in names {
        let fields = headers.get_all(name);
        match Key::from_fields(fields.iter().map(HeaderValue::as_bytes)) {
            Ok(None) => {}
            Ok(Some(key)) => match &found {
                None => found = Some((name, key, fields.iter().next().expect("one field"))),
                Some((_, first, _)) if *first == key => {}
                Some((first, _, _)) => {
                    return Err(format!(
                        "{first} and {name} carry different keys, and the upstream may read \
                         either; send one key; nothing was reserved or forwarded"
                    ));
                }
            },
            Err(e) if names.len() == 1 => return Err(e.to_string()),
            Err(e) => return Err(format!("{name}: {e}")),
        }
    }
    Ok(found.map(|(_, key, field)| (key, field)))
}

/// What a keyed request will be reserved and recorded as. The layer's settings stay in
/// [`Config`]; a plan carries only what this request adds to them.
pub(crate) struct Plan {
    /// The tenant, when a caller's extractor named it; else the sources or the
    /// headers name it.
    pub(crate) tenant: Option<Tenant>,
    /// The route's tenant sources, which replace the layer's.
    pub(crate) sources: Option<std::sync::Arc<crate::sources::TenantSources>>,
    /// `METHOD template`, the method being the one the request is decided on (a
    /// method-override header's, where it must be), which may not be the one it is
    /// forwarded with.
    pub(crate) endpoint: Endpoint,
    /// The key, or how to find it in the body.
    pub(crate) key: PlanKey,
    /// Whether the key's header spelt it as a quoted string or bare, for a profile
    /// that echoes it as sent; `None` when no header carried it.
    pub(crate) quoted: Option<bool>,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    /// How long a tombstone outlives the completed record (SPEC S16); zero for none.
    pub(crate) tombstone: Duration,
    /// The route's fingerprint options, which replace the layer's.
    pub(crate) fingerprint: Option<FingerprintOptions>,
    /// The path the fingerprint covers in place of the request's.
    pub(crate) fingerprint_path: Option<Box<str>>,
    /// How the answer is recorded or released.
    pub(crate) answers: AnswerRules,
}

/// What a request's route says about its answer.
pub(crate) struct AnswerRules {
    /// Headers the route stores on top of the layer's allow-list.
    pub(crate) extra_headers: Vec<HeaderName>,
    /// The statuses that release the key: the route's, the layer's, or the profile's.
    pub(crate) release_statuses: ReleaseStatuses,
    /// For a gRPC call (SPEC S18), the gRPC statuses that release the key: the route's,
    /// or the layer's. `None` for any other request.
    pub(crate) grpc: Option<GrpcReleaseCodes>,
    /// Whether the layer's own answers carry `Stripe-Should-Retry`/`X-Should-Retry`.
    pub(crate) retry_hints: bool,
    /// The dialect of the layer's own answers.
    pub(crate) profile: Profile,
    /// How long a duplicate may wait for an in-progress attempt (SPEC S15).
    pub(crate) wait: Option<Wait>,
    /// Where its record's lifetime is published: the route's choice, or the layer's.
    pub(crate) retention: crate::HeaderChoice,
}

impl Plan {
    fn new(
        config: &Config,
        route: RouteConfig,
        parts: &Parts,
        method: &Method,
        key: PlanKey,
        tenant: Option<Tenant>,
    ) -> Plan {
        let template = route
            .endpoint
            .as_deref()
            .or_else(|| matched_path(parts))
            .unwrap_or_else(|| parts.uri.path());
        let grpc_call = is_grpc(&parts.headers);
        let lease = route.lease.unwrap_or(config.lease);
        let profile = route.profile.unwrap_or(config.profile);
        let is_call = matches!(key, PlanKey::Call(_));
        let grpc = grpc_call.then(|| {
            route
                .grpc_release_codes
                .unwrap_or_else(|| config.grpc_release_codes.clone())
        });
        Plan {
            tenant,
            sources: route.tenant_sources,
            endpoint: endpoint(method, template),
            key,
            quoted: None,
            ttl: route.ttl.unwrap_or(config.ttl),
            lease,
            tombstone: route.tombstone.unwrap_or(config.tombstone),
            // The key's own field never makes two attempts differ. A call's document
            // holds its params' `name` and `arguments` (see `mcp.rs`).
            fingerprint: match &route.key_pointer {
                Some(pointer) if is_call => match pointer
                    .strip_prefix("/params")
                    .filter(|p| p.starts_with("/arguments/"))
                {
                    Some(in_document) => Some(
                        route
                            .fingerprint
                            .unwrap_or_else(|| config.fingerprint.clone())
                            .ignore_pointer(in_document)
                            .expect("checked by RouteConfig::key_pointer"),
                    ),
                    None => route.fingerprint,
                },
                Some(pointer) => Some(
                    route
                        .fingerprint
                        .unwrap_or_else(|| config.fingerprint.clone())
                        .ignore_pointer(pointer)
                        .expect("checked by RouteConfig::key_pointer"),
                ),
                None => route.fingerprint,
            },
            fingerprint_path: route.fingerprint_path.map(String::into_boxed_str),
            answers: AnswerRules {
                extra_headers: route.stored_headers,
                release_statuses: route
                    .release_statuses
                    .or_else(|| config.release_statuses.clone())
                    .unwrap_or_else(|| ReleaseStatuses::of_profile(profile)),
                grpc,
                retry_hints: route.retry_hints.unwrap_or(config.retry_hints),
                profile,
                wait: Wait::new(
                    // gRPC has no `Prefer`; a route's default wait applies to it.
                    if grpc_call {
                        None
                    } else {
                        preferred_wait(&parts.headers)
                    },
                    route.conflict_wait.unwrap_or(config.conflict_wait),
                    config.max_wait,
                    lease,
                ),
                retention: route
                    .retention_header
                    .unwrap_or_else(|| config.retention_header.clone()),
            },
        }
    }
}

/// `Endpoint::new(method, template)` in one allocation instead of two.
fn endpoint(method: &Method, template: &str) -> Endpoint {
    let method = method.as_str();
    let mut raw = String::with_capacity(method.len() + 1 + template.len());
    raw.push_str(method);
    raw.make_ascii_uppercase();
    raw.push(' ');
    raw.push_str(template);
    Endpoint::from_raw(raw)
}

/// The route template axum matched, when the layer runs inside a `Router`.
fn matched_path(parts: &Parts) -> Option<&str> {
    #[cfg(feature = "axum")]
    if let Some(path) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return Some(path.as_str());
    }
    let _ = parts;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_is_built_as_idem_core_builds_it() {
        let extension = Method::from_bytes(b"charge").unwrap();
        for method in [Method::POST, Method::PATCH, extension] {
            assert_eq!(
                endpoint(&method, "/v1/orders/{id}"),
                Endpoint::new(method.as_str(), "/v1/orders/{id}"),
            );
            // The method the request was decided on comes back out of it, upper-cased.
            let built = endpoint(&method, "/v1/orders/{id}");
            assert_eq!(built.method(), method.as_str().to_ascii_uppercase());
        }
        assert_eq!(Endpoint::from_raw("POST").method(), "POST");
    }
}
