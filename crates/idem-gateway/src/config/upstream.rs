//! Where the upstream is and how to speak to it: `--upstream`, parsed once at start,
//! and `--upstream-protocol`.

use std::sync::Arc;

use clap::ValueEnum;
use http::Uri;
use serde::Deserialize;

use super::ServeArgs;
use super::error::{ConfigError, invalid};

/// Where the upstream is.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http` or `https`.
    pub(crate) scheme: http::uri::Scheme,
    /// Host and port.
    pub(crate) authority: http::uri::Authority,
    /// A path prefix without trailing slash (empty for none).
    pub(crate) base_path: String,
}

impl Upstream {
    /// Parses an `http://host:port[/prefix]` or `https://host:port[/prefix]` URL.
    pub(crate) fn parse(url: &str) -> Result<Upstream, ConfigError> {
        let uri: Uri = url
            .parse()
            .map_err(|e| invalid("upstream", format!("{url:?} is not a URL: {e}")))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| invalid("upstream", "the URL needs a scheme, e.g. http://"))?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(invalid(
                "upstream",
                format!("the URL's scheme must be http:// or https://, not {scheme}://"),
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| invalid("upstream", "the URL needs a host"))?;
        if uri.query().is_some() {
            return Err(invalid("upstream", "the URL may not carry a query"));
        }
        // The proxy sends no credentials from the URL, and the URL is printed (by
        // check-config, in logs): a password here would be both ignored and shown.
        if authority.as_str().contains('@') {
            return Err(invalid(
                "upstream",
                "the URL may not carry credentials (user:password@): the gateway does not \
                 send them; have the client send its own Authorization header",
            ));
        }
        Ok(Upstream {
            scheme,
            authority,
            base_path: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The upstream URI for an incoming request's URI: its path and query, after the
    /// base path.
    ///
    /// Without a base path the incoming path and query, already parsed, are reused as
    /// they are rather than written out and parsed again.
    pub(crate) fn uri_for(&self, incoming: &Uri) -> Result<Uri, http::Error> {
        let builder = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone());
        match incoming.path_and_query() {
            Some(pq) if self.base_path.is_empty() => builder.path_and_query(pq.clone()),
            pq => builder.path_and_query(format!(
                "{}{}",
                self.base_path,
                pq.map_or("/", |p| p.as_str())
            )),
        }
        .build()
    }
}

impl Upstream {
    /// Whether the upstream is reached over TLS (`https://`).
    pub(crate) fn is_tls(&self) -> bool {
        self.scheme == http::uri::Scheme::HTTPS
    }
}

/// Which HTTP the gateway speaks to the upstream (`--upstream-protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1, on plain TCP and over TLS alike (offering no ALPN, so that servers
    /// speak HTTP/1.1).
    #[default]
    Http1,
    /// HTTP/2 only: over TLS through ALPN `h2`, on plain TCP with prior knowledge (h2c).
    Http2,
    /// Over TLS what the upstream picks by ALPN (`h2`, else `http/1.1`); HTTP/1.1 on
    /// plain TCP, where nothing negotiates.
    Auto,
}

/// `upstream`, which is required.
pub(super) fn resolve(a: &ServeArgs) -> Result<Upstream, ConfigError> {
    let url = a.upstream.as_deref().ok_or_else(|| {
        invalid(
            "upstream",
            "required: give --upstream URL, IDEM_UPSTREAM or `upstream` in --config",
        )
    })?;
    Upstream::parse(url)
}

/// For an `https://` upstream, the TLS client settings (the roots its certificate must
/// chain to: `upstream_ca`'s, else the system's); `None` for `http://`.
pub(super) fn tls(a: &ServeArgs) -> Result<Option<Arc<rustls::ClientConfig>>, ConfigError> {
    match (resolve(a)?.is_tls(), &a.upstream_ca) {
        (true, ca) => crate::tls_client::tls_client_config(ca.as_deref())
            .map(|config| Some(Arc::new(config)))
            .map_err(|e| invalid("upstream_ca", e)),
        // A CA for an upstream that no TLS reaches is a mistake worth saying.
        (false, Some(_)) => Err(invalid(
            "upstream_ca",
            "given for an http:// upstream, which is reached without TLS",
        )),
        (false, None) => Ok(None),
    }
}

impl std::fmt::Display for Upstream {
    /// The URL as the gateway uses it: `http://host:port/prefix`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_must_be_http_or_https() {
        assert!(Upstream::parse("https://example.test").unwrap().is_tls());
        assert!(!Upstream::parse("http://example.test").unwrap().is_tls());
        assert!(Upstream::parse("ftp://example.test").is_err());
        assert!(Upstream::parse("127.0.0.1:3000").is_err());
        let with_password = Upstream::parse("http://user:secret@127.0.0.1:3000").unwrap_err();
        assert!(
            with_password.to_string().contains("credentials"),
            "{with_password}"
        );
        assert!(
            !with_password.to_string().contains("secret"),
            "{with_password}"
        );
        assert!(Upstream::parse("http://user@127.0.0.1:3000").is_err());
        let incoming: Uri = "/v1/x?a=1".parse().unwrap();
        let u = Upstream::parse("http://127.0.0.1:3000").unwrap();
        assert_eq!(
            u.uri_for(&incoming).unwrap().to_string(),
            "http://127.0.0.1:3000/v1/x?a=1"
        );
        let u = Upstream::parse("http://127.0.0.1:3000/api/").unwrap();
        assert_eq!(
            u.uri_for(&incoming).unwrap().to_string(),
            "http://127.0.0.1:3000/api/v1/x?a=1"
        );
        let absolute: Uri = "http://elsewhere.test/v1/y".parse().unwrap();
        assert_eq!(
            u.uri_for(&absolute).unwrap().to_string(),
            "http://127.0.0.1:3000/api/v1/y"
        );
    }
}
