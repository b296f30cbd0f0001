//! The front of the proxy: what every client request goes through before the
//! idempotency layer, in this order. Its `Host` is held to RFC 9112 §3.2 and its path
//! normalised (SPEC S14), once, so that the layer, the routes and the proxy all see the
//! one normal target; the client's address and, for an upgrade, the connection's place
//! under the cap go into its extensions; a CORS preflighted origin is noted, for the
//! gateway's own answers; an HTTP/2 answer the layer buffered is charged to its
//! connection's budget (see [`crate::budget`]); the request gets its id (taken from the
//! client or made), and is written in the access log once its answer has been sent
//! (see [`super::access`]). The answers the front makes itself are written once, in the
//! request's dialect: a gRPC error to a gRPC call, else the gateway's profile.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use idem_tower::{Observer, Outcome, Problem, ProblemKind, Profile};
use tower::ServiceExt;

use super::ClientBody;
use super::access::{self, Entry};
use super::reload::Generation;
use crate::budget::AnswerBudget;
use crate::cors;
use crate::listener::ConnectionSlot;
use crate::metrics::Metrics;
use crate::path::{self, PathNormalization};
use crate::proxy::ClientAddr;
use crate::telemetry::{self, Telemetry};
use arc_swap::ArcSwap;

/// The front of the proxy, around the service behind it (the layer and the proxy).
#[derive(Clone)]
pub(super) struct Front {
    /// The configuration in force (its path normalisation, request ids and access
    /// log, certificate tenant, and the service behind): read once per request, so
    /// that a reload applies to the requests that start after it.
    pub(super) live: Arc<ArcSwap<Generation>>,
    pub(super) metrics: Arc<Metrics>,
    /// Traces, when an OTLP endpoint is set: a server span around each request.
    pub(super) telemetry: Option<Telemetry>,
}

