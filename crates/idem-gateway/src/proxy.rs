//! The proxy [`Service`]: forwards a request to the upstream and its answer back.
//!
//! It is the inner service of `idem_tower::IdempotencyLayer`, which decides whether a
//! request runs at all; the proxy only forwards, and tells the layer what the upstream's
//! answer means for the key:
//!
//! - hop-by-hop headers (RFC 9110 §7.6.1) are stripped both ways; `X-Forwarded-For`,
//!   `X-Forwarded-Host`, `X-Forwarded-Proto` and `Forwarded` are set, the client's own
//!   `Forwarded` and `X-Forwarded-For` kept before the gateway's hop only when they
//!   parse ([`crate::forwarded`]);
//! - `X-Original-URL` and `X-Rewrite-URL` from the client are dropped
//!   ([`REWRITE_HEADERS`]): some upstream stacks (IIS, older Symfony and Zend) route by
//!   them in place of the request line, which would name another resource than the
//!   normalised path the rules and the scope saw;
//! - a client's header named as one the gateway sets is, but with `_` for `-`
//!   (`X_Forwarded_For`, `Idempotency_Attempt`), is dropped ([`strip_look_alikes`]):
//!   CGI and WSGI servers read it as the header the gateway vouches for;
//! - on keyed requests `Idempotency-Attempt: N` tells the upstream which attempt this is
//!   (N > 1 after a takeover: it should consult its business records first), and the
//!   `Idempotency-Key` header passes through as the client sent it;
//! - an `Idempotency-Disposition: record|release` response header overrides the default
//!   record-or-release decision and is stripped;
//! - an `Idempotency-Resource: /path` response header on an answer to be recorded has it
//!   recorded as that reference (its body streams through unread, at any size), and
//!   replays render it again with a `GET` of that path; it is stripped too;
//! - a refused connection is a 502 that releases the key; a timeout or broken connection
//!   after sending is a 504 that keeps the record in progress until its lease lapses; a
//!   keyed answer over `--response-limit` is a 502 that is recorded in its place;
//! - a request body that breaks off on the client's side (a malformed chunk, an upload
//!   abandoned halfway) is the client's fault: a 400 `body-unreadable` (if the client is
//!   still there to read it), not an upstream failure.
//!
//! A WebSocket upgrade on an unkeyed request is offered to the upstream with its
//! `Upgrade` header; if the upstream answers `101 Switching Protocols`, the client gets
//! that answer and the two connections are joined into a byte tunnel until either side
//! closes it. Keyed requests are never upgraded: their answer is recorded, and a switch
//! of protocols cannot be. Other upgrades (`h2c`, TLS) are stripped like any hop-by-hop
//! header: their tunnel would carry HTTP requests past the idempotency layer.
//!
//! Unkeyed traffic streams both ways. Keyed answers to be recorded are read whole within
//! the upstream timeout (the layer records them anyway), so an upstream that stalls
//! mid-body is a timeout too. Keyed answers to be released (a release status, or the
//! disposition header) are not recorded, so they stream like unkeyed ones, whatever
//! their size.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_tower::{Disposition, IdempotencyContext, Problem, ProblemKind, ResourceReference};
use tokio::time::Instant;
use tower::Service;

use crate::config::Upstream;
use crate::error::UpstreamError;
use crate::metrics::Metrics;

/// Boxed error of bodies flowing through the gateway.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of requests sent upstream and answers sent back.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The request header that tells the upstream which attempt this is.
pub const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("idempotency-attempt");

/// The response header by which the upstream overrides record-or-release.
pub const DISPOSITION_HEADER: HeaderName = HeaderName::from_static("idempotency-disposition");

/// The response header by which the upstream asks for its answer to be recorded as a
/// reference to a resource (`/v1/reports/42`) and rendered again from it at replay
/// (SPEC S6), instead of recorded whole.
pub const RESOURCE_HEADER: HeaderName = HeaderName::from_static("idempotency-resource");

