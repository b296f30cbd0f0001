//! `[[route]]` rules, checked and compiled for the layer.

use http::HeaderName;

use super::ServeArgs;
use super::error::{ConfigError, invalid};
use super::jwt;
use super::rules::RouteRule;
use super::values::{
    check_release_statuses, parse_grpc_release_codes, parse_key_headers, parse_methods,
};
use crate::path::PathNormalization;
use crate::route::{PathTemplate, Route, RouteMatching};

/// The `[[route]]` rules, checked and compiled for requests whose paths are normalised
/// as `path_normalization` says, to match them as `route_matching` says.
pub(super) fn resolve(a: &ServeArgs) -> Result<Vec<Route>, ConfigError> {
    let paths = super::resolve::path_normalization(a)?;
    let matching = super::resolve::route_matching(a)?;
    let rules = a.route.iter().cloned().enumerate();
    rules
        .map(|(i, rule)| compile_route(i, rule, paths, matching, a.profile))
        .collect()
}

/// The `i`th `[[route]]` rule, checked and compiled for requests whose paths are
/// normalised as `paths` says, to match them as `matching` says, `profile` being the
/// global one.
fn compile_route(
    i: usize,
    rule: RouteRule,
    paths: PathNormalization,
    matching: RouteMatching,
    profile: Option<idem_core::Profile>,
) -> Result<Route, ConfigError> {
    let name = rule.name(i);
    let method = match rule.method.as_deref().map(str::trim) {
        None | Some("*") | Some("") => None,
        Some(m) => Some(parse_methods(&[m.to_owned()], &name)?.remove(0)),
    };
    let template = PathTemplate::parse(&rule.path).map_err(|e| invalid(&name, e))?;
    // Rules see normalised paths only: a template in another spelling would never
    // match, and its require_key would silently hold nowhere.
    template
        .check_normal(paths)
        .map_err(|e| invalid(&name, e))?;
    if rule.ttl.is_some_and(|t| t.is_zero()) {
        return Err(invalid(&name, "ttl must be longer than zero"));
    }
    let store_headers = rule
        .store_headers
        .iter()
        .map(|h| {
            HeaderName::try_from(h.as_str()).map_err(|e| invalid(&name, format!("{h:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let release_statuses = rule
        .release_statuses
        .map(|codes| check_release_statuses(codes, &format!("{name} release_statuses")))
        .transpose()?;
    let grpc_release_codes = rule
        .grpc_release_codes
        .map(|codes| parse_grpc_release_codes(&codes, &format!("{name} grpc_release_codes")))
        .transpose()?;
    let key_headers = match &rule.key_header {
        Some(list) => parse_key_headers(list).map_err(|e| invalid(&name, e))?,
        None => Vec::new(),
    };
    let tenant_from = match &rule.tenant_from {
        Some(list) => Some(jwt::parse_tenant_from(Some(list)).map_err(|e| invalid(&name, e))?),
        None => None,
    };
    let jcs = match rule.canonical_json.as_deref().map(str::trim) {
        None | Some("idem") => false,
        Some("jcs") => true,
        Some(other) => {
            return Err(invalid(
                &name,
                format!("canonical_json {other:?} is neither \"idem\" nor \"jcs\""),
            ));
        }
    };
    let retention = match rule.retention_header.as_deref() {
        Some(given) => Some(super::publish::choice(
            Some(given),
            &format!("{name} retention_header"),
        )?),
        None => None,
    };
    // A tool call's fingerprint covers its method, name and arguments (SPEC S24): its
    // ignored pointers name members of the arguments.
    let mcp = rule.profile.or(profile) == Some(idem_core::Profile::Mcp);
    let compiled_ignore = match mcp {
        true => rule
            .ignore
            .iter()
            .map(|p| format!("/arguments{p}"))
            .collect(),
        false => rule.ignore.clone(),
    };
    if rule.rpc_methods.is_some() && !mcp {
        return Err(invalid(
            &name,
            "rpc_methods applies to routes of the mcp profile only",
        ));
    }
    let route = Route::new(
        method,
        template,
        rule.require_key,
        rule.ttl,
        compiled_ignore,
        store_headers,
        release_statuses,
    )
    .map(|route| {
        route
            .retry_hints(rule.retry_hints)
            .profile(rule.profile)
            .retention_header(retention)
            .jcs(jcs)
            .require_tenant(rule.require_tenant)
            .tenant_from(tenant_from)
            .key_headers(key_headers)
            .conflict_wait(rule.conflict_wait)
            .tombstone_ttl(rule.tombstone_ttl)
            .rpc_methods(rule.rpc_methods)
            .ignore_as_written(rule.ignore)
            .matching(matching)
    })
    .and_then(|route| route.key_pointer(rule.key_pointer))
    .map_err(|e| invalid(&name, e))?;
    Ok(match grpc_release_codes {
        Some(codes) => route.with_grpc_release_codes(codes),
        None => route,
    })
}
