//! Per-route rules from the TOML file: a method and a path template
//! (`/v1/orders/{id}/capture`) with their own require-key, TTL, ignored JSON pointers,
//! stored headers and release statuses. Each rule is compiled once, at start, into the
//! [`RouteConfig`] the layer applies to the requests it matches.
//!
//! A rule holds for every spelling that an upstream framework would route to the
//! handler its template names, so that no spelling of a path skips a `require_key`:
//! the listener normalises paths first (see [`crate::path`]), and then a template
//! matches, as [`RouteMatching`] says (`--route-matching`, by default
//! `ignore-case,ignore-trailing-slash`), whatever the case of the path's letters
//! (`/V1/Charges`: Spring before 5.3's default, ASP.NET Core, most Windows servers)
//! and with or without trailing slashes (`/v1/charges/`: Express, Rails, Spring
//! before 6). `;` path parameters are never part of a segment to a template
//! (`/v1/charges;jsessionid=x` is `/v1/charges`, as Tomcat and Spring strip them).
//! A matched request is scoped by the rule's template, so every spelling it matches
//! is one endpoint: a retry in another spelling replays. The upstream still gets the
//! path as normalised, so an upstream that tells the spellings apart still does.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::{FingerprintOptions, PointerError};
use idem_tower::{GrpcReleaseCodes, ReleaseStatuses, RouteConfig};

use crate::path::{self, PathNormalization};

/// A path template: literal segments and `{name}` placeholders that match one non-empty
/// segment; a last segment `{*name}` matches the rest of the path.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PathTemplate {
    raw: String,
    segments: Vec<Segment>,
}

#[derive(Clone, PartialEq, Eq, Debug)]
enum Segment {
    Literal(String),
    Param,
    Rest,
}

/// A template that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid path template {template:?}: {reason}")]
pub(crate) struct TemplateError {
    template: String,
    reason: &'static str,
}

/// How a path template matches a normalised path (`--route-matching`): by default in
/// any case of ASCII letters and with or without a trailing slash; `exact` for
/// neither. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteMatching {
    ignore_case: bool,
    ignore_trailing_slash: bool,
}

impl RouteMatching {
    /// Templates match paths byte for byte (path parameters aside).
    pub(crate) const EXACT: RouteMatching = RouteMatching {
        ignore_case: false,
        ignore_trailing_slash: false,
    };

    /// The options a list names: `ignore-case`, `ignore-trailing-slash` (any case,
    /// repeats ignored, blank items skipped), or `exact` alone.
    pub(crate) fn from_items<I, S>(items: I) -> Result<RouteMatching, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut matching = RouteMatching::EXACT;
        let (mut exact, mut any) = (false, false);
        for item in items {
            let item = item.as_ref().trim();
            if item.is_empty() {
                continue;
            }
            any = true;
            match item.to_ascii_lowercase().as_str() {
                "exact" => exact = true,
                "ignore-case" => matching.ignore_case = true,
                "ignore-trailing-slash" => matching.ignore_trailing_slash = true,
                _ => {
                    return Err(format!(
                        "{item:?} is not a matching option (give a list of ignore-case, \
                         ignore-trailing-slash, or exact)"
                    ));
                }
            }
        }
        if !any {
            return Err(
                "the list is empty; give ignore-case,ignore-trailing-slash (the \
                        default), or exact"
                    .into(),
            );
        }
        if exact && matching != RouteMatching::EXACT {
            return Err("exact cannot be given with other items".into());
        }
        Ok(matching)
    }
}

impl Default for RouteMatching {
    /// `ignore-case,ignore-trailing-slash`.
    fn default() -> Self {
        RouteMatching {
            ignore_case: true,
            ignore_trailing_slash: true,
        }
    }
}

impl FromStr for RouteMatching {
    type Err = String;

    /// A comma-separated list, as `--route-matching` takes it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RouteMatching::from_items(s.split(','))
    }
}

impl fmt::Display for RouteMatching {
    /// The list as `--route-matching` takes it, or `exact`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ignore_case, self.ignore_trailing_slash) {
            (true, true) => f.write_str("ignore-case,ignore-trailing-slash"),
            (true, false) => f.write_str("ignore-case"),
            (false, true) => f.write_str("ignore-trailing-slash"),
            (false, false) => f.write_str("exact"),
        }
    }
}

