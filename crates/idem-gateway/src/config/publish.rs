//! What the gateway publishes to clients about their keys (SPEC S23): the header the
//! record's lifetime is published in, the replay marker's name, and the path of the
//! document of every route's rules. Each name is checked here: a header name that
//! cannot be one, or that collides with a header the gateway already writes, is refused
//! with the setting it came from.

use http::HeaderName;
use idem_tower::{HeaderChoice, LAYER_HEADERS};

use super::error::{ConfigError, invalid};
use super::{GatewayConfig, ServeArgs};

/// Headers the gateway writes or that carry something else end to end, besides those
/// the layer writes ([`LAYER_HEADERS`]): the request id, CORS, framing and hop-by-hop
/// headers, what the proxy forwards on the client's behalf, and what an answer's
/// representation is described by.
const GATEWAY_HEADERS: [&str; 28] = [
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "date",
    "server",
    "vary",
    "location",
    "etag",
    "last-modified",
    "content-encoding",
    "cache-control",
    "authorization",
    "cookie",
    "set-cookie",
    "idempotency-attempt",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "access-control-expose-headers",
    "traceparent",
    "tracestate",
];

/// A header name the gateway may publish under, from `setting`: a valid name, and none
/// it writes for something else.
fn published_name(given: &str, setting: &str) -> Result<HeaderName, ConfigError> {
    let given = given.trim();
    let name = HeaderName::from_bytes(given.to_ascii_lowercase().as_bytes())
        .map_err(|_| invalid(setting, format!("{given:?} is no header name")))?;
    if LAYER_HEADERS.contains(&name.as_str()) || GATEWAY_HEADERS.contains(&name.as_str()) {
        return Err(invalid(
            setting,
            format!(
                "{given:?} is a header the gateway already writes or forwards for something \
                 else; name one of its own"
            ),
        ));
    }
    Ok(name)
}

/// A retention header as given in `setting`: `off` (or `none`) for none, a header
/// name, or the profile's when not given.
pub(super) fn choice(given: Option<&str>, setting: &str) -> Result<HeaderChoice, ConfigError> {
    Ok(match given.map(str::trim) {
        None => HeaderChoice::Profile,
        Some(off) if off.eq_ignore_ascii_case("off") || off.eq_ignore_ascii_case("none") => {
            HeaderChoice::Off
        }
        Some(name) => HeaderChoice::Named(published_name(name, setting)?),
    })
}

/// `replay_header`: the name the replay marker is published under; the profile's
/// (`Idempotent-Replayed`) when not given.
pub(super) fn replay_header(a: &ServeArgs) -> Result<Option<HeaderName>, ConfigError> {
    a.replay_header
        .as_deref()
        .map(|name| published_name(name, "replay_header"))
        .transpose()
}

/// `idempotency_document`: an absolute path in the form the listener normalises
/// paths to (no query, no fragment, no escapes, no empty or dot segments), so that the
/// one path a client asks for is the one compared.
pub(super) fn document_path(a: &ServeArgs) -> Result<Option<String>, ConfigError> {
    let Some(path) = a.idempotency_document.as_deref().map(str::trim) else {
        return Ok(None);
    };
    let refuse = |why: &str| invalid("idempotency_document", format!("{path:?} {why}"));
    if !path.starts_with('/') {
        return Err(refuse("is not an absolute path (it starts with /)"));
    }
    if let Some(c) = path
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '?' | '#' | '%' | '\\' | ';'))
    {
        return Err(refuse(&format!("holds {c:?}: name a plain path")));
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    if path.len() > 1
        && segments
            .iter()
            .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return Err(refuse("has an empty, `.` or `..` segment"));
    }
    Ok(Some(path.to_owned()))
}

