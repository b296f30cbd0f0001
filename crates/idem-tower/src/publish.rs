//! What the layer publishes on every answer to a keyed request besides the answer
//! itself (SPEC S23): the key echoed as the client sent it, where the profile echoes
//! it; the record's lifetime, in a header the profile or a setting names; and the
//! replay marker, under the name the profile or a setting gives it.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Response};
use idem_core::Key;

use crate::profile::Speaks;

/// The header the record's lifetime is published in where a profile publishes it
/// (`acp`) and a setting names no other: whole seconds, counted from the key's first
/// request.
pub const RETENTION_HEADER: HeaderName = HeaderName::from_static("idempotency-ttl");

/// The header a profile that echoes the key (`acp`) echoes it in.
pub(crate) const ECHOED_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Headers the layer writes on answers of its own or on replays: a replay marker or a
/// retention header under one of these names would be overwritten by, or overwrite,
/// what the layer means by it.
pub const LAYER_HEADERS: [&str; 10] = [
    "idempotency-key",
    "idempotency-operation-state",
    "retry-after",
    "content-type",
    "content-length",
    "content-location",
    "stripe-should-retry",
    "x-should-retry",
    "grpc-status",
    "grpc-message",
];

/// Where a header the layer may publish comes from: the request's profile, a name of
/// its own, or nowhere.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HeaderChoice {
    /// What the request's profile says (see the profiles table).
    #[default]
    Profile,
    /// Never published.
    Off,
    /// Published under this name, whatever the profile.
    Named(HeaderName),
}

/// The replay marker's name under `profile` when no setting names one.
pub fn replay_marker(profile: crate::Profile) -> HeaderName {
    profile.replay_marker()
}

impl HeaderChoice {
    /// The retention header this choice comes to for a request in `profile`, if any.
    pub fn resolve(&self, profile: crate::Profile) -> Option<HeaderName> {
        match self {
            HeaderChoice::Profile => profile.retention_header(),
            HeaderChoice::Off => None,
            HeaderChoice::Named(name) => Some(name.clone()),
        }
    }
}

/// Whether a key header's field spells its key as a quoted string (the draft's
/// Structured Field form) rather than bare (Stripe's).
pub(crate) fn is_quoted(field: &HeaderValue) -> bool {
    field.as_bytes().trim_ascii_start().first() == Some(&b'"')
}

/// The echo of `key` as its header spelt it (`quoted`), byte for byte: the field value
/// without the white space around it (RFC 9110 §5.5), which is not part of it. Both
/// spellings are canonical, so the key gives them back: a bare key is the trimmed
/// value itself, and a quoted one escapes exactly its `"` and `\`, the only escapes a
/// quoted key may hold. A key no header carried (`None`, a body's) is echoed as a
/// Structured Field string, which every reader of the header parses back to it.
pub(crate) fn echo(key: &Key, quoted: Option<bool>) -> Option<HeaderValue> {
    match quoted {
        Some(false) => HeaderValue::from_str(key.as_str()).ok(),
        Some(true) | None => HeaderValue::from_str(&key.to_sf_string()).ok(),
    }
}

/// What every answer to one keyed request carries besides the answer, decided from its
/// plan before its steps run.
pub(crate) struct Published {
    /// Whether its profile echoes the key.
    pub(crate) echoes: bool,
    /// The retention header and its value.
    pub(crate) retention: Option<(HeaderName, HeaderValue)>,
    /// The replay marker's name.
    pub(crate) marker: HeaderName,
}

impl Published {
    /// What a request in `profile` publishes, its record living `ttl`, under the
    /// layer's or its route's `retention` and the layer's `marker` (`None`: the
    /// profile's).
    pub(crate) fn new(
        profile: crate::Profile,
        ttl: Duration,
        retention: &HeaderChoice,
        marker: Option<&HeaderName>,
    ) -> Published {
        let seconds = HeaderValue::from(ttl.as_secs());
        Published {
            echoes: profile.echoes_key(),
            retention: retention.resolve(profile).map(|name| (name, seconds)),
            marker: marker.cloned().unwrap_or_else(|| profile.replay_marker()),
        }
    }

