//! Every resolved setting as the configuration file spells it, for `idem check-config`:
//! what the command line, the `IDEM_*` variables, the `--config` file and the defaults
//! came to, one `name = value` line per setting and a `[[route]]` table per rule with
//! each of its fields (a route's own value, or the global one it inherits). Read back as
//! a file, it resolves to the same configuration. Secrets are never printed: a token or
//! tenant secret given inline is a comment saying it is set.

use std::fmt::{Display, Write};
use std::time::Duration;

use idem_tower::{GrpcReleaseCodes, ReleaseStatuses};

use super::jwt::JwtSettings;
use super::{GatewayConfig, ServeArgs};
use crate::route::Route;

/// A setting's line in the file's form: `key = value`, or `# key: note` for one left
/// unset (or a secret), the note saying what that means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    /// The value, as TOML.
    Set(String),
    /// What being unset means.
    Note(&'static str),
}

impl From<String> for Line {
    fn from(value: String) -> Line {
        Line::Set(value)
    }
}

/// A value, or the note that stands for it.
impl From<Result<String, &'static str>> for Line {
    fn from(value: Result<String, &'static str>) -> Line {
        value.map_or_else(Line::Note, Line::Set)
    }
}

/// The line `print` writes of `config` (and `args`, for the files whose contents are
/// all the configuration keeps): a function, so that a declaration's closure takes its
/// arguments' types from here.
pub(super) fn line<L: Into<Line>>(
    config: &GatewayConfig,
    args: &ServeArgs,
    print: impl FnOnce(&GatewayConfig, &ServeArgs) -> L,
) -> Line {
    print(config, args).into()
}

/// A TOML string.
pub(super) fn quoted(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// A retention choice as `check-config` prints it.
pub(super) fn print_choice(choice: &idem_tower::HeaderChoice) -> Result<String, &'static str> {
    match choice {
        idem_tower::HeaderChoice::Profile => {
            Err("the profile's: Idempotency-TTL under acp, none otherwise")
        }
        idem_tower::HeaderChoice::Off => Ok(quoted("off")),
        idem_tower::HeaderChoice::Named(name) => Ok(quoted(name.as_str())),
    }
}

/// A value's `Display`, as a TOML string.
pub(super) fn shown(value: impl Display) -> String {
    quoted(&value.to_string())
}

fn list<I: IntoIterator<Item = String>>(items: I) -> String {
    let items: Vec<String> = items.into_iter().collect();
    format!("[{}]", items.join(", "))
}

/// A TOML list of strings.
pub(super) fn strings<I: IntoIterator<Item = S>, S: AsRef<str>>(items: I) -> String {
    list(items.into_iter().map(|s| quoted(s.as_ref())))
}

/// A TOML list of the items' `Display`; `None` when there are none.
pub(super) fn list_of<I: IntoIterator<Item = D>, D: Display>(items: I) -> Option<String> {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    (!items.is_empty()).then(|| strings(items))
}

/// A humantime duration, as a TOML string.
pub(super) fn duration(d: Duration) -> String {
    quoted(&humantime::format_duration(d).to_string())
}

/// A file's path, as a TOML string.
pub(super) fn path(p: &std::path::Path) -> String {
    quoted(&p.display().to_string())
}

/// Status codes, as a TOML list of numbers.
pub(super) fn statuses(set: &ReleaseStatuses) -> String {
    list(set.iter().map(|s| s.as_u16().to_string()))
}

/// gRPC statuses, as a TOML list of their names.
pub(super) fn grpc_codes(set: &GrpcReleaseCodes) -> String {
    strings(set.iter().map(idem_tower::grpc_code_name))
}

/// The comma-separated `Display` of a setting as a TOML list (`none` is the empty list).
pub(super) fn display_list(value: &impl Display) -> String {
    let shown = value.to_string();
    if shown == "none" {
        return "[]".to_owned();
    }
    strings(shown.split(','))
}

/// The admin token is never printed: where it is, or that there is none.
pub(super) fn admin_token(config: &GatewayConfig, args: &ServeArgs) -> Line {
    Line::Note(match (&args.admin_token_file, &config.admin_token) {
        (Some(_), _) => "in the file",
        (None, Some(_)) => "set, not shown",
        (None, None) => "none",
    })
}

/// The tenant secret's file, or where the secret is when there is none.
pub(super) fn tenant_secret_file(_: &GatewayConfig, args: &ServeArgs) -> Line {
    match (&args.tenant_secret_file, &args.tenant_secret) {
        (Some(file), _) => Line::Set(path(file)),
        (None, Some(_)) => Line::Note("the secret is set in IDEM_TENANT_SECRET, not shown"),
        (None, None) => Line::Note("the store keeps the tenant secret"),
    }
}

