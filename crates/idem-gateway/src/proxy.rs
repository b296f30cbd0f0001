//! The proxy [`Service`]: forwards a request to the upstream and its answer back.
//!
//! It is the inner service of `idem_tower::IdempotencyLayer`, which decides whether a
//! request runs at all, reads the answers it records and decides what each answer
//! means for the key; the proxy only forwards, and translates between the upstream's
//! headers and the layer's extensions:
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
//! - an `Idempotency-Disposition: record|release` response header becomes the layer's
//!   [`Disposition`] extension, which overrides the default record-or-release decision,
//!   and is stripped;
//! - an `Idempotency-Resource: /path` response header on a keyed answer becomes the
//!   layer's [`ResourceReference`] extension: an answer the layer records is recorded as
//!   that reference (its body streams through unread, at any size), and replays render
//!   it again with a `GET` of that path; it is stripped too;
//! - a keyed answer carries [`Proxied`], with the upstream timeout's deadline: an answer
//!   the layer records is read whole by then, so an upstream that stalls mid-body is a
//!   timeout too, and one that breaks off mid-body a lost connection;
//! - what goes wrong is classified by the side it came from and returned as the
//!   proxy's error, an `idem-tower` [`ForwardError`], which the layer (or, without
//!   one, the front) answers once, in the request's dialect, and counts: a refused
//!   connection is a 502 that releases the key; a timeout or broken connection after
//!   sending is a 504 that keeps the record in progress until its lease lapses; a
//!   request body that breaks off on the client's side (a malformed chunk, an upload
//!   abandoned halfway) is the client's fault: a 400 `body-unreadable` (if the client
//!   is still there to read it), not an upstream failure.
//!
//! A WebSocket upgrade on an unkeyed request is offered to the upstream with its
//! `Upgrade` header; if the upstream answers `101 Switching Protocols`, the client gets
//! that answer and the two connections are joined into a byte tunnel until either side
//! closes it. Keyed requests are never upgraded: their answer is recorded, and a switch
//! of protocols cannot be. Other upgrades (`h2c`, TLS) are stripped like any hop-by-hop
//! header: their tunnel would carry HTTP requests past the idempotency layer.
//!
//! Every answer streams through the proxy unread; the layer reads those it records.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use idem_tower::{
    Disposition, ForwardError, IdempotencyContext, Proxied, ResourceReference, UpstreamFailure,
};
use tokio::time::Instant;
use tower::Service;

use crate::config::{Upstream, UpstreamProtocol};
use crate::forwarded::add_forwarded;
use crate::metrics::Metrics;

mod client;
mod headers;
mod preface;
mod upgrade;

use client::UpstreamClient;
pub(crate) use client::tls_failure;
pub(crate) use headers::{REWRITE_HEADERS, strip_hop_by_hop, strip_look_alikes};
use upgrade::{requested_upgrade, switch_protocols, upgrades_to_websocket};

/// Boxed error of bodies flowing through the gateway (the layer's own).
pub(crate) type BoxError = idem_tower::BoxError;

/// The body of requests sent upstream and answers sent back.
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The request header that tells the upstream which attempt this is.
pub(crate) const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("idempotency-attempt");

/// The response header by which the upstream overrides record-or-release.
pub(crate) const DISPOSITION_HEADER: HeaderName =
    HeaderName::from_static("idempotency-disposition");

/// The response header by which the upstream asks for its answer to be recorded as a
/// reference to a resource (`/v1/reports/42`) and rendered again from it at replay
/// (SPEC S6), instead of recorded whole.
pub(crate) const RESOURCE_HEADER: HeaderName = HeaderName::from_static("idempotency-resource");

/// The client's address, put in request extensions by the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientAddr(pub SocketAddr);
/// Forwards requests to one upstream. Cheap to clone: clones share the connection pool.
#[derive(Clone, Debug)]
pub(crate) struct Proxy {
    // One Arc: the service is cloned for every request.
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: UpstreamClient,
    upstream: Upstream,
    timeout: Duration,
    metrics: Arc<Metrics>,
    host: Option<HeaderValue>,
}

/// What the response phase of one forward needs to know of its request.
struct Sending {
    /// The client's HTTP version, which its answer goes back in.
    client_version: Version,
    /// Whether the layer keyed the request (its answer may be recorded).
    keyed: bool,
    /// The protocol the client asked to switch to, and its side of the connection.
    upgrade: Option<(HeaderValue, hyper::upgrade::OnUpgrade)>,
    /// The client connection's place under the cap, kept by a tunnel.
    slot: Option<crate::listener::ConnectionSlot>,
    /// Where the access log takes the upstream's time from.
    upstream_time: Option<crate::access::UpstreamTime>,
    /// Set when the client's body failed, so that the failure is the client's.
    client_failed: Option<Arc<AtomicBool>>,
}

