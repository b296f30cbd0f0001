//! Every resolved setting as the configuration file spells it, for `idem check-config`:
//! what the command line, the `IDEM_*` variables, the `--config` file and the defaults
//! came to, one `name = value` line per setting and a `[[route]]` table per rule with
//! each of its fields (a route's own value, or the global one it inherits). Read back as
//! a file, it resolves to the same configuration. Secrets are never printed: a token or
//! tenant secret given inline is a comment saying it is set.

use std::fmt::Write;
use std::time::Duration;

use idem_core::Schema;
use idem_tower::{GrpcReleaseCodes, ReleaseStatuses};

use super::{GatewayConfig, ServeArgs};
use crate::route::Route;

/// A TOML string.
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

fn list<I: IntoIterator<Item = String>>(items: I) -> String {
    let items: Vec<String> = items.into_iter().collect();
    format!("[{}]", items.join(", "))
}

fn strings<I: IntoIterator<Item = S>, S: AsRef<str>>(items: I) -> String {
    list(items.into_iter().map(|s| quoted(s.as_ref())))
}

fn duration(d: Duration) -> String {
    quoted(&humantime::format_duration(d).to_string())
}

fn statuses(set: &ReleaseStatuses) -> String {
    list(set.iter().map(|s| s.as_u16().to_string()))
}

fn grpc_codes(set: &GrpcReleaseCodes) -> String {
    strings(set.iter().map(idem_tower::grpc_code_name))
}

/// The comma-separated `Display` of a setting as a TOML list (`none` is the empty list).
fn display_list(shown: &str) -> String {
    if shown == "none" {
        return "[]".to_owned();
    }
    strings(shown.split(','))
}

/// The text being written.
#[derive(Default)]
struct Toml {
    out: String,
}

impl Toml {
    /// `name = value`.
    fn set(&mut self, name: &str, value: String) {
        let _ = writeln!(self.out, "{name} = {value}");
    }

    /// A setting left unset, as a comment saying what that means.
    fn note(&mut self, name: &str, text: &str) {
        let _ = writeln!(self.out, "# {name}: {text}");
    }
}

impl GatewayConfig {
    /// The `jwt_*` settings: each set, or a note saying why not.
    fn print_jwt(&self, t: &mut Toml) {
        let Some(jwt) = &self.jwt else {
            for name in [
                "jwt_jwks_file",
                "jwt_jwks_url",
                "jwt_jwks_refresh",
                "jwt_hs256_secret_file",
                "jwt_issuer",
                "jwt_audience",
                "jwt_claims",
                "jwt_leeway",
            ] {
                t.note(name, "unused: tenant_from does not name jwt");
            }
            return;
        };
        match (&jwt.jwks_file, &jwt.jwks_url) {
            (Some(file), _) => {
                t.set("jwt_jwks_file", path(file));
                t.note("jwt_jwks_url", "none: the keys are in jwt_jwks_file");
                t.note(
                    "jwt_jwks_refresh",
                    "the file is read again on an unknown key",
                );
            }
            (None, Some(url)) => {
                t.note("jwt_jwks_file", "none: the keys are at jwt_jwks_url");
                t.set("jwt_jwks_url", quoted(url));
                t.set("jwt_jwks_refresh", duration(jwt.jwks_refresh));
            }
            (None, None) => {
                for name in ["jwt_jwks_file", "jwt_jwks_url", "jwt_jwks_refresh"] {
                    t.note(name, "none: HS256 tokens only");
                }
            }
        }
        match &jwt.hs256_secret_file {
            Some(file) => t.set("jwt_hs256_secret_file", path(file)),
            None => t.note("jwt_hs256_secret_file", "none: HS256 tokens are refused"),
        }
        match &jwt.issuer {
            Some(iss) => t.set("jwt_issuer", quoted(iss)),
            None => t.note("jwt_issuer", "any"),
        }
        if jwt.audiences.is_empty() {
            t.note("jwt_audience", "any");
        } else {
            t.set("jwt_audience", strings(&jwt.audiences));
        }
        t.set("jwt_claims", strings(&jwt.claims));
        t.set("jwt_leeway", duration(jwt.leeway));
    }
}

fn path(p: &std::path::Path) -> String {
    quoted(&p.display().to_string())
}