/// A segment's name: what comes before its `;` path parameters.
fn segment_name(segment: &str) -> &str {
    segment.split_once(';').map_or(segment, |(name, _)| name)
}

impl PathTemplate {
    /// Parses a template; it must start with `/`.
    pub(crate) fn parse(template: &str) -> Result<PathTemplate, TemplateError> {
        let err = |reason| TemplateError {
            template: template.to_owned(),
            reason,
        };
        let Some(rest) = template.strip_prefix('/') else {
            return Err(err("a template starts with '/'"));
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let mut segments = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let seg = if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                if let Some(rest_name) = name.strip_prefix('*') {
                    if i + 1 != parts.len() {
                        return Err(err("{*name} may only be the last segment"));
                    }
                    if rest_name.is_empty() {
                        return Err(err("a placeholder needs a name"));
                    }
                    Segment::Rest
                } else if name.is_empty() {
                    return Err(err("a placeholder needs a name"));
                } else {
                    Segment::Param
                }
            } else if part.contains(['{', '}']) {
                return Err(err("a placeholder must fill a whole segment"));
            } else if part.contains(';') {
                return Err(err(
                    "';' starts path parameters, which matching leaves out of a segment",
                ));
            } else {
                Segment::Literal((*part).to_owned())
            };
            segments.push(seg);
        }
        Ok(PathTemplate {
            raw: template.to_owned(),
            segments,
        })
    }

    /// Whether `path` (without query) matches as `matching` says; `;` path parameters
    /// are left out of every segment.
    pub(crate) fn matches_as(&self, path: &str, matching: RouteMatching) -> bool {
        let Some(mut rest) = path.strip_prefix('/') else {
            return false;
        };
        if matching.ignore_trailing_slash {
            rest = rest.trim_end_matches('/');
        }
        let mut parts = rest.split('/').map(segment_name);
        for seg in &self.segments {
            match seg {
                Segment::Rest => return true,
                Segment::Literal(lit) => match parts.next() {
                    Some(p)
                        if p == lit || (matching.ignore_case && p.eq_ignore_ascii_case(lit)) => {}
                    _ => return false,
                },
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }

    /// The spelling of `path` (which matches as `matching` says) that the template
    /// names: its literal segments as the template spells them, placeholders' segments
    /// without their `;` path parameters, no trailing slash added; `None` when that is
    /// `path` itself. A request's fingerprint covers it, so that a retry in another
    /// spelling of the same resource replays.
    pub(crate) fn canonical(&self, path: &str, matching: RouteMatching) -> Option<String> {
        let mut rest = path.strip_prefix('/')?;
        if matching.ignore_trailing_slash {
            rest = rest.trim_end_matches('/');
        }
        let mut canonical = String::with_capacity(path.len());
        let mut parts = rest.split('/');
        for seg in &self.segments {
            match seg {
                Segment::Rest => {
                    // The rest of the path as it came, after the matched segments.
                    let tail: Vec<&str> = parts.by_ref().collect();
                    canonical.push('/');
                    canonical.push_str(&tail.join("/"));
                    break;
                }
                Segment::Literal(literal) => {
                    parts.next()?;
                    canonical.push('/');
                    canonical.push_str(literal);
                }
                Segment::Param => {
                    canonical.push('/');
                    canonical.push_str(segment_name(parts.next()?));
                }
            }
        }
        (canonical != path).then_some(canonical)
    }

    /// The template as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether paths normalised as `options` say can match this template: its literal
    /// segments must be spelt as normalised paths are (`/v1/charges`, not
    /// `/v1/%63harges`, `/v1//charges` or, under `lowercase`, `/V1/Charges`), since
    /// the listener normalises every path before a rule sees it. The error says why,
    /// and how to write it.
    pub(crate) fn check_normal(&self, options: PathNormalization) -> Result<(), String> {
        // Each placeholder stands for a segment that is normal whatever the options, and
        // that no normalisation changes, so that it can be put back afterwards.
        let parts: Vec<&str> = self.raw[1..].split('/').collect();
        let sentinel = |n: usize| format!("idem-placeholder-{n}-");
        let sample: Vec<String> = self
            .segments
            .iter()
            .enumerate()
            .map(|(n, segment)| match segment {
                Segment::Literal(literal) => literal.clone(),
                Segment::Param | Segment::Rest => sentinel(n),
            })
            .collect();
        let sample = format!("/{}", sample.join("/"));
        let mut written = match path::normalize(&sample, options) {
            Ok(normal) if normal == sample => return Ok(()),
            Ok(normal) => normal.into_owned(),
            Err(e) => return Err(format!("never matches a normalised path: {e}")),
        };
        for (n, segment) in self.segments.iter().enumerate() {
            if !matches!(segment, Segment::Literal(_)) {
                written = written.replace(&sentinel(n), parts[n]);
            }
        }
        Err(format!(
            "never matches, since paths are normalised ({options}) before rules see them; \
             write it {written}"
        ))
    }
}

impl fmt::Debug for PathTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PathTemplate").field(&self.raw).finish()
    }
}

