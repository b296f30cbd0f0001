//! The access log and the request id: one line per request at `info` under the target
//! `idem::access`, written when the answer's body has been sent (or the client went
//! away), in the process's log format (text or JSON), with a stable set of fields:
//!
//! | field | what |
//! |---|---|
//! | `client` | the client's address: the connection's peer (with its port), or behind a proxy that `--trusted-proxies` names, the address it forwarded for (see [`crate::trusted`]) |
//! | `peer` | the connection's peer address, with its port |
//! | `method`, `path` | as normalised and forwarded (the path without its query) |
//! | `route` | the matched `[[route]]`'s template, when one matched |
//! | `status` | the answer's status |
//! | `outcome` | what the idempotency layer did (`executed`, `replayed`, `conflict`, `mismatch`, `expired`, `released`, `kept_in_progress`, `rejected`, `store_unavailable`, `reservation_late`, `replay_unavailable`, `passed_through`), as the metric `idem_requests_total` names it |
//! | `attempt` | the attempt that ran, when one did |
//! | `scope` | the record's scope digest (never the key or the credential) |
//! | `upstream_ms` | from sending the request upstream to its answer's head, when it went upstream |
//! | `duration_ms` | from the request's head to the answer's last byte |
//! | `bytes` | the answer's body bytes sent |
//! | `completed` | `false` when the client went away before the answer's end |
//! | `request_id` | the request id |
//!
//! The request id is the client's `X-Request-Id` (the header `--request-id-header`
//! names) when it sent one well-formed value (1 to 128 characters of letters, digits and
//! `-_.:+/=@`), else one the gateway makes (32 hex digits). It is sent upstream in that
//! header, returned to the client in it, written in the log line, added to the gateway's
//! own problem bodies as `request_id`, and set on the request's trace span.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use idem_tower::Handled;
use tokio::time::Instant;
use tower::BoxError;

use super::ClientBody;
use crate::access::{AccessLog, MAX_REQUEST_ID_LEN, UpstreamTime};

/// What the front needs for request ids and the access log.
#[derive(Clone)]
pub(super) struct AccessSettings {
    pub(super) log: AccessLog,
    pub(super) request_id_header: HeaderName,
    /// The routes, for the template a line names.
    pub(super) routes: Arc<[crate::route::Route]>,
    /// The proxies believed about the client's address.
    pub(super) trusted_proxies: crate::trusted::TrustedProxies,
    /// The headers only those proxies may set.
    pub(super) trusted_headers: Arc<[HeaderName]>,
}

/// Whether `value` may serve as a request id as the client sent it.
fn well_formed(value: &[u8]) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&value.len())
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:+/=@".contains(b))
}

/// The request's id: the client's one well-formed value of `header`, else a new one;
/// put in `headers` as the only value of `header`, so that the upstream gets it.
pub(super) fn request_id(headers: &mut HeaderMap, header: &HeaderName) -> HeaderValue {
    let mut values = headers.get_all(header).iter();
    let given = match (values.next(), values.next()) {
        (Some(one), None) if well_formed(one.as_bytes()) => Some(one.clone()),
        _ => None,
    };
    let id = given.unwrap_or_else(|| {
        let mut raw = [0u8; 16];
        // Without randomness the id is still unique enough to find a line by.
        if getrandom::fill(&mut raw).is_err() {
            raw = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
                .to_be_bytes();
        }
        // Written in place: on every request without an id of its own.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 32];
        for (pair, b) in text.chunks_exact_mut(2).zip(raw) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0xf)];
        }
        HeaderValue::from_bytes(&text).expect("hex is a header value")
    });
    headers.insert(header.clone(), id.clone());
    id
}

/// What one request's line says, gathered as the request goes.
pub(super) struct Entry {
    started: Instant,
    client: crate::trusted::Client,
    peer: std::net::SocketAddr,
    method: http::Method,
    path: String,
    route: Option<String>,
    request_id: HeaderValue,
    upstream: UpstreamTime,
}

impl Entry {
    /// An entry for the request whose head is `req`, if `settings` pick it; the timer
    /// the proxy notes its upstream time in goes into the request's extensions.
    pub(super) fn start<B>(
        settings: &AccessSettings,
        req: &mut http::Request<B>,
        peer: std::net::SocketAddr,
        request_id: HeaderValue,
    ) -> Option<Entry> {
        if !settings.log.pick() || !tracing::enabled!(target: "idem::access", tracing::Level::INFO)
        {
            return None;
        }
        let route = crate::route::find(&settings.routes, req.method(), req.uri().path())
            .map(|r| r.template.as_str().to_owned());
        let upstream = UpstreamTime::new();
        req.extensions_mut().insert(upstream.clone());
        let client = settings.trusted_proxies.client(peer, req.headers());
        Some(Entry {
            started: Instant::now(),
            client,
            peer,
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
            route,
            request_id,
            upstream,
        })
    }