impl Proxy {
    /// A proxy to `upstream` in `protocol`, over TLS with the client settings `tls`
    /// (needed for an `https://` upstream: see [`tls_client_config`](crate::tls_client::tls_client_config)), whose answers
    /// must have come whole within `timeout`.
    pub(crate) fn speaking(
        upstream: Upstream,
        protocol: UpstreamProtocol,
        tls: Option<&rustls::ClientConfig>,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Proxy {
        let client = UpstreamClient::new(protocol, tls, timeout.min(Duration::from_secs(5)));
        let host = HeaderValue::from_str(upstream.authority.as_str()).ok();
        Proxy {
            inner: Arc::new(Inner {
                client,
                upstream,
                timeout,
                metrics,
                host,
            }),
        }
    }

    /// Forwards one request and returns the answer to send back, or why there is none.
    pub(crate) async fn forward<B>(
        &self,
        req: Request<B>,
    ) -> Result<Response<ProxyBody>, ForwardError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (mut up, sending) = self.request_phase(req)?;
        let sent = Instant::now();
        let deadline = sent + self.inner.timeout;
        let upstream_call = crate::telemetry::UpstreamCall::start(&mut up);
        let res = self
            .call_upstream(up, deadline, sending.client_failed.as_deref())
            .await?;
        upstream_call.answered(res.status());
        if let Some(timer) = &sending.upstream_time {
            timer.answered(sent.elapsed());
        }
        self.response_phase(res, sending, deadline)
    }

    /// The request phase: the upstream's request made from the client's (its URI, its
    /// headers cleaned of hop-by-hop and look-alike fields, `Forwarded`, the attempt),
    /// and what the response phase needs to know of it.
    fn request_phase<B>(
        &self,
        req: Request<B>,
    ) -> Result<(Request<ProxyBody>, Sending), ForwardError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let this = &*self.inner;
        let (mut parts, body) = req.into_parts();
        // Going upstream, the request waits on the upstream, not on its connection's
        // budget for buffered answers: its answer is charged once it is ready.
        if let Some(reservation) = parts.extensions.remove::<crate::budget::Reservation>() {
            reservation.release();
        }
        // Keyed requests carry the layer's context, with the attempt.
        let attempt = parts
            .extensions
            .remove::<IdempotencyContext>()
            .map(|c| c.attempt);
        let keyed = attempt.is_some();
        // The incoming URI already parsed, so only a base path could break it.
        let uri = this
            .upstream
            .uri_for(&parts.uri)
            .map_err(|_| ForwardError::Upstream(UpstreamFailure::Unreachable))?;
        let client = parts.extensions.get::<ClientAddr>().map(|c| c.0.ip());
        let mut headers = parts.headers;
        let original_host = headers.get(header::HOST).cloned();
        // Taken before the hop-by-hop headers go, and offered again to the upstream.
        let upgrade = match (keyed, requested_upgrade(&headers)) {
            (false, Some(protocol)) => parts
                .extensions
                .remove::<hyper::upgrade::OnUpgrade>()
                .map(|client_side| (protocol, client_side)),
            _ => None,
        };
        // `TE: trailers` says the client takes trailers, which the gateway passes on;
        // gRPC servers refuse a call without it (SPEC S18).
        let te_trailers = headers
            .get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
        strip_hop_by_hop(&mut headers);
        if te_trailers {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
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
        let sending = Sending {
            // The answer goes back in the client's HTTP version, not the upstream's: an
            // HTTP/1.0 upstream must not turn an HTTP/1.1 client's answer into
            // HTTP/1.0, which ends its keep-alive connection.
            client_version: parts.version,
            keyed,
            upgrade,
            slot: parts.extensions.remove::<crate::listener::ConnectionSlot>(),
            upstream_time: parts.extensions.remove::<crate::access::UpstreamTime>(),
            client_failed,
        };
        Ok((up, sending))
    }

