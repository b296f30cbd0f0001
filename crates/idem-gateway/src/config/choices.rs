//! The settings that name one of a few choices, parsed straight into the types that
//! own the list (a profile, a scope mode), which the file reads too (their
//! `Deserialize`): the command line spells, lists and refuses them from that one list.

use clap::builder::{PossibleValue, PossibleValuesParser, StyledStr, TypedValueParser};
use idem_core::{Profile, ScopeMode};

/// `--profile`: one of [`Profile::ALL`], each listed in `--help` with what it answers.
pub(super) fn profile() -> impl TypedValueParser<Value = Profile> {
    one_of(&Profile::ALL, Profile::as_str, |p| match p {
        Profile::Ietf => "The IETF draft, with RFC 9457 problem details",
        Profile::Stripe => "Stripe's error envelope (a reused key is a 400 `idempotency_error`)",
        Profile::Acp => "The Agentic Commerce Protocol's flat errors",
        Profile::Ucp => "The Universal Commerce Protocol's errors (a reused key is a 409)",
        Profile::Mcp => "MCP tool calls over JSON-RPC: keyed by the call, JSON-RPC errors",
    })
}

/// `--scope`: one of [`ScopeMode::ALL`], each listed with the parts of its scope.
pub(super) fn scope() -> impl TypedValueParser<Value = ScopeMode> {
    one_of(&ScopeMode::ALL, ScopeMode::as_str, |m| {
        format!("`{}`", m.parts())
    })
}

/// A parser of exactly the names of `all` (as clap spells a refusal and lists them in
/// `--help` and completions), each with its help line.
fn one_of<T: Copy + Send + Sync + 'static, H: Into<StyledStr>>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> H,
) -> impl TypedValueParser<Value = T> {
    let values = all
        .iter()
        .map(move |&c| PossibleValue::new(name(c)).help(help(c)));
    PossibleValuesParser::new(values).map(move |s| {
        let found = all.iter().find(|&&c| name(c) == s);
        *found.expect("clap let through only the possible values")
    })
}