/// One `[[route]]` rule, checked.
#[derive(Debug, Clone)]
pub struct Route {
    /// The method it applies to; `None` for any.
    pub(crate) method: Option<Method>,
    /// The path template; it becomes the scope's endpoint (`POST /v1/orders/{id}`).
    pub(crate) template: PathTemplate,
    /// Overrides `--require-key` on this route.
    pub(crate) require_key: Option<bool>,
    /// Overrides `--require-tenant` on this route (`false`: the tenant is optional).
    pub(crate) require_tenant: Option<bool>,
    /// Overrides `--tenant-from` on this route: where its keyed requests' tenant
    /// comes from, in order.
    pub(crate) tenant_from: Option<Vec<crate::tenant_source::TenantSource>>,
    /// The headers the key may come in on this route, in order; empty for the
    /// layer's `Idempotency-Key`.
    pub(crate) key_headers: Vec<HeaderName>,
    /// The JSON pointer into the body the key may come in on this route, after the
    /// key headers ([`RouteConfig::key_pointer`]).
    pub(crate) key_pointer: Option<String>,
    /// Overrides `--ttl` on this route.
    pub(crate) ttl: Option<Duration>,
    /// Overrides `--tombstone-ttl` on this route ([`RouteConfig::tombstone_ttl`]).
    pub(crate) tombstone_ttl: Option<Duration>,
    /// JSON pointers left out of the fingerprint (a client timestamp, say).
    pub(crate) ignore: Vec<String>,
    /// Response headers stored and replayed on this route, besides the default
    /// allow-list.
    pub(crate) store_headers: Vec<HeaderName>,
    /// Overrides `--release-statuses` on this route.
    pub(crate) release_statuses: Option<ReleaseStatuses>,
    /// Overrides `--grpc-release-codes` on this route.
    pub(crate) grpc_release_codes: Option<GrpcReleaseCodes>,
    /// Whether replays and conflicts carry retry hints on this route
    /// ([`RouteConfig::retry_hints`]); `None` leaves them off.
    pub(crate) retry_hints: Option<bool>,
    /// Overrides `--profile` on this route ([`RouteConfig::profile`]).
    pub(crate) profile: Option<idem_tower::Profile>,
    /// Overrides `--retention-header` on this route ([`RouteConfig::retention_header`]).
    pub(crate) retention_header: Option<idem_tower::HeaderChoice>,
    /// How its template matches paths (`--route-matching`).
    pub(crate) matching: RouteMatching,
    /// How long a duplicate of an in-progress request waits on this route without
    /// `Prefer: wait` ([`RouteConfig::conflict_wait`]); `None`: no wait.
    pub(crate) conflict_wait: Option<Duration>,
    /// Under the `mcp` profile, the JSON-RPC methods keyed (`None`: `tools/call`).
    pub(crate) rpc_methods: Option<Vec<String>>,
    fingerprint: FingerprintOptions,
    /// What the layer applies to a request that matches, made from the fields above.
    compiled: RouteConfig,
}

