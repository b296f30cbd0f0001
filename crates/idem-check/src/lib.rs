//! `idem check URL`: does an API's `Idempotency-Key` support hold?
//!
//! The checker sends requests to that one URL (`http://` or `https://`), bounded in
//! count (`--max-requests`) and time (`--timeout` per request, `--total-timeout` for the
//! run), and reports eight probes (ten under `--profile mcp`), each pass, fail or not
//! applicable, with the requests and answers behind the verdict (credential headers
//! redacted). The report starts with its bottom line in one plain sentence: the API
//! ignores the key (a retry executed again), idempotency holds for every probe that
//! applied, or which guarantee broke.
//!
//! | probe | passes when |
//! |---|---|
//! | `replay` | the same request with the same key gets the same status and body (and, with `--id-pointer`, the same resource id) |
//! | `concurrent_duplicates` | `--concurrency` requests with one key, in flight together, make one execution: one distinct id (or body) among the 2xx answers, the others 409 (in the profile's shape) or the replay. Each request is written but for its last byte, and the last bytes are released once all are written; the overlap is then measured (a request is in flight from its first byte sent until its answer's head is read). When no two were in flight together, the probe is not applicable ("not tested"), never a pass |
//! | `lost_answer` | after a request whose connection closed before its answer was read, the retry with the same key gets the execution that happened (a follow-up replay agrees) |
//! | `payload_mismatch` | the same key with a changed body is refused as the `--profile` says (422 under `ietf`); a form stays a form, JSON stays JSON |
//! | `keys` | a 256-character key, a key with a control character and two `Idempotency-Key` fields are 400 (in the profile's shape); the quoted (Structured Field) and bare forms are one key; with `--require-key`, no key is 400 |
//! | `equivalent_json` | the same body in other bytes is the same request: JSON with its keys reordered and other whitespace, or a form with its parameters reordered and a character percent-encoded (the id stays `equivalent_json`, its name is "Equivalent body") |
//! | `tenants` | with `--other-tenant-header`, the same key under another tenant gets its own answer, never the first tenant's (nor a 409 or a mismatch refusal from its record) |
//! | `replayed_headers` | a replay a second later carries no recorded `Set-Cookie` or `Date`; `Idempotent-Replayed` is reported when present (and under `--profile acp`, an echoed `Idempotency-Key`) |
//!
//! | `mcp_replay_id` (`--profile mcp`) | a tool call's replay answers the retry's own JSON-RPC `id`, in a JSON answer or an event stream |
//! | `mcp_envelope` (`--profile mcp`) | a new `id` and `_meta.progressToken` are the same call (a replay, not a refusal); changed `params.arguments` are refused |
//!
//! Under `--profile mcp` every request carries a fresh JSON-RPC `id` (the body's
//! top-level `id` value rewritten in place) and accepts JSON and event-stream answers,
//! which are compared as responses with their `id`s aside.
//!
//! When the replay probe sees the retry execute again, `equivalent_json`, `tenants` and
//! `replayed_headers` are not applicable ("replay does not hold, so … cannot be
//! judged"), and no check that a second execution would satisfy by chance (a matching
//! status) reads as a pass.
//!
//! `--profile ietf|stripe|acp|ucp|mcp` says which dialect the API's refusals are judged by
//! (see [`profile`]). Every probe uses keys of its own (`idem-check-` and 32 random hex
//! digits), so a run creates resources: point it at a staging API.
//!
//! This crate is `idem check`: the `idem` binary runs [`run`] with the [`CheckArgs`]
//! it parsed. It shares nothing with the gateway but the protocol it checks, so it
//! checks any API, idem or not.
//!
//! The exit status is [`EXIT_PASSED`] when every applicable probe passed,
//! [`EXIT_FAILED`] when one failed, [`EXIT_USAGE`] for bad arguments and
//! [`EXIT_UNREACHABLE`] when nothing listens at the URL.

mod client;
mod form;
mod probes;
pub mod profile;
pub mod report;
mod rpc;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, ValueEnum};
use http::{HeaderName, HeaderValue, Method, Uri};

pub use client::REDACTED;
pub use probes::{Check, MCP_PROBES, PROBES, ProbeReport, Status, describe, probes_for};
pub use profile::Profile;
pub use report::Report;

