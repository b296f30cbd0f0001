//! Per-route rules from the TOML file: a method and a path template
//! (`/v1/orders/{id}/capture`) with their own require-key, TTL, ignored JSON pointers,
//! stored headers and release statuses. Each rule is compiled once, at start, into the
//! [`RouteConfig`] the layer applies to the requests it matches.

use std::fmt;
use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::{FingerprintOptions, PointerError};
use idem_tower::{GrpcReleaseCodes, ReleaseStatuses, RouteConfig};

use crate::path::{self, PathNormalization};

/// A path template: literal segments and `{name}` placeholders that match one non-empty
/// segment; a last segment `{*name}` matches the rest of the path.
#[derive(Clone, PartialEq, Eq)]
pub struct PathTemplate {
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
pub struct TemplateError {
    template: String,
    reason: &'static str,
}

impl PathTemplate {
    /// Parses a template; it must start with `/`.
    pub fn parse(template: &str) -> Result<PathTemplate, TemplateError> {
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

    /// Whether `path` (without query) matches.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = rest.split('/');
        for seg in &self.segments {
            match seg {
                Segment::Rest => return true,
                Segment::Literal(lit) => match parts.next() {
                    Some(p) if p == lit => {}
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

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether paths normalised as `options` say can match this template: its literal
    /// segments must be spelt as normalised paths are (`/v1/charges`, not
    /// `/v1/%63harges`, `/v1//charges` or, under `lowercase`, `/V1/Charges`), since
    /// the listener normalises every path before a rule sees it. The error says why,
    /// and how to write it.
    pub fn check_normal(&self, options: PathNormalization) -> Result<(), String> {
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
    pub method: Option<Method>,
    /// The path template; it becomes the scope's endpoint (`POST /v1/orders/{id}`).
    pub template: PathTemplate,
    /// Overrides `--require-key` on this route.
    pub require_key: Option<bool>,
    /// Overrides `--ttl` on this route.
    pub ttl: Option<Duration>,
    /// Overrides `--tombstone-ttl` on this route ([`RouteConfig::tombstone_ttl`]).
    pub tombstone_ttl: Option<Duration>,
    /// JSON pointers left out of the fingerprint (a client timestamp, say).
    pub ignore: Vec<String>,
    /// Response headers stored and replayed on this route, besides the default
    /// allow-list.
    pub store_headers: Vec<HeaderName>,
    /// Overrides `--release-statuses` on this route.
    pub release_statuses: Option<ReleaseStatuses>,
    /// Overrides `--grpc-release-codes` on this route.
    pub grpc_release_codes: Option<GrpcReleaseCodes>,
    /// Whether replays and conflicts carry retry hints on this route
    /// ([`RouteConfig::retry_hints`]); `None` leaves them off.
    pub retry_hints: Option<bool>,
    /// How long a duplicate of an in-progress request waits on this route without
    /// `Prefer: wait` ([`RouteConfig::conflict_wait`]); `None`: no wait.
    pub conflict_wait: Option<Duration>,
    fingerprint: FingerprintOptions,
    /// What the layer applies to a request that matches, made from the fields above.
    compiled: RouteConfig,
}

impl Route {
    /// A rule; fails when an ignored pointer is not of RFC 6901's form.
    pub fn new(
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
            tombstone_ttl: None,
            retry_hints: None,
            conflict_wait: None,
            fingerprint,
            compiled,
        })
    }

    /// This route with `codes` as the gRPC statuses that release a gRPC call's key.
    pub fn with_grpc_release_codes(mut self, codes: GrpcReleaseCodes) -> Route {
        self.compiled = self.compiled.grpc_release_codes(codes.clone());
        self.grpc_release_codes = Some(codes);
        self
    }

    /// This rule, with retry hints on or off as `hints` says (`None`: the layer's).
    pub fn retry_hints(mut self, hints: Option<bool>) -> Route {
        self.retry_hints = hints;
        if let Some(hints) = hints {
            self.compiled = self.compiled.retry_hints(hints);
        }
        self
    }

    /// This rule, with duplicates of an in-progress request waiting up to `wait` for
    /// its answer when they send no `Prefer: wait` (`None`: the layer's, no wait).
    pub fn conflict_wait(mut self, wait: Option<Duration>) -> Route {
        self.conflict_wait = wait;
        if let Some(wait) = wait {
            self.compiled = self.compiled.conflict_wait(wait);
        }
        self
    }

    /// This rule, with tombstones of `tombstone` after its records' TTL (`None`: the
    /// layer's, `--tombstone-ttl`).
    pub fn tombstone_ttl(mut self, tombstone: Option<Duration>) -> Route {
        self.tombstone_ttl = tombstone;
        if let Some(tombstone) = tombstone {
            self.compiled = self.compiled.tombstone_ttl(tombstone);
        }
        self
    }

    /// Whether the rule applies to a request: its method ignoring ASCII case (SPEC S14:
    /// `post` is `POST` to most upstream frameworks), and its path, normalised by the
    /// listener before any rule sees it.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.method
            .as_ref()
            .is_none_or(|m| m.as_str().eq_ignore_ascii_case(method.as_str()))
            && self.template.matches(path)
    }

    /// The fingerprint options with this route's ignored pointers.
    pub fn fingerprint_options(&self) -> &FingerprintOptions {
        &self.fingerprint
    }

    /// The overrides the layer applies to the requests this rule matches.
    pub fn config(&self) -> &RouteConfig {
        &self.compiled
    }
}

/// The first rule that matches, in file order.
pub fn find<'a>(routes: &'a [Route], method: &Method, path: &str) -> Option<&'a Route> {
    routes.iter().find(|r| r.matches(method, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_matches_one_segment_per_placeholder() {
        let t = PathTemplate::parse("/v1/orders/{id}/capture").unwrap();
        assert!(t.matches("/v1/orders/42/capture"));
        assert!(!t.matches("/v1/orders//capture"));
        assert!(!t.matches("/v1/orders/42/capture/extra"));
        assert!(!t.matches("/v1/orders/42"));
        assert!(!t.matches("/v1/orders/42/refund"));
    }

    #[test]
    fn rest_placeholder_matches_the_tail() {
        let t = PathTemplate::parse("/files/{*path}").unwrap();
        assert!(t.matches("/files/a/b/c"));
        assert!(t.matches("/files/"));
        assert!(!t.matches("/other/a"));
        assert!(PathTemplate::parse("/files/{*path}/x").is_err());
    }

    #[test]
    fn malformed_templates_are_rejected() {
        assert!(PathTemplate::parse("v1/orders").is_err());
        assert!(PathTemplate::parse("/v1/{}").is_err());
        assert!(PathTemplate::parse("/v1/x{id}").is_err());
    }

    #[test]
    fn first_matching_rule_wins_and_method_filters() {
        let r = |m: Option<Method>, t: &str| {
            Route::new(
                m,
                PathTemplate::parse(t).unwrap(),
                None,
                None,
                vec![],
                vec![],
                None,
            )
            .unwrap()
        };
        let routes = vec![
            r(Some(Method::POST), "/v1/orders/{id}"),
            r(None, "/v1/{*rest}"),
        ];
        assert_eq!(
            find(&routes, &Method::POST, "/v1/orders/7")
                .unwrap()
                .template
                .as_str(),
            "/v1/orders/{id}"
        );
        assert_eq!(
            find(&routes, &Method::PATCH, "/v1/orders/7")
                .unwrap()
                .template
                .as_str(),
            "/v1/{*rest}"
        );
        assert!(find(&routes, &Method::POST, "/v2/x").is_none());
    }

    /// `[[route]] method = "POST"` holds for `post` and `PoSt` too, which upstream
    /// frameworks run as `POST`: a rule cannot be sidestepped by spelling.
    #[test]
    fn rule_method_matches_in_any_case() {
        let t = PathTemplate::parse("/v1/charges").unwrap();
        let rule = Route::new(
            Some(Method::POST),
            t,
            Some(true),
            None,
            vec![],
            vec![],
            None,
        )
        .unwrap();
        for spelling in ["POST", "post", "PoSt"] {
            let method = Method::from_bytes(spelling.as_bytes()).unwrap();
            assert!(rule.matches(&method, "/v1/charges"), "{spelling}");
        }
        assert!(!rule.matches(&Method::PUT, "/v1/charges"));
        assert!(!rule.matches(&Method::from_bytes(b"posts").unwrap(), "/v1/charges"));
    }

    #[test]
    fn bad_ignored_pointer_is_rejected() {
        let t = PathTemplate::parse("/x").unwrap();
        assert!(Route::new(None, t, None, None, vec!["nope".into()], vec![], None).is_err());
    }
}