impl Front {
    /// Answers one request that came on a connection from `peer`, which holds `slot`
    /// and, for HTTP/2, `budget`.
    pub(super) fn call(
        &self,
        peer: SocketAddr,
        slot: &ConnectionSlot,
        budget: &AnswerBudget,
        mut req: Request<Incoming>,
    ) -> impl Future<Output = Result<Response<ClientBody>, Infallible>> + Send + use<> {
        let live = self.live.load();
        join_cookies(&mut req);
        let invalid = check_host(&mut req)
            .and_then(|()| normalize_target(&mut req, live.paths))
            .err();
        if invalid.is_some() {
            self.metrics.outcome(Outcome::Rejected);
        }
        req.extensions_mut().insert(ClientAddr(peer));
        if let Some(choice) = live.cert_tenant
            && let Some(principal) = slot.client_names().and_then(|n| choice.principal(n))
        {
            req.extensions_mut().insert(principal);
        }
        let access = &live.access;
        let removed = access.trusted_proxies.strip_untrusted(
            peer,
            req.headers_mut(),
            &access.trusted_headers,
        );
        if removed > 0 {
            tracing::debug!(%peer, removed, "removed trusted headers a peer that is no trusted proxy sent");
        }
        let id_header = &access.request_id_header;
        let request_id = access::request_id(req.headers_mut(), id_header);
        let entry = Entry::start(access, &mut req, peer, request_id.clone());
        let id_header = id_header.clone();
        // A connection that becomes a WebSocket tunnel keeps its place under the cap
        // while the tunnel is open.
        if req.headers().contains_key(http::header::UPGRADE) {
            req.extensions_mut().insert(slot.clone());
        }
        let svc = live.service.clone();
        let profile = live.profile;
        let document = live.document.clone().filter(|d| d.answers(&req));
        let exposed = live.exposed.clone();
        // Without the layer (pass-through mode), the front answers the proxy's failures
        // to forward, and counts them; the layer answers and counts its own.
        let counts_failures = live.layer.is_none().then(|| self.metrics.clone());
        drop(live);
        let guard = self.metrics.in_flight_guard();
        let origin = cors::preflighted_origin(req.method(), req.headers());
        let grpc = idem_tower::is_grpc(req.headers());
        // HTTP/1.1 sends one answer at a time: only HTTP/2 holds several.
        let budget = (req.version() == http::Version::HTTP_2).then(|| budget.clone());
        let keyed = req.headers().contains_key("idempotency-key");
        let traced = self
            .telemetry
            .as_ref()
            .map(|t| t.server_context(&req, invalid.is_some(), &request_id));
        telemetry::instrument(traced, async move {
            // A keyed request may be answered from the store: it waits for room for
            // an answer first.
            let reservation = match &budget {
                Some(budget) if keyed && invalid.is_none() => {
                    let reservation = budget.admit().await;
                    req.extensions_mut().insert(reservation.clone());
                    Some(reservation)
                }
                _ => None,
            };
            let res = match invalid {
                None if let Some(document) = &document => document.response(req.method()),
                None => match svc.oneshot(req).await {
                    Ok(res) => res,
                    Err(failed) => {
                        if let (Some(metrics), Some(failure)) =
                            (&counts_failures, failed.upstream_failure())
                        {
                            metrics.upstream_failed(failure);
                        }
                        in_dialect(&failed.problem(), grpc, profile)
                    }
                },
                Some(problem) => {
                    // Read away what the client still sends, so that it reads the 400
                    // rather than a reset.
                    let (parts, body) = req.into_parts();
                    idem_tower::drain_body(&parts.headers, body);
                    in_dialect(&problem, grpc, profile)
                }
            };
            let mut res = match budget {
                Some(budget) => budget
                    .hold(res, reservation)
                    .unwrap_or_else(|refused| in_dialect(&refused, grpc, profile)),
                None => res,
            };
            if let Some(origin) = origin {
                cors::allow_origin_on_problem(&mut res, origin);
            }
            cors::expose(res.headers_mut(), &exposed);
            if !grpc {
                res = access::into_problem(res, &request_id).await;
            }
            log_key(&res, &request_id);
            res.headers_mut().insert(id_header, request_id);
            let res = match entry {
                Some(entry) => entry.finish(res),
                None => res,
            };
            drop(guard);
            Ok(res)
        })
    }
}

/// The gateway's own answer `problem`, outside the layer (an invalid path or host, a
/// refusal of the connection's answer budget, without the layer a failure to forward):
/// to a gRPC call (`grpc`) a gRPC error (SPEC S18), to any other request in the
/// gateway's `profile`, as the layer writes its own.
fn in_dialect(problem: &Problem, grpc: bool, profile: Profile) -> Response<ClientBody> {
    let answer = if grpc {
        problem.to_grpc_response()
    } else {
        problem.to_response_in(profile)
    };
    answer.map(|b| Full::new(b).map_err(|never| match never {}).boxed_unsync())
}

/// At debug level, the line that leads from a client's key to its other lines: the
/// key, the scope's digest (the access log's `scope`, what `idem keys show` and `idem keys list`
/// print as `scope`) and the request id, once the layer has answered a keyed request.
/// The only line that carries a key, so that `info` logs never do; the tenant is its
/// stored form, never the credential.
fn log_key<B>(res: &Response<B>, request_id: &http::HeaderValue) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let Some(handled) = res.extensions().get::<idem_tower::Handled>() else {
        return;
    };
    let Some(scope) = &handled.scope else {
        return;
    };
    // Written as the access log writes it (a string), so that one search finds both.
    let digest = scope.digest();
    tracing::debug!(
        key = scope.key().as_str(),
        tenant = scope.tenant().as_str(),
        endpoint = scope.endpoint().map(idem_core::Endpoint::as_str),
        scope = digest.as_str(),
        outcome = handled.outcome.as_str(),
        attempt = handled.attempt,
        status = res.status().as_u16(),
        request_id = request_id.to_str().unwrap_or_default(),
        "keyed request"
    );
}