/// The client's address, put in request extensions by the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// Headers that concern one connection, never forwarded (RFC 9110 §7.6.1, plus the
/// non-standard `proxy-connection` and `keep-alive` that old clients send).
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Request headers by which some upstream stacks take the path from the header rather
/// than the request line (IIS's URL rewriting, Symfony and Zend before they stopped).
/// A client's would route the request past the path the gateway normalised, matched
/// its rules on and scoped its key by, so they are never forwarded.
pub const REWRITE_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
];

/// The request headers the gateway sets itself, whose look-alikes with `_` for `-` a
/// client may not send (see [`strip_look_alikes`]).
const SET_BY_THE_GATEWAY: [&str; 5] = [
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "idempotency-attempt",
    "host",
];

/// Removes the client's headers that are named as one the gateway sets is, but with
/// `_` for `-` (`X_Forwarded_For`, `Idempotency_Attempt`): CGI and WSGI servers, and
/// nginx with `underscores_in_headers`, read them as the header itself, so a client
/// could pass for another address, or make a first attempt look recovered. Other
/// names with `_` pass; names are lower case in a `HeaderMap`.
pub fn strip_look_alikes(headers: &mut HeaderMap) {
    let folded = |name: &HeaderName| name.as_str().replace('_', "-");
    let look_alikes: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().contains('_'))
        .filter(|name| SET_BY_THE_GATEWAY.contains(&folded(name).as_str()))
        .cloned()
        .collect();
    for name in &look_alikes {
        tracing::debug!(header = %name, "dropped a look-alike of a header the gateway sets");
        headers.remove(name);
    }
}

/// Forwards requests to one upstream. Cheap to clone: clones share the connection pool.
#[derive(Clone, Debug)]
pub struct Proxy {
    // One Arc: the service is cloned for every request.
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client<HttpConnector, ProxyBody>,
    upstream: Upstream,
    timeout: Duration,
    response_limit: usize,
    metrics: Arc<Metrics>,
    host: Option<HeaderValue>,
}