impl Route {
    /// A rule; fails when an ignored pointer is not of RFC 6901's form.
    pub(crate) fn new(
        method: Option<Method>,
        template: PathTemplate,
        require_key: Option<bool>,
        ttl: Option<Duration>,
        ignore: Vec<String>,
        store_headers: Vec<HeaderName>,
        release_statuses: Option<ReleaseStatuses>,
    ) -> Result<Route, PointerError> {
        let mut fingerprint = FingerprintOptions::default();
        for p in &ignore {
            fingerprint = fingerprint.ignore_pointer(p)?;
        }
        let mut compiled = RouteConfig::new()
            .endpoint(template.as_str())
            .store_headers(store_headers.iter().cloned());
        if let Some(required) = require_key {
            compiled = compiled.require_key(required);
        }
        if let Some(ttl) = ttl {
            compiled = compiled.ttl(ttl);
        }
        if let Some(statuses) = &release_statuses {
            compiled = compiled.release_statuses(statuses.clone());
        }
        if fingerprint.ignores_anything() {
            compiled = compiled.fingerprint_options(fingerprint.clone());
        }
        Ok(Route {
            method,
            template,
            require_key,
            ttl,
            ignore,
            store_headers,
            release_statuses,
            grpc_release_codes: None,
            require_tenant: None,
            tenant_from: None,
            key_headers: Vec::new(),
            key_pointer: None,
            tombstone_ttl: None,
            retry_hints: None,
            profile: None,
            retention_header: None,
            conflict_wait: None,
            rpc_methods: None,
            matching: RouteMatching::default(),
            fingerprint,
            compiled,
        })
    }

    /// This route with `codes` as the gRPC statuses that release a gRPC call's key.
    pub(crate) fn with_grpc_release_codes(mut self, codes: GrpcReleaseCodes) -> Route {
        self.compiled = self.compiled.grpc_release_codes(codes.clone());
        self.grpc_release_codes = Some(codes);
        self
    }

    /// This rule, its ignored pointers shown as `written` (an `mcp` route's name
    /// members of a tool call's arguments, and are compiled under `/arguments`).
    pub(crate) fn ignore_as_written(mut self, written: Vec<String>) -> Route {
        self.ignore = written;
        self
    }

    /// This rule, keying the JSON-RPC methods `methods` under the `mcp` profile
    /// ([`RouteConfig::rpc_methods`]; `None`: `tools/call`).
    pub(crate) fn rpc_methods(mut self, methods: Option<Vec<String>>) -> Route {
        if let Some(methods) = &methods {
            self.compiled = self
                .compiled
                .rpc_methods(methods.iter().map(String::as_str));
        }
        self.rpc_methods = methods;
        self
    }

    /// This rule, taking the key from `names`, in order (empty: the layer's header).
    pub(crate) fn key_headers(mut self, names: Vec<HeaderName>) -> Route {
        if !names.is_empty() {
            self.compiled = self.compiled.key_headers(names.iter().cloned());
        }
        self.key_headers = names;
        self
    }

    /// This rule, taking the key from the JSON pointer `pointer` into the body when no
    /// key header carries one ([`RouteConfig::key_pointer`]); fails when the pointer is
    /// not of RFC 6901's form.
    pub(crate) fn key_pointer(mut self, pointer: Option<String>) -> Result<Route, PointerError> {
        if let Some(pointer) = &pointer {
            self.compiled = self.compiled.key_pointer(pointer)?;
        }
        self.key_pointer = pointer;
        Ok(self)
    }

    /// This rule, requiring a tenant or not as `required` says (`None`: the layer's).
    pub(crate) fn require_tenant(mut self, required: Option<bool>) -> Route {
        self.require_tenant = required;
        if let Some(required) = required {
            self.compiled = self.compiled.require_tenant(required);
        }
        self
    }

    /// This rule, naming its keyed requests' tenant from `sources` (`None`: the
    /// gateway's `--tenant-from`). The layer gets them once the gateway has made them
    /// ([`with_tenant_sources`](Self::with_tenant_sources)).
    pub(crate) fn tenant_from(
        mut self,
        sources: Option<Vec<crate::tenant_source::TenantSource>>,
    ) -> Route {
        self.tenant_from = sources;
        self
    }