    /// The response phase: the upstream's answer as the client gets it (in the
    /// client's HTTP version, without hop-by-hop headers, its disposition and resource
    /// reference taken out of the headers for the layer), or the tunnel a WebSocket
    /// upgrade opens.
    fn response_phase(
        &self,
        res: Response<hyper::body::Incoming>,
        sending: Sending,
        deadline: Instant,
    ) -> Result<Response<ProxyBody>, ForwardError> {
        let Sending {
            client_version,
            keyed,
            upgrade,
            slot,
            ..
        } = sending;
        if res.status() == StatusCode::SWITCHING_PROTOCOLS {
            return match upgrade {
                // To WebSocket, as asked (RFC 6455 §4.1 has the answer name it too).
                Some((_, client_side)) if upgrades_to_websocket(res.headers()) => {
                    // The tunnel keeps the client connection's place under the cap.
                    let open = (self.inner.metrics.tunnel_guard(), slot);
                    Ok(switch_protocols(res, client_side, client_version, open))
                }
                // Nothing was asked to switch, or not to this: the upstream's answer is
                // not one the client can read.
                _ => {
                    tracing::warn!(
                        "the upstream switched protocols where the request did not ask it to"
                    );
                    Err(ForwardError::Upstream(UpstreamFailure::ConnectionLost))
                }
            };
        }
        let (mut parts, body) = res.into_parts();
        parts.version = client_version;
        strip_hop_by_hop(&mut parts.headers);
        let disposition = take_disposition(&mut parts.headers);
        let reference = take_reference(&mut parts.headers);
        let mut res = Response::from_parts(parts, body.map_err(Into::into).boxed_unsync());
        if let Some(d) = disposition {
            res.extensions_mut().insert(d);
        }
        // Whether the answer is recorded, and so read whole, is the layer's to decide.
        if keyed {
            if let Some(r) = reference {
                res.extensions_mut().insert(r);
            }
            res.extensions_mut()
                .insert(Proxied::by(deadline.into_std()));
        }
        Ok(res)
    }

    /// The upstream call: sends `up`, and waits until `deadline` for the head of the
    /// answer. What goes wrong is classified by the side it came from: the client's
    /// body when `client_failed` says so, else the upstream.
    async fn call_upstream(
        &self,
        up: Request<ProxyBody>,
        deadline: Instant,
        client_failed: Option<&AtomicBool>,
    ) -> Result<Response<hyper::body::Incoming>, ForwardError> {
        let sent = tokio::time::timeout_at(deadline, self.inner.client.request(up)).await;
        match sent {
            Err(_) => Err(ForwardError::Upstream(UpstreamFailure::Timeout)),
            // An upstream that answered the HTTP/2 preface with something else never
            // read the request: nothing ran, as when it cannot be reached.
            Ok(Err(e)) if preface::never_spoke_http2(&e) => {
                tracing::warn!(error = %e, "the upstream does not speak HTTP/2 (--upstream-protocol http2)");
                Err(ForwardError::Upstream(UpstreamFailure::Unreachable))
            }
            Ok(Err(e)) if e.is_connect() => match tls_failure(&e) {
                Some(reason) => {
                    tracing::warn!(error = %reason, "TLS with the upstream failed");
                    Err(ForwardError::UpstreamTls(reason))
                }
                None => {
                    tracing::warn!(error = %e, "upstream unreachable");
                    Err(ForwardError::Upstream(UpstreamFailure::Unreachable))
                }
            },
            // The client attaches a connection's info to every error met once the
            // request was handed to that connection; one without it failed while the
            // connection was still being opened (its handshake, or its first
            // readiness): no connection carried the request, so nothing ran.
            Ok(Err(e)) if e.connect_info().is_none() => {
                tracing::warn!(error = %e, "the upstream connection failed before the request was sent");
                Err(ForwardError::Upstream(UpstreamFailure::Unreachable))
            }
            Ok(Err(e)) if client_failed.is_some_and(|f| f.load(Ordering::Relaxed)) => {
                tracing::debug!(error = %e, "the client's request body broke off");
                Err(ForwardError::ClientBody)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "upstream connection broke after the request was sent");
                Err(ForwardError::Upstream(UpstreamFailure::ConnectionLost))
            }
            Ok(Ok(res)) => Ok(res),
        }
    }
}

impl<B> Service<Request<B>> for Proxy
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = ForwardError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ForwardError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ForwardError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.forward(req).await })
    }
}

/// Removes the upstream's `Idempotency-Resource` header and returns the reference it
/// names; `None` (with a warning) unless it is one absolute path, with an optional
/// query, on the upstream.
pub(crate) fn take_reference(headers: &mut HeaderMap) -> Option<ResourceReference> {
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
pub(crate) fn take_disposition(headers: &mut HeaderMap) -> Option<Disposition> {
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
mod tests;