impl Proxy {
    /// A proxy to `upstream` that gives up after `timeout` and reads keyed answers up to
    /// `response_limit` bytes, except answers the layer will release (as the request's
    /// [`IdempotencyContext`] says), which stream through unread.
    pub fn new(
        upstream: Upstream,
        timeout: Duration,
        response_limit: usize,
        metrics: Arc<Metrics>,
    ) -> Proxy {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(crate::listener::KEEPALIVE_IDLE));
        // A connect that cannot finish is "unreachable" (nothing sent), not a timeout
        // with an unknown outcome.
        connector.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build(connector);
        let host = HeaderValue::from_str(upstream.authority.as_str()).ok();
        Proxy {
            inner: Arc::new(Inner {
                client,
                upstream,
                timeout,
                response_limit,
                metrics,
                host,
            }),
        }
    }

    /// Forwards one request and returns the answer to send back.
    pub async fn forward<B>(&self, req: Request<B>) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let this = &*self.inner;
        let (mut parts, body) = req.into_parts();
        // The answer goes back in the client's HTTP version, not the upstream's: an
        // HTTP/1.0 upstream must not turn an HTTP/1.1 client's answer into HTTP/1.0,
        // which ends its keep-alive connection.
        let client_version = parts.version;
        // Keyed requests carry the layer's context: the attempt, and which answers the
        // layer will release.
        let context = parts.extensions.remove::<IdempotencyContext>();
        let attempt = context.as_ref().map(|c| c.attempt);
        // For the gateway's own answers, should the upstream give none: the listener
        // found the request's origin allowed.
        let origin = parts
            .extensions
            .remove::<crate::cors::PreflightedOrigin>()
            .map(|o| o.0);
        let fail = |e: UpstreamError| self.fail(e, origin.clone());
        let uri = match this.upstream.uri_for(&parts.uri) {
            Ok(uri) => uri,
            // The incoming URI already parsed, so only a base path could break it.
            Err(_) => return fail(UpstreamError::Unreachable),
        };
        let client = parts.extensions.get::<ClientAddr>().map(|c| c.0.ip());
        let mut headers = parts.headers;
        let original_host = headers.get(header::HOST).cloned();
        // Taken before the hop-by-hop headers go, and offered again to the upstream.
        let upgrade = match (&context, requested_upgrade(&headers)) {
            (None, Some(protocol)) => parts
                .extensions
                .remove::<hyper::upgrade::OnUpgrade>()
                .map(|client_side| (protocol, client_side)),
            _ => None,
        };
        let slot = parts.extensions.remove::<crate::listener::ConnectionSlot>();
        strip_hop_by_hop(&mut headers);
        for name in &REWRITE_HEADERS {
            headers.remove(name);
        }
        strip_look_alikes(&mut headers);
        if let Some((protocol, _)) = &upgrade {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol.clone());
        }
        add_forwarded(&mut headers, client, original_host.as_ref());
        headers.remove(ATTEMPT_HEADER);
        if let Some(n) = attempt {
            headers.insert(ATTEMPT_HEADER, HeaderValue::from(n));
        }
        if let Some(host) = &this.host {
            headers.insert(header::HOST, host.clone());
        }

        // A request body that fails (a chunk size that is no number, a client that went
        // away mid-upload) fails the upstream call too; noted, so that it is answered as
        // the client's fault rather than as an upstream failure.
        let client_failed = (!body.is_end_stream()).then(|| Arc::new(AtomicBool::new(false)));
        let body = match &client_failed {
            Some(failed) => {
                let failed = failed.clone();
                body.map_err(move |e| {
                    failed.store(true, Ordering::Relaxed);
                    e.into()
                })
                .boxed_unsync()
            }
            None => body.map_err(Into::into).boxed_unsync(),
        };
        let mut up = Request::new(body);
        *up.method_mut() = parts.method;
        *up.uri_mut() = uri;
        *up.version_mut() = Version::HTTP_11;
        *up.headers_mut() = headers;

        let deadline = Instant::now() + this.timeout;
        let res = match tokio::time::timeout_at(deadline, this.client.request(up)).await {
            Err(_) => return fail(UpstreamError::Timeout),
            Ok(Err(e)) if e.is_connect() => {
                tracing::warn!(error = %e, "upstream unreachable");
                return fail(UpstreamError::Unreachable);
            }
            Ok(Err(e))
                if client_failed
                    .as_ref()
                    .is_some_and(|f| f.load(Ordering::Relaxed)) =>
            {
                tracing::debug!(error = %e, "the client's request body broke off");
                return client_body_unreadable(origin);
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "upstream connection broke after the request was sent");
                return fail(UpstreamError::Broken);
            }
            Ok(Ok(res)) => res,
        };
        if res.status() == StatusCode::SWITCHING_PROTOCOLS {
            return match upgrade {
                // To WebSocket, as asked (RFC 6455 §4.1 has the answer name it too).
                Some((_, client_side)) if upgrades_to_websocket(res.headers()) => {
                    // The tunnel keeps the client connection's place under the cap.
                    let open = (this.metrics.tunnel_guard(), slot);
                    switch_protocols(res, client_side, client_version, open)
                }
                // Nothing was asked to switch, or not to this: the upstream's answer is
                // not one the client can read.
                _ => {
                    tracing::warn!(
                        "the upstream switched protocols where the request did not ask it to"
                    );
                    fail(UpstreamError::Broken)
                }
            };
        }
        let (mut parts, body) = res.into_parts();
        parts.version = client_version;
        strip_hop_by_hop(&mut parts.headers);
        let disposition = take_disposition(&mut parts.headers);
        let reference = take_reference(&mut parts.headers);
        // What the layer will release is not recorded, so it streams through like
        // unkeyed traffic, whatever its size. The context says which statuses the layer
        // releases on this request's route.
        let recorded = context.as_ref().is_some_and(|c| match disposition {
            Some(d) => !matches!(d, Disposition::Release),
            None => !c.releases(parts.status),
        });
        // An answer recorded as a reference is not read either: only its head is kept.
        let reference = reference.filter(|_| recorded);
        let body = if recorded && reference.is_none() {
            let limited = http_body_util::Limited::new(body, this.response_limit);
            match tokio::time::timeout_at(deadline, limited.collect()).await {
                Err(_) => return fail(UpstreamError::Timeout),
                Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                    tracing::error!(
                        limit = this.response_limit,
                        "the upstream's answer is over the response limit; recording a 502 in its place"
                    );
                    return fail(UpstreamError::TooLarge);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "upstream body broke off");
                    return fail(UpstreamError::Broken);
                }
                Ok(Ok(collected)) => Full::new(collected.to_bytes())
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            }
        } else {
            body.map_err(Into::into).boxed_unsync()
        };
        let mut res = Response::from_parts(parts, body);
        if let Some(d) = disposition {
            res.extensions_mut().insert(d);
        }
        if let Some(r) = reference {
            res.extensions_mut().insert(r);
        }
        res
    }

    /// The answer to an upstream failure; readable by `origin` (see [`crate::cors`]).
    fn fail(&self, e: UpstreamError, origin: Option<HeaderValue>) -> Response<ProxyBody> {
        self.inner.metrics.count_upstream_error(e.kind());
        let mut res = e.into_response();
        if let Some(origin) = origin {
            crate::cors::allow_origin(res.headers_mut(), origin);
        }
        res
    }
}