/// Parses a duration as `idem serve` does (`500ms`, `2s`, `2m`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (examples: 500ms, 2s, 2m)"))
}

/// Every applicable probe passed.
pub const EXIT_PASSED: u8 = 0;
/// A probe failed (or could not finish within the budget).
pub const EXIT_FAILED: u8 = 1;
/// The arguments are wrong (clap's own usage errors exit 2 as well).
pub const EXIT_USAGE: u8 = 2;
/// Nothing answers at the URL: the TCP connection was refused or timed out.
pub const EXIT_UNREACHABLE: u8 = 3;

/// `idem check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The endpoint to check, e.g. http://127.0.0.1:8080/v1/charges or https://….
    #[arg(value_name = "URL")]
    pub url: String,

    /// PEM file of the CA certificates an https:// URL is trusted by (a private CA);
    /// without it, the system's root certificates.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,

    /// The dialect the API speaks, which decides what its refusals must look like:
    /// ietf (422 problem+json, 409 with Retry-After), stripe, acp or ucp.
    #[arg(long, value_parser = profile::parser(), default_value = "ietf")]
    pub profile: Profile,

    /// The method of every request.
    #[arg(long, default_value = "POST")]
    pub method: String,

    /// The request body: JSON, a form (a=1&b=2) or any text inline, or @FILE to read
    /// it from a file [default: {}].
    #[arg(long, value_name = "JSON|FORM|@FILE")]
    pub body: Option<String>,

    /// A header sent on every request, 'Name: value'; repeatable. Values of
    /// Authorization, Cookie and other credential headers never appear in the report.
    #[arg(long = "header", short = 'H', value_name = "'Name: value'")]
    pub headers: Vec<String>,

    /// Another tenant's credential, 'Name: value' (e.g. 'Authorization: Bearer …'): the
    /// tenants probe sends it instead of the --header of that name. Never shown.
    #[arg(long, value_name = "'Name: value'")]
    pub other_tenant_header: Option<String>,

    /// JSON pointer to the resource id in an answer's body, e.g. /id: replays and
    /// duplicates are judged by the id too, so a second execution is caught even when it
    /// answers alike.
    #[arg(long, value_name = "POINTER")]
    pub id_pointer: Option<String>,

    /// The route requires a key: check that a request without one is 400.
    #[arg(long)]
    pub require_key: bool,

    /// Parallel requests of the concurrent-duplicates probe (2 or more).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub concurrency: u32,

    /// Most requests the run sends; a probe that would need more fails, saying so.
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub max_requests: u32,

    /// How long each request may take to be answered.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// How long the whole run may take; probes still running then fail, saying so.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub total_timeout: Duration,

    /// Report format: text (a summary table), markdown (for a pull request), json
    /// (stable shape `idem-check/1`) or junit (XML for CI).
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,

    /// Write the report to FILE instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// The text report shows every request and answer, not only the verdicts.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// How the report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The bottom line, a line per probe, the failed checks (`--verbose`: every
    /// exchange).
    Text,
    /// A Markdown report to paste into a pull request.
    Markdown,
    /// One JSON object (`"format": "idem-check/1"`).
    Json,
    /// JUnit XML: one test case per probe.
    Junit,
}

/// What is wrong with the arguments.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(String);

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// Parses a `'Name: value'` header argument.
fn parse_header(flag: &str, s: &str) -> Result<(HeaderName, HeaderValue), UsageError> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| usage(format!("{flag} wants 'Name: value', got no ':'")))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| usage(format!("{flag}: {:?} is no header name", name.trim())))?;
    if name.as_str() == "idempotency-key" {
        return Err(usage(format!(
            "{flag}: the probes choose the Idempotency-Key themselves"
        )));
    }
    if name == http::header::CONTENT_LENGTH
        || name == http::header::HOST
        || name == http::header::TRANSFER_ENCODING
        || name == http::header::CONNECTION
    {
        return Err(usage(format!("{flag}: {name} is set by the checker")));
    }
    // The value's bytes are not echoed: it may be a credential.
    let value = HeaderValue::from_str(value.trim()).map_err(|_| {
        usage(format!(
            "{flag}: the value of {name} is no valid header value"
        ))
    })?;
    Ok((name, value))
}