    /// Puts on `response` what it publishes: the key's echo (`echo`, the key as sent,
    /// once the request's key is known), the retention header, and the replay marker
    /// on a replay.
    pub(crate) fn apply<B>(self, response: &mut Response<B>, echo: Option<HeaderValue>) {
        let replayed = response.extensions().get::<Replayed>().is_some();
        let headers: &mut HeaderMap = response.headers_mut();
        if self.echoes
            && let Some(echo) = echo
        {
            headers.insert(ECHOED_KEY, echo);
        }
        if let Some((name, seconds)) = self.retention {
            headers.insert(name, seconds);
        }
        if replayed {
            headers.insert(self.marker, HeaderValue::from_static("true"));
        }
    }
}

/// On a response's extensions: it is a recorded answer replayed (or rendered again),
/// to be marked as one under the request's marker name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replayed;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Profile;

    #[test]
    fn the_echo_is_the_field_value_without_its_white_space() {
        for (sent, spelt) in [
            (" \"a b\"\t", "\"a b\""),
            ("68332aa6-1c1f", "68332aa6-1c1f"),
            ("\"q\\\"uo\\\\te\"", "\"q\\\"uo\\\\te\""),
            ("\tbare \"inner\" quotes ", "bare \"inner\" quotes"),
            ("a\\b", "a\\b"),
        ] {
            let field = HeaderValue::from_str(sent).unwrap();
            let key = Key::parse(field.as_bytes()).unwrap();
            let back = echo(&key, Some(is_quoted(&field))).unwrap();
            assert_eq!(back, spelt, "{sent:?}");
            // The echo is the key the record holds.
            assert_eq!(Key::parse(back.as_bytes()).unwrap(), key);
        }
    }

    #[test]
    fn a_body_key_is_echoed_as_a_structured_field_string() {
        let key = Key::new(" \"odd\" ").unwrap();
        let back = echo(&key, None).unwrap();
        assert_eq!(back, r#"" \"odd\" ""#);
        assert_eq!(Key::parse(back.as_bytes()).unwrap(), key);
    }

    #[test]
    fn retention_is_the_profiles_unless_a_setting_names_one() {
        let ttl = Duration::from_secs(86_400);
        let acp = Published::new(Profile::Acp, ttl, &HeaderChoice::Profile, None);
        let (name, value) = acp.retention.unwrap();
        assert_eq!(
            (name.as_str(), value.to_str().unwrap()),
            ("idempotency-ttl", "86400")
        );
        assert!(acp.echoes);
        for p in [Profile::Ietf, Profile::Stripe, Profile::Ucp] {
            let published = Published::new(p, ttl, &HeaderChoice::Profile, None);
            assert!(published.retention.is_none(), "{p}");
            assert_eq!(published.marker, crate::IDEMPOTENT_REPLAYED);
        }
        let named = HeaderChoice::Named(HeaderName::from_static("x-key-ttl"));
        let ietf = Published::new(Profile::Ietf, ttl, &named, None);
        assert_eq!(ietf.retention.unwrap().0, "x-key-ttl");
        let off = Published::new(Profile::Acp, ttl, &HeaderChoice::Off, None);
        assert!(off.retention.is_none());
        let marker = HeaderName::from_static("x-idempotent-replayed");
        let renamed = Published::new(Profile::Stripe, ttl, &HeaderChoice::Off, Some(&marker));
        assert_eq!(renamed.marker, marker);
    }

    #[test]
    fn the_marker_goes_on_replays_only() {
        let published = || {
            Published::new(
                Profile::Ietf,
                Duration::from_secs(5),
                &HeaderChoice::Off,
                None,
            )
        };
        let mut fresh = Response::new(());
        published().apply(&mut fresh, None);
        assert!(!fresh.headers().contains_key("idempotent-replayed"));
        let mut replay = Response::new(());
        replay.extensions_mut().insert(Replayed);
        published().apply(&mut replay, None);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
    }
}