impl<B> Service<Request<B>> for Proxy
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(req).await) })
    }
}

/// The answer to a request whose body broke off on the client's side: a 400
/// `body-unreadable`, the client's fault, not an upstream failure (no retry with the
/// same key is asked for, no upstream error counted). Readable by `origin`.
fn client_body_unreadable(origin: Option<HeaderValue>) -> Response<ProxyBody> {
    let problem = Problem::new(
        ProblemKind::BodyUnreadable,
        "the request body could not be read: it broke off or was malformed",
    );
    let mut res = problem
        .to_response()
        .map(|b| Full::new(b).map_err(|never| match never {}).boxed_unsync());
    if let Some(origin) = origin {
        crate::cors::allow_origin(res.headers_mut(), origin);
    }
    res
}

/// The protocol an HTTP/1.1 request asks to switch to, when it is WebSocket: its
/// `Upgrade` header, when its `Connection` header names `upgrade`.
///
/// Only WebSocket: a tunnel is opaque to the gateway, and a protocol that carries HTTP
/// requests of its own (`h2c`, or TLS by RFC 2817) would let a client send them to the
/// upstream past the idempotency layer. WebSocket messages are not HTTP requests.
fn requested_upgrade(headers: &HeaderMap) -> Option<HeaderValue> {
    let asked = connection_options(headers).any(|token| token.eq_ignore_ascii_case("upgrade"));
    (asked && upgrades_to_websocket(headers)).then(|| headers[header::UPGRADE].clone())
}

/// Whether `headers` (a request's, or a `101`'s) name WebSocket in `Upgrade`, the only
/// upgrade the gateway offers and accepts.
fn upgrades_to_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("websocket"))
}