/// Resolves the arguments into a target.
fn target(args: &CheckArgs) -> Result<client::Target, UsageError> {
    let lower = args.url.to_ascii_lowercase();
    let https = lower.starts_with("https://");
    if !https && !lower.starts_with("http://") {
        return Err(usage(format!(
            "{:?} is no http:// or https:// URL (e.g. http://127.0.0.1:8080/v1/charges)",
            args.url
        )));
    }
    if args.ca.is_some() && !https {
        return Err(usage("--ca is for an https:// URL"));
    }
    let uri: Uri = args
        .url
        .parse()
        .map_err(|e| usage(format!("{:?} is no URL: {e}", args.url)))?;
    let auth = uri
        .authority()
        .ok_or_else(|| usage(format!("{:?} names no host", args.url)))?;
    if auth.as_str().contains('@') {
        return Err(usage(
            "credentials in the URL are not supported: send them with --header",
        ));
    }
    let authority = format!(
        "{}:{}",
        auth.host(),
        auth.port_u16().unwrap_or(if https { 443 } else { 80 })
    );
    let host = auth
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let tls = if https {
        Some(Arc::new(tls_config(args.ca.as_deref())?))
    } else {
        None
    };
    let method = Method::from_bytes(args.method.trim().to_ascii_uppercase().as_bytes())
        .map_err(|_| usage(format!("--method {:?} is no HTTP method", args.method)))?;
    let body = match args.body.as_deref() {
        None => Bytes::from_static(b"{}"),
        Some(b) => match b.strip_prefix('@') {
            Some(path) => {
                Bytes::from(std::fs::read(path).map_err(|e| usage(format!("--body @{path}: {e}")))?)
            }
            None => Bytes::from(b.to_owned()),
        },
    };
    let headers = args
        .headers
        .iter()
        .map(|h| parse_header("--header", h))
        .collect::<Result<Vec<_>, _>>()?;
    let other_tenant = args
        .other_tenant_header
        .as_deref()
        .map(|h| parse_header("--other-tenant-header", h))
        .transpose()?;
    let kind = body_kind(&body, &headers);
    if let Some((name, value)) = &other_tenant
        && headers.iter().any(|(n, v)| n == name && v == value)
    {
        return Err(usage(format!(
            "--other-tenant-header gives the same {name} as --header: it must be another \
             tenant's"
        )));
    }
    if let Some(p) = &args.id_pointer
        && !p.starts_with('/')
    {
        return Err(usage(format!(
            "--id-pointer {p:?} is no JSON pointer: it starts with '/', e.g. /id or /data/id"
        )));
    }
    if args.concurrency < 2 {
        return Err(usage("--concurrency must be 2 or more"));
    }
    if args.max_requests < args.concurrency {
        return Err(usage(format!(
            "--max-requests {} is less than --concurrency {}",
            args.max_requests, args.concurrency
        )));
    }
    if args.timeout.is_zero() || args.total_timeout.is_zero() {
        return Err(usage(
            "--timeout and --total-timeout must be more than zero",
        ));
    }
    Ok(client::Target {
        uri,
        authority,
        host,
        tls,
        method,
        headers,
        body,
        kind,
        id_pointer: args.id_pointer.clone(),
        other_tenant,
        rpc: args.profile == Profile::Mcp,
    })
}

/// What the body is: a form when its `--header` `Content-Type` says so, or when it is
/// not JSON and reads as `a=1&b=2`; JSON when it parses; else other text.
fn body_kind(body: &[u8], headers: &[(HeaderName, HeaderValue)]) -> client::BodyKind {
    let content_type = headers
        .iter()
        .find(|(n, _)| n == http::header::CONTENT_TYPE)
        .map(|(_, v)| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase());
    let json = serde_json::from_slice(body).ok();
    match (content_type, json) {
        (Some(ct), _) if ct.trim_start().starts_with(client::FORM) => client::BodyKind::Form,
        (_, Some(v)) => client::BodyKind::Json(v),
        (None, None) if form::looks_like_form(body) => client::BodyKind::Form,
        _ => client::BodyKind::Other,
    }
}