    /// This rule, with the sources its `tenant_from` names made (a verifier holding
    /// its key set) for the layer.
    pub(crate) fn with_tenant_sources(mut self, sources: idem_tower::TenantSources) -> Route {
        self.compiled = self.compiled.tenant_sources(sources);
        self
    }

    /// This rule, matching paths as `matching` says.
    pub(crate) fn matching(mut self, matching: RouteMatching) -> Route {
        self.matching = matching;
        self
    }

    /// This rule, with retry hints on or off as `hints` says (`None`: the layer's).
    pub(crate) fn retry_hints(mut self, hints: Option<bool>) -> Route {
        self.retry_hints = hints;
        if let Some(hints) = hints {
            self.compiled = self.compiled.retry_hints(hints);
        }
        self
    }

    /// This rule, comparing JSON bodies by their RFC 8785 (JCS) form when `jcs` says so
    /// ([`FingerprintOptions::jcs`]).
    pub(crate) fn jcs(mut self, jcs: bool) -> Route {
        if jcs {
            self.fingerprint = self.fingerprint.jcs();
            self.compiled = self.compiled.fingerprint_options(self.fingerprint.clone());
        }
        self
    }

    /// Whether this rule compares JSON bodies by their JCS form.
    pub(crate) fn is_jcs(&self) -> bool {
        self.fingerprint.is_jcs()
    }

    /// This rule, answering in `profile`'s dialect (`None`: the layer's).
    pub(crate) fn profile(mut self, profile: Option<idem_tower::Profile>) -> Route {
        self.profile = profile;
        if let Some(profile) = profile {
            self.compiled = self.compiled.profile(profile);
        }
        self
    }

    /// This rule, publishing its records' lifetime as `choice` says (`None`: the
    /// layer's).
    pub(crate) fn retention_header(mut self, choice: Option<idem_tower::HeaderChoice>) -> Route {
        if let Some(choice) = &choice {
            self.compiled = self.compiled.retention_header(choice.clone());
        }
        self.retention_header = choice;
        self
    }

    /// This rule, with duplicates of an in-progress request waiting up to `wait` for
    /// its answer when they send no `Prefer: wait` (`None`: the layer's, no wait).
    pub(crate) fn conflict_wait(mut self, wait: Option<Duration>) -> Route {
        self.conflict_wait = wait;
        if let Some(wait) = wait {
            self.compiled = self.compiled.conflict_wait(wait);
        }
        self
    }

    /// This rule, with tombstones of `tombstone` after its records' TTL (`None`: the
    /// layer's, `--tombstone-ttl`).
    pub(crate) fn tombstone_ttl(mut self, tombstone: Option<Duration>) -> Route {
        self.tombstone_ttl = tombstone;
        if let Some(tombstone) = tombstone {
            self.compiled = self.compiled.tombstone_ttl(tombstone);
        }
        self
    }

    /// Whether the rule applies to a request: its method ignoring ASCII case (SPEC S14:
    /// `post` is `POST` to most upstream frameworks), and its path, normalised by the
    /// listener before any rule sees it, matched as [`Route::matching`] says.
    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        self.method
            .as_ref()
            .is_none_or(|m| m.as_str().eq_ignore_ascii_case(method.as_str()))
            && self.template.matches_as(path, self.matching)
    }

    /// The overrides the layer applies to a request for `path`, which this rule
    /// matches: the rule's own, with the template's spelling of `path` as what the
    /// fingerprint covers when the request spelt it otherwise (see
    /// [`PathTemplate::canonical`]).
    pub(crate) fn config_for(&self, path: &str) -> RouteConfig {
        match self.template.canonical(path, self.matching) {
            Some(canonical) => self.compiled.clone().fingerprint_path(canonical),
            None => self.compiled.clone(),
        }
    }
}

/// The first rule that matches, in file order.
pub(crate) fn find<'a>(routes: &'a [Route], method: &Method, path: &str) -> Option<&'a Route> {
    routes.iter().find(|r| r.matches(method, path))
}

#[cfg(test)]
mod tests;