/// The comma-separated options of the `Connection` header fields, trimmed.
fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// The upstream's `101 Switching Protocols`, passed on to the client with its `Upgrade`
/// header, while a task of its own joins the two connections once both have switched,
/// and copies bytes both ways until either side closes; counted open (`open`) until
/// then.
fn switch_protocols(
    mut res: Response<hyper::body::Incoming>,
    client_side: hyper::upgrade::OnUpgrade,
    client_version: Version,
    open: impl Send + 'static,
) -> Response<ProxyBody> {
    let upstream_side = hyper::upgrade::on(&mut res);
    let (mut parts, _) = res.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(protocol) = protocol {
        parts.headers.insert(header::UPGRADE, protocol);
    }
    parts.version = client_version;
    tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(client_side, upstream_side) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(error = %e, "a connection upgrade did not complete");
                return;
            }
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut upstream = hyper_util::rt::TokioIo::new(upstream);
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((sent, received)) => {
                tracing::debug!(sent, received, "an upgraded connection closed");
            }
            Err(e) => tracing::debug!(error = %e, "an upgraded connection broke off"),
        }
        drop(open);
    });
    Response::from_parts(parts, ProxyBody::default())
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
///
/// Twice per forwarded request, and most messages carry none of them: one pass over
/// the names present (comparing standard names is comparing tags) finds what to
/// remove, rather than a hashed removal for each of the nine names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut present: Vec<HeaderName> = headers
        .keys()
        .filter(|name| HOP_BY_HOP.contains(name))
        .cloned()
        .collect();
    if present.contains(&header::CONNECTION) {
        present.extend(
            connection_options(headers)
                .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok()),
        );
    }
    for name in &present {
        headers.remove(name);
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Appends the client to `X-Forwarded-For` and `Forwarded` and records the original
/// host and protocol.
///
/// What the client sent in either is kept (several fields joined with `", "`, as one
/// list) only if it parses ([`crate::forwarded`]); otherwise it is dropped, with a
/// debug log line, and the upstream gets the gateway's hop alone: appended to a broken
/// value, the gateway's element could end up inside the client's open quote.
///
/// On every forwarded request, so built without a `format!` or a header-name parse:
/// each value is written once into a buffer sized for it.
pub fn add_forwarded(headers: &mut HeaderMap, client: Option<IpAddr>, host: Option<&HeaderValue>) {
    use std::fmt::Write as _;
    // Each value starts with room for what is appended to it (an IPv6 address, the
    // host with every character escaped), so it is allocated once.
    let host_len = host.map_or(0, HeaderValue::len);
    let prior = |headers: &HeaderMap, name: &HeaderName, valid: fn(&str) -> bool, room: usize| {
        let fields = headers.get_all(name);
        let mut value =
            String::with_capacity(fields.iter().map(|v| v.len() + 2).sum::<usize>() + room);
        let mut visible = true;
        for field in fields {
            match field.to_str() {
                Ok(text) => {
                    if !value.is_empty() {
                        value.push_str(", ");
                    }
                    value.push_str(text);
                }
                Err(_) => visible = false,
            }
        }
        if value.trim().is_empty() && visible {
            value.clear();
        } else if visible && valid(&value) {
            value.push_str(", ");
        } else {
            tracing::debug!(
                header = %name,
                "dropped the client's value, which does not parse, before adding this hop"
            );
            value.clear();
        }
        value
    };
    let mut forwarded = prior(
        headers,
        &header::FORWARDED,
        crate::forwarded::is_valid,
        64 + 2 * host_len,
    );
    if let Some(ip) = client {
        let mut xff = prior(
            headers,
            &X_FORWARDED_FOR,
            crate::forwarded::x_forwarded_for_is_valid,
            48,
        );
        match ip {
            IpAddr::V4(v4) => {
                push_ipv4(&mut xff, v4);
                forwarded.push_str("for=");
                push_ipv4(&mut forwarded, v4);
                forwarded.push(';');
            }
            IpAddr::V6(v6) => {
                write!(xff, "{v6}").expect("writing to a String");
                write!(forwarded, "for=\"[{v6}]\";").expect("writing to a String");
            }
        }
        if let Ok(v) = HeaderValue::try_from(xff) {
            headers.insert(X_FORWARDED_FOR, v);
        }
    }
    forwarded.push_str("proto=http");
    if let Some(h) = host.and_then(|h| h.to_str().ok()) {
        forwarded.push_str(";host=\"");
        for c in h.chars() {
            if matches!(c, '\\' | '"') {
                forwarded.push('\\');
            }
            forwarded.push(c);
        }
        forwarded.push('"');
        headers.insert(X_FORWARDED_HOST, host.cloned().expect("checked"));
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    if let Ok(v) = HeaderValue::try_from(forwarded) {
        headers.insert(header::FORWARDED, v);
    }
}

/// Writes `ip` in dotted-decimal, as its `Display` does: that goes through the
/// formatting machinery octet by octet, which on pass-through traffic cost as much as
/// the rest of the forwarding headers together.
fn push_ipv4(out: &mut String, ip: Ipv4Addr) {
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

/// Removes the upstream's `Idempotency-Resource` header and returns the reference it
/// names; `None` (with a warning) unless it is one absolute path, with an optional
/// query, on the upstream.
pub fn take_reference(headers: &mut HeaderMap) -> Option<ResourceReference> {
    let values: Vec<HeaderValue> = match headers.entry(RESOURCE_HEADER) {
        header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
        header::Entry::Vacant(_) => return None,
    };
    let reference = match values.as_slice() {
        [value] => value.to_str().ok().and_then(ResourceReference::new),
        _ => None,
    };
    if reference.is_none() {
        tracing::warn!(
            "upstream sent an Idempotency-Resource that is not one path such as /v1/reports/42; \
             recording the answer whole"
        );
    }
    reference
}

/// Reads and removes the upstream's `Idempotency-Disposition`. Unknown values are
/// dropped (and logged): the default S6 policy then applies.
pub fn take_disposition(headers: &mut HeaderMap) -> Option<Disposition> {
    let values: Vec<HeaderValue> = match headers.entry(DISPOSITION_HEADER) {
        header::Entry::Occupied(e) => e.remove_entry_mult().1.collect(),
        header::Entry::Vacant(_) => return None,
    };
    let [value] = values.as_slice() else {
        tracing::warn!(
            count = values.len(),
            "upstream sent several Idempotency-Disposition headers; ignoring them"
        );
        return None;
    };
    match value
        .to_str()
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Ok("record") => Some(Disposition::Record),
        Ok("release") => Some(Disposition::Release),
        _ => {
            tracing::warn!("upstream sent an unknown Idempotency-Disposition; ignoring it");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_connection_named_ones_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret-Hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic x"),
        );
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        strip_hop_by_hop(&mut h);
        // The order of fields with different names carries no meaning (RFC 9110 §5.3).
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn look_alikes_of_the_gateways_headers_are_dropped() {
        let mut h = HeaderMap::new();
        for name in [
            "x_forwarded_for",
            "x-forwarded_host",
            "X_Forwarded_Proto",
            "idempotency_attempt",
            "x_request_id",
            "x-forwarded-for",
        ] {
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        strip_look_alikes(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["x-forwarded-for", "x_request_id"]);
    }

    #[test]
    fn forwarded_headers_append_to_prior_hops() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
        h.insert(
            header::FORWARDED,
            HeaderValue::from_static("for=203.0.113.9"),
        );
        let host = HeaderValue::from_static("api.example:8080");
        add_forwarded(&mut h, Some("127.0.0.1".parse().unwrap()), Some(&host));
        assert_eq!(h["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
        assert_eq!(
            h[header::FORWARDED],
            "for=203.0.113.9, for=127.0.0.1;proto=http;host=\"api.example:8080\""
        );
        assert_eq!(h["x-forwarded-host"], "api.example:8080");
        assert_eq!(h["x-forwarded-proto"], "http");

        let mut h = HeaderMap::new();
        add_forwarded(&mut h, Some("::1".parse().unwrap()), None);
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h[header::FORWARDED], "for=\"[::1]\";proto=http");

        // A quoted-string escapes its quote and backslash; no client, no `for=`.
        let mut h = HeaderMap::new();
        let host = HeaderValue::from_static(r#"a"b\c"#);
        add_forwarded(&mut h, None, Some(&host));
        assert_eq!(h[header::FORWARDED], r#"proto=http;host="a\"b\\c""#);
        assert!(h.get("x-forwarded-for").is_none());
    }

    /// A client value that does not parse is dropped, so the gateway's element cannot
    /// end up inside the client's quoted-string; several fields are one list.
    #[test]
    fn broken_client_forwarded_values_are_dropped_and_fields_joined() {
        let client = Some("127.0.0.1".parse().unwrap());
        let ours = "for=127.0.0.1;proto=http";
        let cases: [(&[&str], &str); 6] = [
            (&[r#"for="6.6.6.6"#], ours),
            (&[r#"for="6.6.6.6\"#], ours),
            (&["for=a;for=b"], ours),
            (&["for=1.2.3.4", r#"for="5"#], ours),
            (
                &["for=1.2.3.4", "for=5.6.7.8"],
                "for=1.2.3.4, for=5.6.7.8, for=127.0.0.1;proto=http",
            ),
            (
                &[r#"for="a,b";by=c"#],
                r#"for="a,b";by=c, for=127.0.0.1;proto=http"#,
            ),
        ];
        for (fields, want) in cases {
            let mut h = HeaderMap::new();
            for f in fields {
                h.append(header::FORWARDED, HeaderValue::from_str(f).unwrap());
            }
            add_forwarded(&mut h, client, None);
            let got: Vec<_> = h.get_all(header::FORWARDED).iter().collect();
            assert_eq!(got, [want], "{fields:?}");
        }
        // Not visible ASCII: not a value the gateway can vouch for either.
        let mut h = HeaderMap::new();
        h.insert(
            header::FORWARDED,
            HeaderValue::from_bytes(b"for=\"\xff\"").unwrap(),
        );
        add_forwarded(&mut h, client, None);
        assert_eq!(h[header::FORWARDED], ours);
    }

    #[test]
    fn garbage_in_x_forwarded_for_is_dropped_and_fields_joined() {
        let client = Some("127.0.0.1".parse().unwrap());
        let cases: [(&[&str], &str); 5] = [
            (&["203.0.113.7"], "203.0.113.7, 127.0.0.1"),
            (
                &["203.0.113.7", "10.0.0.1"],
                "203.0.113.7, 10.0.0.1, 127.0.0.1",
            ),
            (&["203.0.113.7, evil"], "127.0.0.1"),
            (&["203.0.113.7", "\"x"], "127.0.0.1"),
            (&[" "], "127.0.0.1"),
        ];
        for (fields, want) in cases {
            let mut h = HeaderMap::new();
            for f in fields {
                h.append("x-forwarded-for", HeaderValue::from_str(f).unwrap());
            }
            add_forwarded(&mut h, client, None);
            let got: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
            assert_eq!(got, [want], "{fields:?}");
        }
    }

    #[test]
    fn ipv4_is_written_as_display_writes_it() {
        for octet in 0..=255u8 {
            for ip in [
                Ipv4Addr::new(octet, 0, 100, 9),
                Ipv4Addr::new(10, octet, 255, 1),
                Ipv4Addr::new(192, 168, octet, 99),
                Ipv4Addr::new(0, 255, 10, octet),
            ] {
                let mut out = String::from("x");
                push_ipv4(&mut out, ip);
                assert_eq!(out, format!("x{ip}"));
            }
        }
    }

    #[test]
    fn resource_header_is_read_and_stripped_and_must_be_one_path() {
        let cases: [(&[&str], Option<&str>); 6] = [
            (&["/v1/reports/42"], Some("/v1/reports/42")),
            (
                &["/v1/reports?id=42&f=csv"],
                Some("/v1/reports?id=42&f=csv"),
            ),
            (&["https://elsewhere.example/x"], None),
            (&["//elsewhere.example/x"], None),
            (&["reports/42"], None),
            (&["/a", "/b"], None),
        ];
        for (values, expected) in cases {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(RESOURCE_HEADER, HeaderValue::from_str(v).unwrap());
            }
            let got = take_reference(&mut h);
            assert_eq!(got.as_ref().map(|r| r.as_str()), expected, "{values:?}");
            assert!(h.is_empty(), "stripped: {values:?}");
        }
    }

    #[test]
    fn disposition_header_is_read_and_stripped() {
        let mut h = HeaderMap::new();
        h.insert(DISPOSITION_HEADER, HeaderValue::from_static("Release"));
        assert_eq!(take_disposition(&mut h), Some(Disposition::Release));
        assert!(h.get(DISPOSITION_HEADER).is_none());

        h.insert(DISPOSITION_HEADER, HeaderValue::from_static("record"));
        assert_eq!(take_disposition(&mut h), Some(Disposition::Record));

        h.insert(DISPOSITION_HEADER, HeaderValue::from_static("maybe"));
        assert_eq!(take_disposition(&mut h), None);
        assert!(
            h.get(DISPOSITION_HEADER).is_none(),
            "stripped even when unknown"
        );

        assert_eq!(take_disposition(&mut h), None);
    }

    async fn upstream(delay: Duration, extra: Option<(&'static str, &'static str)>) -> String {
        use axum::http::StatusCode;
        let app = axum::Router::new().fallback(move || async move {
            tokio::time::sleep(delay).await;
            let mut res = axum::response::IntoResponse::into_response((
                StatusCode::CREATED,
                [("connection", "keep-alive"), ("keep-alive", "timeout=5")],
                "made",
            ));
            if let Some((k, v)) = extra {
                res.headers_mut().insert(k, HeaderValue::from_static(v));
            }
            res
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn proxy(url: &str, timeout: Duration) -> Proxy {
        Proxy::new(
            Upstream::parse(url).unwrap(),
            timeout,
            idem_tower::DEFAULT_RESPONSE_LIMIT,
            Arc::new(Metrics::new()),
        )
    }

    fn request() -> Request<Full<Bytes>> {
        Request::post("/v1/x")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    }

    #[tokio::test]
    async fn answer_streams_back_without_hop_by_hop_headers() {
        let p = proxy(
            &upstream(Duration::ZERO, None).await,
            Duration::from_secs(5),
        );
        let res = p.forward(request()).await;
        assert_eq!(res.status(), 201);
        assert!(res.headers().get("keep-alive").is_none());
        assert!(res.extensions().get::<Disposition>().is_none());
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"made");
    }

    #[tokio::test]
    async fn disposition_header_becomes_the_extension() {
        let url = upstream(Duration::ZERO, Some(("idempotency-disposition", "release"))).await;
        let res = proxy(&url, Duration::from_secs(5)).forward(request()).await;
        assert_eq!(
            res.extensions().get::<Disposition>(),
            Some(&Disposition::Release)
        );
        assert!(res.headers().get(DISPOSITION_HEADER).is_none());
    }

    #[tokio::test]
    async fn refused_connection_is_502_release() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = proxy(&format!("http://127.0.0.1:{port}"), Duration::from_secs(5));
        let res = p.forward(request()).await;
        assert_eq!(res.status(), 502);
        assert_eq!(
            res.extensions().get::<Disposition>(),
            Some(&Disposition::Release)
        );
        assert!(
            p.inner
                .metrics
                .render()
                .contains("idem_upstream_errors_total{kind=\"unreachable\"} 1")
        );
    }

    #[tokio::test]
    async fn slow_upstream_is_504_keep_in_progress() {
        let url = upstream(Duration::from_secs(3), None).await;
        let res = proxy(&url, Duration::from_millis(200))
            .forward(request())
            .await;
        assert_eq!(res.status(), 504);
        assert_eq!(
            res.extensions().get::<Disposition>(),
            Some(&Disposition::KeepInProgress)
        );
    }
}