/// The TLS settings of an `https://` target: TLS 1.2 and 1.3 with the ring provider,
/// trusting the CA certificates of `ca` when given, else the system's roots.
fn tls_config(ca: Option<&Path>) -> Result<rustls::ClientConfig, UsageError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| usage(format!("--ca {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(usage(format!(
                    "--ca {}: no PEM certificate in it",
                    path.display()
                )));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    usage(format!(
                        "--ca {}: not a CA certificate: {e}",
                        path.display()
                    ))
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(usage(
                    "no system root certificates were found to trust the https:// URL by: \
                     give the CA that signed its certificate with --ca FILE (PEM)",
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| usage(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // The probes speak HTTP/1.1, some of them byte by byte.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// What to say of a body that is neither JSON nor a form, sent without a `Content-Type`
/// of the operator's: it goes without one (an API may refuse it, or read it as something
/// else), and the probe that rewrites a body into an equivalent one does not apply.
fn body_warning(target: &client::Target) -> Option<String> {
    let typed = target
        .headers
        .iter()
        .any(|(name, _)| name == http::header::CONTENT_TYPE);
    (target.kind == client::BodyKind::Other && !typed).then(|| {
        "the --body is neither JSON nor a form (a=1&b=2) and no --header gives its \
         Content-Type, so it is sent without one: add -H 'Content-Type: …' if the API \
         needs it (equivalent_json does not apply)"
            .to_owned()
    })
}

/// Runs the probes against an already resolved session and returns the report.
async fn run_probes(session: &client::Session, args: &CheckArgs) -> Report {
    let mut opts = probes::Options {
        concurrency: args.concurrency,
        require_key: args.require_key,
        profile: args.profile,
        replay_holds: true,
    };
    let progress = std::io::stderr().is_terminal();
    let mut reports = Vec::new();
    let probes = probes_for(args.profile);
    for (i, (id, name)) in probes.iter().enumerate() {
        if progress {
            eprint!(
                "\r\x1b[2K[{}/{}] {name}… ({} requests so far)",
                i + 1,
                probes.len(),
                session.sent()
            );
            let _ = std::io::stderr().flush();
        }
        let report = probes::run(id, name, session, opts).await;
        if *id == "replay" && report.executed_again {
            opts.replay_holds = false;
        }
        reports.push(report);
    }
    if progress {
        eprint!("\r\x1b[2K");
        let _ = std::io::stderr().flush();
    }
    let mut report = Report::new(
        session.target.method.as_str(),
        &args.url,
        session.sent(),
        reports,
    );
    report.profile = args.profile.as_str();
    report
}

/// `idem check`: prints the warning, runs the probes, writes the report; the exit status
/// says whether every applicable probe passed.
pub async fn run(args: &CheckArgs) -> ExitCode {
    let target = match target(args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("idem check: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    eprintln!("warning: {}", report::warning(&args.url));
    if let Some(warning) = body_warning(&target) {
        eprintln!("warning: {warning}");
    }
    // Reachable at all? A bare connection creates nothing.
    let connect = tokio::net::TcpStream::connect(&target.authority);
    match tokio::time::timeout(args.timeout, connect).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            eprintln!("idem check: cannot reach {}: {e}", target.authority);
            return ExitCode::from(EXIT_UNREACHABLE);
        }
        Err(_) => {
            eprintln!(
                "idem check: cannot reach {}: no connection within {}",
                target.authority,
                humantime::format_duration(args.timeout)
            );
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    }
    let session = client::Session::new(target, args.max_requests, args.timeout, args.total_timeout);
    let report = run_probes(&session, args).await;
    let rendered = match args.format {
        Format::Text => report::text(&report, args.verbose),
        Format::Markdown => report::markdown(&report),
        Format::Json => report::json(&report),
        Format::Junit => report::junit(&report),
    };
    match &args.output {
        Some(path) => {
            if let Err(e) = std::fs::write(path, rendered) {
                eprintln!("idem check: writing {}: {e}", path.display());
                return ExitCode::from(EXIT_USAGE);
            }
            eprintln!(
                "idem check: {} ({} passed, {} failed, {} not applicable); report in {}",
                if report.passed { "passed" } else { "FAILED" },
                report.summary.pass,
                report.summary.fail,
                report.summary.not_applicable,
                path.display()
            );
        }
        None => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(rendered.as_bytes());
            let _ = out.flush();
        }
    }
    ExitCode::from(if report.passed {
        EXIT_PASSED
    } else {
        EXIT_FAILED
    })
}

#[cfg(test)]
mod tests;
