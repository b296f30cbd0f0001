//! `--jwt-jwks-url`: a JWKS document fetched over HTTPS (plain HTTP only from a
//! loopback address), for the tenants named by verified bearer tokens
//! ([`idem_jwt::JwtVerifier`]).
//!
//! A fetch has 5 seconds, reads at most 1 MiB, wants a 200, and is tried three times
//! (after 250 ms, then 500 ms) before it fails. The verifier fetches the document at
//! start, again when a token names a key it lacks, and the gateway again every
//! `--jwt-jwks-refresh` (5 minutes by default), so a key the issuer withdrew stops
//! verifying. One fetch goes on at a time, and every request lacking a key waits for
//! that one, `--jwt-jwks-wait` at most; the next a token asks for starts no sooner than
//! a second after it ended ([`idem_jwt::RELOAD_INTERVAL`]). A fetch that fails keeps
//! the keys already held.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_jwt::JwksSource;

/// The largest JWKS document read.
const MAX_JWKS: usize = 1024 * 1024;
/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The default time between refreshes.
pub(crate) const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(300);

/// A JWKS document at a URL.
pub(crate) struct JwksUrl {
    url: Uri,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl JwksUrl {
    /// A source for `url`: `https://`, or `http://` to a loopback address (a key set
    /// fetched in the clear from elsewhere could be swapped on the way). TLS trusts
    /// the system's roots, or `ca`'s certificates when given.
    pub(crate) fn new(url: &str, ca: Option<&std::path::Path>) -> Result<JwksUrl, String> {
        let uri: Uri = url.parse().map_err(|e| format!("{url:?}: {e}"))?;
        let host = uri.host().ok_or_else(|| format!("{url:?} has no host"))?;
        match uri.scheme_str() {
            Some("https") => {}
            Some("http") => {
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let loopback = bare == "localhost"
                    || bare
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback());
                if !loopback {
                    return Err(format!(
                        "{url:?}: a JWKS is fetched over https:// (plain http:// only from a loopback address)"
                    ));
                }
            }
            _ => return Err(format!("{url:?} is not an http(s):// URL")),
        }
        let tls = crate::tls_client::tls_client_config(ca)?;
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_connect_timeout(Some(FETCH_TIMEOUT));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .build(https);
        Ok(JwksUrl { url: uri, client })
    }

    async fn fetch_once(&self) -> Result<Vec<u8>, String> {
        let req = Request::get(self.url.clone())
            .header(
                http::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let fetch = async {
            let res = self.client.request(req).await.map_err(|e| {
                let cause = std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                format!("{e}{cause}")
            })?;
            if res.status() != StatusCode::OK {
                return Err(format!("answered {}", res.status()));
            }
            let body = Limited::new(res.into_body(), MAX_JWKS)
                .collect()
                .await
                .map_err(|e| format!("reading the document: {e}"))?;
            Ok(body.to_bytes().to_vec())
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("no whole answer within {FETCH_TIMEOUT:?}"))?
    }
}

impl JwksSource for JwksUrl {
    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send + '_>> {
        Box::pin(async move {
            let mut wait = Duration::from_millis(250);
            let mut tries = 0;
            loop {
                tries += 1;
                match self.fetch_once().await {
                    Ok(bytes) => return Ok(bytes),
                    Err(e) if tries == 3 => return Err(format!("{e} (tried {tries} times)")),
                    Err(e) => {
                        tracing::debug!(url = %self.url, error = %e, "JWKS fetch failed; trying again");
                        tokio::time::sleep(wait).await;
                        wait *= 2;
                    }
                }
            }
        })
    }

    fn describe(&self) -> String {
        self.url.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_from_loopback() {
        assert!(JwksUrl::new("http://127.0.0.1:9/jwks", None).is_ok());
        assert!(JwksUrl::new("http://[::1]:9/jwks", None).is_ok());
        assert!(JwksUrl::new("http://localhost/jwks", None).is_ok());
        assert!(JwksUrl::new("https://issuer.example/jwks", None).is_ok());
        let e = JwksUrl::new("http://issuer.example/jwks", None)
            .err()
            .unwrap();
        assert!(e.contains("https://"), "{e}");
        assert!(JwksUrl::new("ftp://127.0.0.1/jwks", None).is_err());
        assert!(JwksUrl::new("/jwks", None).is_err());
    }

    #[tokio::test]
    async fn a_fetch_that_fails_says_why_after_three_tries() {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let source = JwksUrl::new(&format!("http://127.0.0.1:{port}/jwks"), None).unwrap();
        let e = source.load().await.unwrap_err();
        assert!(e.contains("tried 3 times"), "{e}");
    }
}
