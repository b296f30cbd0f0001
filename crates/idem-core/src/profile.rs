//! The protocol profiles by name: the one list of the dialects idem speaks, which the
//! layer writes its answers in (`idem-tower`), the gateway's settings name and
//! `idem check` judges an API by.
//!
//! What each profile means lives with whoever acts on it, in matches over this enum
//! without a wildcard, so that a new profile is refused by the compiler everywhere it
//! must be handled.

use std::fmt;
use std::str::FromStr;

use serde::de::{Deserialize, Deserializer, EnumAccess, Error, VariantAccess, Visitor};

/// A protocol profile: the dialect of an API's idempotency answers (see the guide's
/// profiles table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// The IETF draft (draft-ietf-httpapi-idempotency-key-header) with RFC 9457
    /// problem details.
    #[default]
    Ietf,
    /// Stripe's API: a reused key is a 400 whose error `type` is `idempotency_error`,
    /// which Stripe's SDKs raise as their idempotency error.
    Stripe,
    /// The Agentic Commerce Protocol's checkout API (its section on idempotency).
    Acp,
    /// Google's Universal Commerce Protocol's REST binding.
    Ucp,
    /// JSON-RPC 2.0 as MCP's Streamable HTTP transport carries it (SPEC S24): the
    /// operation is the tool call in the body, keyed by `params._meta`'s
    /// `idempotency-key`, and the answers are JSON-RPC errors carrying the request's
    /// `id`.
    Mcp,
}

impl Profile {
    /// Every profile, in the order the guide lists them.
    pub const ALL: [Profile; 5] = [
        Profile::Ietf,
        Profile::Stripe,
        Profile::Acp,
        Profile::Ucp,
        Profile::Mcp,
    ];

    /// The names of [`ALL`](Profile::ALL), in its order.
    pub const NAMES: [&'static str; Profile::ALL.len()] = {
        let mut names = [""; Profile::ALL.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = Profile::ALL[i].as_str();
            i += 1;
        }
        names
    };

    /// The name in settings: `ietf`, `stripe`, `acp`, `ucp` or `mcp`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Profile::Ietf => "ietf",
            Profile::Stripe => "stripe",
            Profile::Acp => "acp",
            Profile::Ucp => "ucp",
            Profile::Mcp => "mcp",
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A profile name that is not one of [`Profile::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown profile {0:?}: one of {names}", names = Profile::NAMES.join(", "))]
pub struct UnknownProfile(String);

/// A name of [`Profile::ALL`], ignoring ASCII case and surrounding white space.
impl FromStr for Profile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Profile, UnknownProfile> {
        Profile::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownProfile(s.to_owned()))
    }
}

/// Read as serde reads a unit variant of an enum (settings files): a name of
/// [`Profile::ALL`] exactly, anything else refused with the names.
impl<'de> Deserialize<'de> for Profile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Profile, D::Error> {
        named(d, &Profile::ALL, &Profile::NAMES)
    }
}

/// The one of `all` whose name (`names`, in its order) `d` holds, read and refused as
/// serde reads a unit variant of an enum.
pub(crate) fn named<'de, D: Deserializer<'de>, T: Copy + 'static>(
    d: D,
    all: &'static [T],
    names: &'static [&'static str],
) -> Result<T, D::Error> {
    struct Named<T: 'static>(&'static [T], &'static [&'static str]);
    impl<'de, T: Copy> Visitor<'de> for Named<T> {
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
    d.deserialize_enum("choice", names, Named(all, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_list_the_choices() {
        for p in Profile::ALL {
            assert_eq!(p.as_str().parse::<Profile>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(Profile::NAMES, ["ietf", "stripe", "acp", "ucp", "mcp"]);
        assert_eq!(" Stripe ".parse::<Profile>(), Ok(Profile::Stripe));
        let e = "paypal".parse::<Profile>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown profile \"paypal\": one of ietf, stripe, acp, ucp, mcp"
        );
        assert_eq!(Profile::default(), Profile::Ietf);
    }

    #[test]
    fn settings_files_name_a_profile_exactly() {
        let read = |v: serde_json::Value| serde_json::from_value::<Profile>(v);
        assert_eq!(read("ucp".into()).unwrap(), Profile::Ucp);
        let e = read("Stripe".into()).unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown variant `Stripe`, expected one of `ietf`, `stripe`, `acp`, `ucp`, `mcp`"
        );
    }
}