/// Joins the `Cookie` fields an HTTP/2 client may split a cookie list into (RFC 9113
/// §8.2.3) into one, with `; `, as HTTP/1.1, to which the request is forwarded, must
/// carry it.
fn join_cookies<B>(req: &mut Request<B>) {
    if req.version() != http::Version::HTTP_2 {
        return;
    }
    let mut cookies = req.headers().get_all(http::header::COOKIE).iter();
    let (Some(first), Some(_)) = (cookies.next(), cookies.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for more in req.headers().get_all(http::header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(more.as_bytes());
    }
    if let Ok(value) = http::HeaderValue::from_bytes(&joined) {
        req.headers_mut().insert(http::header::COOKIE, value);
    }
}

/// Holds the request to RFC 9112 §3.2 before any rule sees it: an HTTP/1.1 request
/// without `Host`, one with several, or one whose `Host` names no host is the 400
/// `invalid-host` problem to answer with. An absolute-form target's authority takes
/// the place of `Host` (§3.2.2), so the host the upstream is told of in `Forwarded`
/// and `X-Forwarded-Host` is the one the client's target named.
fn check_host<B>(req: &mut Request<B>) -> Result<(), Problem> {
    let invalid = |why: &str| {
        Problem::new(
            ProblemKind::InvalidHost,
            format!("{why} (RFC 9112 section 3.2); nothing was reserved or forwarded"),
        )
    };
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(invalid("the request has more than one Host header"));
    }
    // A host with user information (`user@host`) is no `Host` (RFC 9110 §7.2), and
    // tells the upstream of a host the request is not for.
    if let Some(authority) = req.uri().authority() {
        if authority.as_str().contains('@') {
            return Err(invalid("the target's authority holds user information"));
        }
        let authority = http::HeaderValue::from_str(authority.as_str())
            .map_err(|_| invalid("the target's authority is no Host value"))?;
        req.headers_mut().insert(http::header::HOST, authority);
        return Ok(());
    }
    match host {
        Some(value) => match http::uri::Authority::try_from(value.as_bytes()) {
            Ok(authority) if !authority.host().is_empty() && !authority.as_str().contains('@') => {
                Ok(())
            }
            _ => Err(invalid("the Host header names no host")),
        },
        None if req.version() == http::Version::HTTP_11 => {
            Err(invalid("an HTTP/1.1 request must send a Host header"))
        }
        None => Ok(()),
    }
}

/// Puts the request's normalised target (see [`path::normalize_uri`]) in place of its
/// own, or says why its path cannot be normalised, as the 400 `invalid-path` problem
/// to answer with. An `OPTIONS *` request names no path and passes as it came; any
/// other target that is not a path (`*`, a `CONNECT` authority) is invalid.
fn normalize_target<B>(req: &mut Request<B>, options: PathNormalization) -> Result<(), Problem> {
    if options.is_none() || (req.method() == http::Method::OPTIONS && req.uri() == "*") {
        return Ok(());
    }
    match path::normalize_uri(req.uri(), options) {
        Ok(None) => Ok(()),
        Ok(Some(normal)) => {
            *req.uri_mut() = normal;
            Ok(())
        }
        Err(e) => Err(Problem::new(
            ProblemKind::InvalidPath,
            format!(
                "the request path cannot be normalised: {e}; nothing was reserved or forwarded"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http2_cookie_fields_are_joined_for_http11() {
        let mut req = Request::builder()
            .version(http::Version::HTTP_2)
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .header("cookie", "c=3")
            .body(())
            .unwrap();
        join_cookies(&mut req);
        let cookies: Vec<_> = req.headers().get_all("cookie").iter().collect();
        assert_eq!(cookies, ["a=1; b=2; c=3"]);
        // HTTP/1.1 sends one field already; two are left as they came.
        let mut req = Request::builder()
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .body(())
            .unwrap();
        join_cookies(&mut req);
        assert_eq!(req.headers().get_all("cookie").iter().count(), 2);
    }
}
