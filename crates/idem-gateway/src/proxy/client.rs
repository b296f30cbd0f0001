//! The client the proxy reaches the upstream with: one pool of connections, in the HTTP
//! `--upstream-protocol` names, over TLS for an `https://` upstream.
//!
//! - `http://` keeps the plain [`HttpConnector`] and nothing else in its way: HTTP/1.1,
//!   or with `http2` HTTP/2 with prior knowledge (h2c, RFC 9113 §3.3), since nothing on
//!   plain TCP negotiates it (`auto` is HTTP/1.1 there).
//! - `https://` puts rustls (the ring provider) on top of that connector: the server
//!   name sent (SNI) and checked in the certificate is the URL's host, the certificate
//!   must chain to `--upstream-ca`'s certificates or else to the system's roots (read
//!   by rustls-native-certs, which follows `SSL_CERT_FILE` and `SSL_CERT_DIR`), and
//!   ALPN offers nothing (`http1`: servers then speak HTTP/1.1), `h2` (`http2`) or
//!   both, `h2` first (`auto`).
//!   A handshake that fails is never retried in plaintext: the request is answered
//!   with a 502 naming the TLS failure ([`tls_failure`]).
//!
//! With `http2`, each new connection's first bytes must be the server's HTTP/2
//! preface ([`PrefaceCheck`]): an upstream that answers in HTTP/1.1 read no request,
//! and its failure is the 502 that releases the key, rather than a 504 of unknown
//! outcome.
//!
//! HTTP/2 connections are pooled like HTTP/1.1 ones: one per upstream, its streams
//! shared by the requests in flight.

use std::time::Duration;

use http::Request;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use rustls::ClientConfig;

use super::ProxyBody;
use super::preface::PrefaceCheck;
use crate::config::UpstreamProtocol;

/// A pooled client to the upstream: plain TCP, or TLS on top of it.
#[derive(Debug, Clone)]
pub(super) enum UpstreamClient {
    /// `http://`: the connector of old, untouched.
    Plain(Client<HttpConnector, ProxyBody>),
    /// `http://` with `http2`: prior knowledge, the server's preface checked.
    PlainHttp2(Client<PrefaceCheck<HttpConnector>, ProxyBody>),
    /// `https://`.
    Tls(Client<HttpsConnector<HttpConnector>, ProxyBody>),
    /// `https://` with `http2`, the server's preface checked.
    TlsHttp2(Client<PrefaceCheck<HttpsConnector<HttpConnector>>, ProxyBody>),
}

impl UpstreamClient {
    /// A client speaking `protocol`, over TLS with `tls` when given (an `https://`
    /// upstream), whose connects give up after `connect_timeout`.
    pub(super) fn new(
        protocol: UpstreamProtocol,
        tls: Option<&ClientConfig>,
        connect_timeout: Duration,
    ) -> UpstreamClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(crate::listener::KEEPALIVE_IDLE));
        // A connect that cannot finish is "unreachable" (nothing sent), not a timeout
        // with an unknown outcome.
        connector.set_connect_timeout(Some(connect_timeout));
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256);
        // `auto` over TLS lets ALPN choose per connection; `http2` speaks nothing else,
        // which on plain TCP is prior knowledge.
        if protocol == UpstreamProtocol::Http2 {
            builder.http2_only(true);
        }
        let http2 = protocol == UpstreamProtocol::Http2;
        let Some(tls) = tls else {
            return if http2 {
                UpstreamClient::PlainHttp2(builder.build(PrefaceCheck(connector)))
            } else {
                UpstreamClient::Plain(builder.build(connector))
            };
        };
        // The URL is https://, which the plain connector would refuse.
        connector.enforce_http(false);
        // The connector sets ALPN: `h2`, or `h2` and `http/1.1`; for HTTP/1.1 alone it
        // offers none, and servers then speak HTTP/1.1.
        let mut tls = tls.clone();
        tls.alpn_protocols.clear();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only();
        let connector = match protocol {
            UpstreamProtocol::Http1 => https.enable_http1().wrap_connector(connector),
            UpstreamProtocol::Http2 => https.enable_http2().wrap_connector(connector),
            UpstreamProtocol::Auto => https
                .enable_http1()
                .enable_http2()
                .wrap_connector(connector),
        };
        if http2 {
            UpstreamClient::TlsHttp2(builder.build(PrefaceCheck(connector)))
        } else {
            UpstreamClient::Tls(builder.build(connector))
        }
    }

    /// Sends `req` on a pooled connection, or a new one.
    pub(super) fn request(&self, req: Request<ProxyBody>) -> ResponseFuture {
        match self {
            UpstreamClient::Plain(client) => client.request(req),
            UpstreamClient::PlainHttp2(client) => client.request(req),
            UpstreamClient::Tls(client) => client.request(req),
            UpstreamClient::TlsHttp2(client) => client.request(req),
        }
    }
}

/// The TLS failure behind a failed connect, if that is what it was: rustls's reason
/// (`invalid peer certificate: UnknownIssuer`, a name mismatch, an expired
/// certificate, an alert from the server), for the problem's detail.
pub(crate) fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // An I/O error's `source` skips the error it wraps, which is where tokio-rustls
        // puts rustls's (and hyper-rustls wraps that I/O error in another).
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            next = Some(inner as &(dyn std::error::Error + 'static));
            continue;
        }
        next = e.source();
    }
    None
}
