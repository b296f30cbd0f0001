//! The settings that name one of a few choices, read straight into the types that own
//! the list (a profile, a scope mode): the command line and the file spell, list and
//! refuse them from that one list.

use std::fmt;

use clap::builder::{PossibleValue, PossibleValuesParser, StyledStr, TypedValueParser};
use idem_core::{Profile, ScopeMode};
use serde::de::{Deserializer, EnumAccess, Error, VariantAccess, Visitor};

/// `--profile`: one of [`Profile::ALL`], each listed in `--help` with what it answers.
pub(super) fn profile() -> impl TypedValueParser<Value = Profile> {
    one_of(&Profile::ALL, Profile::as_str, |p| match p {
        Profile::Ietf => "The IETF draft, with RFC 9457 problem details",
        Profile::Stripe => "Stripe's error envelope (a reused key is a 400 `idempotency_error`)",
        Profile::Acp => "The Agentic Commerce Protocol's flat errors",
        Profile::Ucp => "The Universal Commerce Protocol's errors (a reused key is a 409)",
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

/// `profile = "stripe"` in the file.
pub(super) fn profile_in_file<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Profile>, D::Error> {
    named(d, &Profile::ALL, &Profile::NAMES)
}

/// `scope = "internal"` in the file.
pub(super) fn scope_in_file<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<ScopeMode>, D::Error> {
    named(d, &ScopeMode::ALL, &ScopeMode::NAMES)
}

/// The choice of `all` whose name (`names`, in its order) the file spells, read and
/// refused as serde reads a unit variant of an enum.
fn named<'de, D: Deserializer<'de>, T: Copy + 'static>(
    d: D,
    all: &'static [T],
    names: &'static [&'static str],
) -> Result<Option<T>, D::Error> {
    struct Choice<T: 'static>(&'static [T], &'static [&'static str]);
    impl<'de, T: Copy> Visitor<'de> for Choice<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "one of {}", self.1.join(", "))
        }
        fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<T, A::Error> {
            let (name, variant) = data.variant::<String>()?;
            let at = self.1.iter().position(|n| *n == name);
            let at = at.ok_or_else(|| A::Error::unknown_variant(&name, self.1))?;
            variant.unit_variant()?;
            Ok(self.0[at])
        }
    }
    d.deserialize_enum("choice", names, Choice(all, names))
        .map(Some)
}