/// A `jwt_*` setting as the token verification uses it, or a note that there is none.
pub(super) fn jwt(
    config: &GatewayConfig,
    print: impl FnOnce(&JwtSettings) -> Result<String, &'static str>,
) -> Line {
    match &config.jwt {
        Some(jwt) => print(jwt).into(),
        None => Line::Note("unused: tenant_from does not name jwt"),
    }
}

pub(super) fn jwt_jwks_file(config: &GatewayConfig, _: &ServeArgs) -> Line {
    jwt(config, |j| match (&j.jwks_file, &j.jwks_url) {
        (Some(file), _) => Ok(path(file)),
        (None, Some(_)) => Err("none: the keys are at jwt_jwks_url"),
        (None, None) => Err("none: HS256 tokens only"),
    })
}

pub(super) fn jwt_jwks_url(config: &GatewayConfig, _: &ServeArgs) -> Line {
    jwt(config, |j| match (&j.jwks_file, &j.jwks_url) {
        (Some(_), _) => Err("none: the keys are in jwt_jwks_file"),
        (None, Some(url)) => Ok(quoted(url)),
        (None, None) => Err("none: HS256 tokens only"),
    })
}

pub(super) fn jwt_jwks_refresh(config: &GatewayConfig, _: &ServeArgs) -> Line {
    jwt(config, |j| match (&j.jwks_file, &j.jwks_url) {
        (Some(_), _) => Err("the file is read again on an unknown key"),
        (None, Some(_)) => Ok(duration(j.jwks_refresh)),
        (None, None) => Err("none: HS256 tokens only"),
    })
}

pub(super) fn jwt_jwks_wait(config: &GatewayConfig, _: &ServeArgs) -> Line {
    jwt(config, |j| match (&j.jwks_file, &j.jwks_url) {
        (None, None) => Err("none: HS256 tokens only"),
        _ => Ok(duration(j.jwks_wait)),
    })
}

/// The collector's base URL, under which the traces' path is added.
pub(super) fn otlp_endpoint(config: &GatewayConfig, _: &ServeArgs) -> Line {
    let base = |url: &String| {
        let base = url
            .strip_suffix(crate::telemetry::TRACES_PATH)
            .unwrap_or(url);
        // A password in the endpoint's URL is no one's to read in a printed config.
        quoted(&idem_core::redact_url(base))
    };
    config
        .otlp_endpoint
        .as_ref()
        .map(base)
        .ok_or("no traces exported")
        .into()
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

    fn line(&mut self, name: &str, line: Line) {
        match line {
            Line::Set(value) => self.set(name, value),
            Line::Note(text) => self.note(name, text),
        }
    }
}

impl GatewayConfig {
    /// The settings as a configuration file: `args` are the layers as merged (the
    /// command line over the environment over the file), for the settings whose file
    /// is what the configuration keeps only the contents of.
    pub fn to_toml(&self, args: &ServeArgs) -> String {
        let mut t = Toml::default();
        for (name, line) in self.lines(args) {
            t.line(name, line);
        }
        if self.profile == idem_tower::Profile::Mcp {
            t.note("json_rpc_errors", MCP_ERRORS);
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
        t.set("release_statuses", statuses(&self.release_statuses_of(r)));
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
        match &r.retention_header {
            Some(choice) => match print_choice(choice) {
                Ok(value) => t.set("retention_header", value),
                Err(note) => t.note("retention_header", note),
            },
            None => t.note("retention_header", "the global retention_header"),
        }
        if r.profile.unwrap_or(self.profile) == idem_tower::Profile::Mcp {
            let methods = match &r.rpc_methods {
                Some(methods) => methods.clone(),
                None => idem_tower::mcp::DEFAULT_KEYED_METHODS
                    .map(str::to_owned)
                    .to_vec(),
            };
            t.set("rpc_methods", strings(&methods));
            t.note("json_rpc_errors", MCP_ERRORS);
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

/// What a route of the `mcp` profile answers with, as `idem config print` notes it.
pub(crate) const MCP_ERRORS: &str = "-32700 body not JSON (HTTP 400); -32600 no readable \
     JSON-RPC request, a keyed method in a batch (HTTP 400); -32602 key missing or malformed \
     (HTTP 200); -32000 key reused with other arguments, call in progress, store \
     unavailable, overload and the rest (HTTP 200, error.data.type names it)";

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