    /// `res` with its body counted, the line written at its end.
    pub(super) fn finish(self, res: Response<ClientBody>) -> Response<ClientBody> {
        let (parts, body) = res.into_parts();
        let handled = parts.extensions.get::<Handled>().cloned();
        let outcome = handled.as_ref().map(|h| h.outcome.as_str()).unwrap_or(
            if parts.extensions.get::<idem_tower::ProblemKind>().is_some() {
                "rejected"
            } else {
                "passed_through"
            },
        );
        let line = Line {
            entry: self,
            status: parts.status.as_u16(),
            outcome,
            attempt: handled.as_ref().and_then(|h| h.attempt),
            scope: handled.and_then(|h| h.scope).map(|s| s.digest()),
        };
        let body = Counted {
            inner: body,
            bytes: 0,
            line: Some(line),
        };
        Response::from_parts(parts, body.boxed_unsync())
    }
}

struct Line {
    entry: Entry,
    status: u16,
    outcome: &'static str,
    attempt: Option<u32>,
    scope: Option<String>,
}

impl Line {
    fn write(self, bytes: u64, completed: bool) {
        let e = &self.entry;
        let round = |ms: f64| (ms * 1000.0).round() / 1000.0;
        let duration_ms = round(e.started.elapsed().as_secs_f64() * 1000.0);
        let request_id = e.request_id.to_str().unwrap_or_default();
        tracing::info!(
            target: "idem::access",
            client = %e.client,
            peer = %e.peer,
            method = %e.method,
            path = %e.path,
            route = e.route.as_deref(),
            status = self.status,
            outcome = self.outcome,
            attempt = self.attempt,
            scope = self.scope.as_deref(),
            upstream_ms = e.upstream.millis().map(round),
            duration_ms,
            bytes,
            completed,
            request_id,
            "request"
        );
    }
}

/// An answer's body, counted; writes the line once it ends or is dropped.
struct Counted {
    inner: ClientBody,
    bytes: u64,
    line: Option<Line>,
}

impl Counted {
    fn done(&mut self, completed: bool) {
        if let Some(line) = self.line.take() {
            line.write(self.bytes, completed);
        }
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                }
                if self.inner.is_end_stream() {
                    self.done(true);
                }
            }
            Poll::Ready(None) => self.done(true),
            Poll::Ready(Some(Err(_))) => self.done(false),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        // An answer with no body to poll (a 204, a HEAD) ends here too.
        let completed = self.inner.is_end_stream();
        self.done(completed);
    }
}

/// Adds `request_id` to a problem body the gateway made itself (not a recorded answer,
/// which replays as it was), as the member `request_id`.
pub(super) async fn into_problem(
    res: Response<ClientBody>,
    id: &HeaderValue,
) -> Response<ClientBody> {
    let is_problem = res.extensions().get::<idem_tower::ProblemKind>().is_some()
        && res
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"application/problem+json"));
    if !is_problem {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    // The gateway's own problems are a few hundred bytes, already in memory.
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Response::from_parts(parts, empty()),
    };
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut members)) => {
            members.insert(
                "request_id".into(),
                serde_json::Value::String(id.to_str().unwrap_or_default().to_owned()),
            );
            let text = serde_json::Value::Object(members).to_string();
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Bytes::from(text)
        }
        _ => bytes,
    };
    Response::from_parts(
        parts,
        http_body_util::Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync(),
    )
}

fn empty() -> ClientBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::DEFAULT_REQUEST_ID_HEADER;

    #[test]
    fn a_well_formed_client_id_is_kept_and_anything_else_replaced() {
        let name = HeaderName::from_static(DEFAULT_REQUEST_ID_HEADER);
        let mut headers = HeaderMap::new();
        headers.insert(&name, HeaderValue::from_static("req-7f3a:1"));
        assert_eq!(request_id(&mut headers, &name), "req-7f3a:1");
        for bad in [
            "",
            "has space",
            "quote\"d",
            &"x".repeat(MAX_REQUEST_ID_LEN + 1),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(&name, HeaderValue::from_str(bad).unwrap());
            let id = request_id(&mut headers, &name);
            assert_eq!(id.len(), 32, "{bad:?} replaced by a new id");
            assert_eq!(headers.get_all(&name).iter().collect::<Vec<_>>(), [&id]);
        }
        // Two values: neither is believed.
        let mut headers = HeaderMap::new();
        headers.append(&name, HeaderValue::from_static("a"));
        headers.append(&name, HeaderValue::from_static("b"));
        let id = request_id(&mut headers, &name);
        assert_ne!(id, "a");
        assert_eq!(headers.get_all(&name).iter().count(), 1);
        // None: a fresh one each time.
        let mut headers = HeaderMap::new();
        let first = request_id(&mut headers, &name);
        let mut headers = HeaderMap::new();
        assert_ne!(first, request_id(&mut headers, &name));
    }
}