impl GatewayConfig {
    /// Every name the gateway may publish under on some answer: the replay marker and
    /// the retention header of each profile in use, globally or on a route; and the
    /// `Idempotency-Key` echo, `Idempotency-Operation-State` and `Retry-After`, which it
    /// writes too.
    pub(crate) fn published_headers(&self) -> Vec<HeaderName> {
        let mut profiles = vec![self.profile];
        profiles.extend(self.routes.iter().filter_map(|r| r.profile));
        let mut choices = vec![&self.retention_header];
        choices.extend(
            self.routes
                .iter()
                .filter_map(|r| r.retention_header.as_ref()),
        );
        let mut names = vec![
            HeaderName::from_static("idempotency-key"),
            idem_tower::IDEMPOTENCY_OPERATION_STATE,
            http::header::RETRY_AFTER,
        ];
        for profile in profiles {
            let marker = self.replay_header.clone();
            names.push(marker.unwrap_or_else(|| idem_tower::replay_marker(profile)));
            names.extend(choices.iter().filter_map(|c| c.resolve(profile)));
        }
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        names
    }

    /// The checks across the published names: the replay marker is never a name a
    /// retention header takes, nor the request id's.
    pub(super) fn check_published(&self) -> Result<(), ConfigError> {
        let mut profiles = vec![self.profile];
        profiles.extend(self.routes.iter().filter_map(|r| r.profile));
        let mut choices = vec![("retention_header".to_owned(), &self.retention_header)];
        for (i, r) in self.routes.iter().enumerate() {
            if let Some(choice) = &r.retention_header {
                choices.push((
                    format!("route[{i}] ({}) retention_header", r.template.as_str()),
                    choice,
                ));
            }
        }
        for profile in profiles {
            let marker = self.replay_header.clone();
            let marker = marker.unwrap_or_else(|| idem_tower::replay_marker(profile));
            if marker == self.request_id_header {
                return Err(invalid(
                    "replay_header",
                    format!("{marker} is the request id's header (request_id_header)"),
                ));
            }
            for (setting, choice) in &choices {
                match choice.resolve(profile) {
                    Some(name) if name == marker => {
                        return Err(invalid(
                            setting,
                            format!("{name} is the replay marker's header (replay_header)"),
                        ));
                    }
                    Some(name) if name == self.request_id_header => {
                        return Err(invalid(
                            setting,
                            format!("{name} is the request id's header (request_id_header)"),
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_name_is_a_header_name_the_gateway_does_not_write() {
        assert_eq!(
            published_name(" X-Idempotent-Replayed ", "replay_header").unwrap(),
            "x-idempotent-replayed"
        );
        for taken in [
            "Retry-After",
            "Idempotency-Key",
            "Content-Type",
            "Vary",
            "Set-Cookie",
        ] {
            let e = published_name(taken, "replay_header")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("replay_header: "), "{e}");
            assert!(e.contains("already writes"), "{e}");
        }
        let e = published_name("bad name", "retention_header").unwrap_err();
        assert_eq!(
            e.to_string(),
            "retention_header: \"bad name\" is no header name"
        );
    }

    #[test]
    fn retention_is_off_a_name_or_the_profiles() {
        assert_eq!(choice(None, "x").unwrap(), HeaderChoice::Profile);
        assert_eq!(choice(Some("OFF"), "x").unwrap(), HeaderChoice::Off);
        assert_eq!(choice(Some("none"), "x").unwrap(), HeaderChoice::Off);
        assert_eq!(
            choice(Some("Idempotency-TTL"), "x").unwrap(),
            HeaderChoice::Named(HeaderName::from_static("idempotency-ttl"))
        );
    }

    #[test]
    fn the_document_path_is_a_plain_normalised_path() {
        let path = |p: &str| {
            document_path(&ServeArgs {
                idempotency_document: Some(p.to_owned()),
                ..ServeArgs::default()
            })
        };
        assert_eq!(
            path("/.well-known/idempotency").unwrap().as_deref(),
            Some("/.well-known/idempotency")
        );
        for bad in [
            "well-known",
            "/a?b",
            "/a%2Fb",
            "/a//b",
            "/a/../b",
            "/a b",
            "/a/",
        ] {
            assert!(path(bad).is_err(), "{bad}");
        }
    }
}