impl GatewayConfig {
    /// The settings as a configuration file: `args` are the layers as merged (the
    /// command line over the environment over the file), for the settings whose file
    /// is what the configuration keeps only the contents of.
    pub(crate) fn to_toml(&self, args: &ServeArgs) -> String {
        let mut t = Toml::default();
        t.set("upstream", quoted(&self.upstream.to_string()));
        t.set("listen", quoted(&self.listen.to_string()));
        t.set("store", quoted(&crate::store::redact(&self.store)));
        match self.store_options.pool {
            Some(n) => t.set("store_pool", n.to_string()),
            None => t.note("store_pool", "the store's own default"),
        }
        let namespace = self.store_options.namespace.clone().unwrap_or_default();
        t.set("store_namespace", quoted(namespace.as_str()));
        t.set(
            "migrate",
            (self.store_options.schema == Schema::Migrate).to_string(),
        );
        match self.admin {
            Some(addr) => t.set("admin", quoted(&addr.to_string())),
            None => t.note("admin", "off"),
        }
        match (&args.admin_token_file, &self.admin_token) {
            (Some(file), _) => {
                t.set("admin_token_file", path(file));
                t.note("admin_token", "in the file");
            }
            (None, Some(_)) => {
                t.note("admin_token", "set, not shown");
                t.note("admin_token_file", "none");
            }
            (None, None) => {
                t.note("admin_token", "none");
                t.note("admin_token_file", "none");
            }
        }
        t.set("require_key", self.require_key.to_string());
        t.set("profile", quoted(self.profile.as_str()));
        t.set("ttl", duration(self.ttl));
        t.set("tombstone_ttl", duration(self.tombstone_ttl));
        t.set("lease", duration(self.lease));
        t.set("max_wait", duration(self.max_wait));
        t.set("max_waiters", self.max_waiters.to_string());
        t.set("upstream_timeout", duration(self.upstream_timeout));
        t.set(
            "upstream_protocol",
            quoted(&format!("{:?}", self.upstream_protocol).to_ascii_lowercase()),
        );
        match &args.upstream_ca {
            Some(file) => t.set("upstream_ca", path(file)),
            None => t.note("upstream_ca", "the system's roots"),
        }
        t.set("body_limit", self.body_limit.to_string());
        t.set("response_limit", self.response_limit.to_string());
        t.set(
            "tenant_header",
            strings(self.tenant_headers.iter().map(|h| h.as_str())),
        );
        t.set("require_tenant", self.require_tenant.to_string());
        match (&args.tenant_secret_file, &args.tenant_secret) {
            (Some(file), _) => t.set("tenant_secret_file", path(file)),
            (None, Some(_)) => t.note(
                "tenant_secret_file",
                "the secret is set in IDEM_TENANT_SECRET, not shown",
            ),
            (None, None) => t.note("tenant_secret_file", "the store keeps the tenant secret"),
        }
        t.set(
            "tenant_from",
            strings(self.tenant_from.iter().map(|s| s.as_str())),
        );
        self.print_jwt(&mut t);
        t.set(
            "tenant_max_in_flight",
            self.tenant_max_in_flight.to_string(),
        );
        match &self.tenant_key_rate {
            Some(rate) => t.set("tenant_key_rate", quoted(&rate.to_string())),
            None => t.note("tenant_key_rate", "none: new keys are not limited"),
        }
        t.set("tenant_metrics", self.tenant_metrics.to_string());
        match &args.record_key_file {
            Some(file) => t.set("record_key_file", path(file)),
            None => t.note("record_key_file", "records are not sealed"),
        }
        t.set(
            "read_unsealed_records",
            self.read_unsealed_records.to_string(),
        );
        t.set("scope", quoted(self.scope.as_str()));
        t.set(
            "keyed_methods",
            strings(self.keyed_methods.iter().map(|m| m.as_str())),
        );
        t.set("release_statuses", statuses(&self.release_statuses));
        t.set("grpc_release_codes", grpc_codes(&self.grpc_release_codes));
        t.set(
            "path_normalization",
            display_list(&self.path_normalization.to_string()),
        );
        t.set(
            "route_matching",
            display_list(&self.route_matching.to_string()),
        );
        t.set(
            "client_timeout",
            duration(self.client_timeout.unwrap_or(Duration::ZERO)),
        );
        match self.max_connections {
            Some(n) => t.set("max_connections", n.to_string()),
            None => t.note(
                "max_connections",
                "derived from the open-file limit at start",
            ),
        }
        t.set("sweep_interval", duration(self.sweep_interval));
        t.set("shutdown_timeout", duration(self.shutdown_timeout));
        match &self.otlp_endpoint {
            // The setting is the collector's base URL, under which the path is added.
            Some(url) => {
                let base = url
                    .strip_suffix(crate::telemetry::TRACES_PATH)
                    .unwrap_or(url);
                t.set("otlp_endpoint", quoted(base));
            }
            None => t.note("otlp_endpoint", "no traces exported"),
        }
        t.set("access_log", quoted(&self.access_log.to_string()));
        t.set("request_id_header", quoted(self.request_id_header.as_str()));
        if self.trusted_proxies.is_empty() {
            t.note(
                "trusted_proxies",
                "none: the client is the connection's peer",
            );
        } else {
            let nets = self.trusted_proxies.nets().iter().map(|n| n.to_string());
            t.set("trusted_proxies", strings(nets));
        }
        if self.trusted_headers.is_empty() {
            t.note("trusted_headers", "none");
        } else {
            let names = self.trusted_headers.iter().map(|h| h.as_str());
            t.set("trusted_headers", strings(names));
        }
        let h2 = &self.http2;
        t.set(
            "http2_max_concurrent_streams",
            h2.max_concurrent_streams.to_string(),
        );
        t.set(
            "http2_max_header_list_size",
            h2.max_header_list_size.to_string(),
        );
        t.set(
            "http2_keepalive_interval",
            duration(h2.keepalive_interval.unwrap_or(Duration::ZERO)),
        );
        t.set("http2_keepalive_timeout", duration(h2.keepalive_timeout));
        t.set("http2_answer_budget", h2.answer_budget.to_string());
        match self.tls.as_ref().and_then(|f| f.client_ca.as_ref()) {
            Some(ca) => t.set("tls_client_ca", path(ca)),
            None => t.note("tls_client_ca", "no client certificates are asked for"),
        }
        t.set("tenant_cert_name", quoted(self.tenant_cert_name.as_str()));
        for (prefix, files) in [("", &self.tls), ("admin_", &self.admin_tls)] {
            match files {
                Some(files) => {
                    t.set(&format!("{prefix}tls_cert"), path(&files.cert));
                    t.set(&format!("{prefix}tls_key"), path(&files.key));
                }
                None => {
                    t.note(&format!("{prefix}tls_cert"), "plain TCP");
                    t.note(&format!("{prefix}tls_key"), "plain TCP");
                }
            }
        }
        for route in &self.routes {
            t.out.push('\n');
            t.out.push_str(&self.route_toml(route));
        }
        for tenant in &self.tenant_overrides {
            t.out.push('\n');
            t.out.push_str(&tenant_toml(tenant));
        }
        t.out
    }

    /// One `[[route]]` table, each field the route's own or the global one it
    /// inherits.
    fn route_toml(&self, r: &Route) -> String {
        let mut t = Toml {
            out: String::from("[[route]]\n"),
        };
        if let Some(method) = &r.method {
            t.set("method", quoted(method.as_str()));
        }
        t.set("path", quoted(r.template.as_str()));
        t.set(
            "require_key",
            r.require_key.unwrap_or(self.require_key).to_string(),
        );
        t.set("ttl", duration(r.ttl.unwrap_or(self.ttl)));
        t.set(
            "tombstone_ttl",
            duration(r.tombstone_ttl.unwrap_or(self.tombstone_ttl)),
        );
        t.set("ignore", strings(&r.ignore));
        t.set(
            "store_headers",
            strings(r.store_headers.iter().map(|h| h.as_str())),
        );
        t.set(
            "release_statuses",
            statuses(
                r.release_statuses
                    .as_ref()
                    .unwrap_or(&self.release_statuses),
            ),
        );
        t.set(
            "grpc_release_codes",
            grpc_codes(
                r.grpc_release_codes
                    .as_ref()
                    .unwrap_or(&self.grpc_release_codes),
            ),
        );
        match r.retry_hints {
            Some(on) => t.set("retry_hints", on.to_string()),
            None => t.note("retry_hints", "off"),
        }
        match r.profile {
            Some(profile) => t.set("profile", quoted(profile.as_str())),
            None => t.note("profile", "the global profile"),
        }
        if r.is_jcs() {
            t.set("canonical_json", quoted("jcs"));
        } else {
            t.note("canonical_json", "idem");
        }
        t.set(
            "require_tenant",
            r.require_tenant.unwrap_or(self.require_tenant).to_string(),
        );
        match &r.tenant_from {
            Some(list) => t.set("tenant_from", strings(list.iter().map(|s| s.as_str()))),
            None => t.note("tenant_from", "the global tenant_from"),
        }
        if r.key_headers.is_empty() {
            t.note("key_header", "Idempotency-Key");
        } else {
            t.set(
                "key_header",
                strings(r.key_headers.iter().map(|h| h.as_str())),
            );
        }
        match &r.key_pointer {
            Some(pointer) => t.set("key_pointer", quoted(pointer)),
            None => t.note("key_pointer", "none: the key comes in a header"),
        }
        match r.conflict_wait {
            Some(wait) => t.set("conflict_wait", duration(wait)),
            None => t.note(
                "conflict_wait",
                "none: a duplicate without `Prefer: wait` gets 409 at once",
            ),
        }
        t.out
    }
}

/// One `[[tenant]]` table, as it overrides the global limits.
fn tenant_toml(limits: &super::TenantLimits) -> String {
    let mut t = Toml {
        out: String::from("[[tenant]]\n"),
    };
    t.set("id", quoted(&limits.id));
    match limits.max_in_flight {
        Some(n) => t.set("max_in_flight", n.to_string()),
        None => t.note("max_in_flight", "the global tenant_max_in_flight"),
    }
    match limits.key_rate {
        Some(Some(rate)) => t.set("key_rate", quoted(&rate.to_string())),
        Some(None) => t.set("key_rate", quoted("none")),
        None => t.note("key_rate", "the global tenant_key_rate"),
    }
    t.out
}
